"""`kparity compare` and `kparity accept` on synthetic stores: which runs are compared, planted
regressions exit 1, noise exits 0, the JSON validates against its schema, annotations accept."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

# The `test` extra has it; the GPU image does not, and `pytest -m gpu` collects this module too.
jsonschema = pytest.importorskip("jsonschema")

from results.compare import load_schema
from results.store import Store
from verbs.cli import main

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
CPU = {"torch": "cpu"}
H100 = {"cuda": "cuda:0 NVIDIA H100 80GB HBM3", "torch": "cuda:0 NVIDIA H100 80GB HBM3"}
IMPLS = ("torch:rms_norm", "torch:rms_norm_llama")
CASES = ("c0decode", "c1prefill", "c2hbm")


def run_id(i: int) -> str:
    return (T0 + timedelta(hours=i)).strftime("%Y%m%dT%H%M%SZ") + f"-{i:06x}"


def case_fields(rid: str, impl: str, case: str, devices: dict) -> dict:
    backend = impl.split(":")[0]
    return {"run_id": rid, "case_id": case, "impl": impl, "op": "rms_norm", "backend": backend,
            "device": devices[backend], "dtype": "bf16", "dims": "{}", "label": f"bench:{case}"}


def write_run(store: Store, i: int, verb: str, devices: dict = CPU) -> str:
    rid = run_id(i)
    store.write("runs", [{"run_id": rid, "started": T0 + timedelta(hours=i),
                          "command": f"kparity {verb}", "verb": verb,
                          "devices": json.dumps(devices, sort_keys=True)}], rid, 0)
    return rid


def write_check(store: Store, i: int, budgets: dict | None = None, status: dict | None = None,
                devices: dict = CPU, impls=IMPLS, cases=CASES) -> str:
    """A check run: every (impl, case) passes with budget 0.2 unless told otherwise."""
    rid = write_run(store, i, "check", devices)
    rows = []
    for impl in impls:
        for case in cases:
            b = (budgets or {}).get((impl, case), 0.2)
            rows.append({**case_fields(rid, impl, case, devices), "expect": "valid",
                         "status": (status or {}).get((impl, case), "pass"), "budget": b})
    store.write("correctness", rows, rid, 1)
    return rid


def write_bench(store: Store, i: int, *, seed: int, run_noise: float = 0.01,
                slower: dict | None = None, status: dict | None = None, devices: dict = CPU,
                impls=IMPLS, cases=CASES) -> str:
    """A bench run: 200 samples per (impl, case) around 10 µs * (1 + k/10), 1 % sample noise,
    the run's level off by `run_noise` (run-to-run noise); `slower` multiplies a key's level."""
    rid = write_run(store, i, "bench", devices)
    rng = np.random.default_rng(seed)
    rows = []
    for k, (impl, case) in enumerate((impl, case) for impl in impls for case in cases):
        level = 10_000 * (1 + k / 10) * (1 + run_noise * rng.standard_normal())
        level *= (slower or {}).get((impl, case), 1.0)
        samples = level * (1 + 0.01 * rng.standard_normal(200))
        q1, med, q3 = np.percentile(samples, [25, 50, 75])
        st = (status or {}).get((impl, case), "ok")
        rows.append({**case_fields(rid, impl, case, devices), "mode": "wall", "arm": "",
                     "status": st, "samples_ns": samples.tolist() if st == "ok" else [],
                     "median_ns": float(med) if st == "ok" else None, "q1_ns": float(q1),
                     "q3_ns": float(q3)})
    # An A/B in the same store is not a plain bench row and never compared.
    rows.append({**rows[0], "arm": "B", "ab_id": "ab1", "median_ns": 1.0, "samples_ns": [1.0]})
    store.write("bench", rows, rid, 1)
    return rid


def compare(tmp_path, capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["--store", str(tmp_path), "compare", *argv])
    return rc, capsys.readouterr().out


def compare_json(tmp_path, capsys, *argv) -> tuple[int, dict]:
    rc, out = compare(tmp_path, capsys, *argv, "--format", "json")
    report = json.loads(out)
    jsonschema.validate(report, load_schema())
    return rc, report


# --- pairs of runs -----------------------------------------------------------------------------

def test_planted_8pct_slowdown_exits_1(tmp_path, capsys):
    store = Store(tmp_path)
    a = write_bench(store, 0, seed=1)
    b = write_bench(store, 1, seed=2, slower={("torch:rms_norm", "c1prefill"): 1.08})
    rc, report = compare_json(tmp_path, capsys)
    assert rc == 1 and report["regression"] is True
    assert (report["mode"], report["run_a"], report["run_b"], report["tables"]) == \
        ("pair", a, b, ["bench"])
    verdicts = {(e["impl"], e["case_id"]): e["verdict"] for e in report["speed"]}
    assert len(verdicts) == len(IMPLS) * len(CASES)  # the A/B row is not compared
    assert verdicts.pop(("torch:rms_norm", "c1prefill")) == "SLOWER"
    assert set(verdicts.values()) == {"SAME"}
    slow = report["speed"][0]  # regressions first
    assert slow["regression"] and 1.05 < slow["ratio"] < 1.11
    assert slow["ci_lo"] < slow["ratio"] < slow["ci_hi"] and slow["ci_lo"] > 1
    assert report["summary"]["speed"]["slower"] == 1 and report["summary"]["regressions"] == 1
    rc, out = compare(tmp_path, capsys)
    assert rc == 1 and "SLOWER" in out
    assert "1 regressions, 0 improvements, 5 unchanged" in " ".join(out.split())


def test_pure_noise_exits_0(tmp_path, capsys):
    store = Store(tmp_path)
    write_bench(store, 0, seed=3)
    write_bench(store, 1, seed=4)
    write_check(store, 2)
    write_check(store, 3, budgets={(IMPLS[0], CASES[0]): 0.21})
    rc, report = compare_json(tmp_path, capsys)  # the newest: check against check
    assert rc == 0 and report["tables"] == ["correctness"] and report["correctness"] == []
    assert report["summary"]["correctness"]["unchanged"] == 6
    rc, report = compare_json(tmp_path, capsys, run_id(0), run_id(1))
    assert rc == 0 and report["summary"]["regressions"] == 0
    assert {e["verdict"] for e in report["speed"]} == {"SAME"}
    assert max(abs(e["ratio"] - 1) for e in report["speed"]) < 0.05


def test_new_failure_and_budget_jump_exit_1(tmp_path, capsys):
    store = Store(tmp_path)
    write_check(store, 0, budgets={(IMPLS[0], CASES[1]): 1e-9, (IMPLS[1], CASES[2]): 0.9})
    write_check(store, 1, status={(IMPLS[0], CASES[0]): "fail"},
                budgets={(IMPLS[0], CASES[0]): 2.5, (IMPLS[0], CASES[1]): 3e-9,
                         (IMPLS[1], CASES[1]): 0.45, (IMPLS[1], CASES[2]): 0.3})
    rc, report = compare_json(tmp_path, capsys)
    assert rc == 1
    changes = [(e["impl"], e["case_id"], e["change"], e["regression"])
               for e in report["correctness"]]
    # 1e-9 -> 3e-9 is a 3x "jump" under the 0.05 floor: unchanged; 0.2 -> 0.45 is 2.25x.
    assert changes == [(IMPLS[0], CASES[0], "new_failure", True),
                       (IMPLS[1], CASES[1], "budget_jump", True),
                       (IMPLS[1], CASES[2], "budget_drop", False)]
    assert report["summary"]["correctness"] == {
        "new_case_failure": 0, "new_failure": 1, "fixed": 0, "budget_jump": 1, "budget_drop": 1,
        "still_failing": 0, "unchanged": 3, "not_judged": 0, "new_cases": 0, "missing_cases": 0}
    assert (report["summary"]["regressions"], report["summary"]["improvements"]) == (2, 1)
    # With a looser jump ratio, the 2.25x budget is no regression (the 3x drop is still a
    # drop); the failure still is.
    rc, report = compare_json(tmp_path, capsys, "--budget-jump", "3")
    assert rc == 1 and [e["change"] for e in report["correctness"]] == \
        ["new_failure", "budget_drop"]
    # Filters: torch:rms_norm_llama only (by name), its jump alone.
    rc, report = compare_json(tmp_path, capsys, "--impl", "rms_norm_llama")
    assert rc == 1 and {e["impl"] for e in report["correctness"]} == {IMPLS[1]}


def test_fixed_case_and_new_cases_are_counted(tmp_path, capsys):
    store = Store(tmp_path)
    write_check(store, 0, status={(IMPLS[0], CASES[0]): "error", (IMPLS[0], CASES[1]): "fail"},
                cases=CASES[:2])
    write_check(store, 1, status={(IMPLS[0], CASES[1]): "fail"}, cases=CASES[1:])
    rc, report = compare_json(tmp_path, capsys)
    assert rc == 0
    assert [(e["case_id"], e["change"]) for e in report["correctness"]] == \
        [(CASES[1], "still_failing")]
    c = report["summary"]["correctness"]
    assert (c["new_cases"], c["missing_cases"], c["still_failing"], c["unchanged"]) == (2, 2, 1, 1)


def test_bench_row_that_stops_being_timed_is_a_regression(tmp_path, capsys):
    store = Store(tmp_path)
    write_bench(store, 0, seed=1)
    write_bench(store, 1, seed=2, status={(IMPLS[1], CASES[2]): "fail"})
    rc, report = compare_json(tmp_path, capsys)
    assert rc == 1 and report["speed"][0]["verdict"] == "FAILED"
    assert report["speed"][0]["status_b"] == "fail" and report["speed"][0]["ratio"] is None


def test_default_runs_are_the_newest_and_the_previous_of_its_table_and_device(tmp_path, capsys):
    store = Store(tmp_path)
    write_check(store, 0)
    write_bench(store, 1, seed=1)
    write_check(store, 2, devices=H100, impls=("torch:rms_norm",))
    write_check(store, 3)
    rc, report = compare_json(tmp_path, capsys)
    assert (report["run_a"], report["run_b"]) == (run_id(0), run_id(3))  # not bench, not H100
    assert report["same_device_kind"] and report["devices"]["b"] == CPU
    write_bench(store, 4, seed=2)
    rc, report = compare_json(tmp_path, capsys)
    assert (report["run_a"], report["run_b"], report["tables"]) == \
        (run_id(1), run_id(4), ["bench"])
    # One run given: it is A, and B the newest later run of its kind and table.
    rc, report = compare_json(tmp_path, capsys, run_id(0))
    assert (report["run_a"], report["run_b"]) == (run_id(0), run_id(3))
    # The H100 check has no earlier H100 run: exit 2, naming the runs present.
    rc, out = compare(tmp_path, capsys, run_id(2))
    assert rc == 2 and "no check run after" in out
    write_check(store, 5, devices=H100, impls=("torch:rms_norm",))
    rc, report = compare_json(tmp_path, capsys)
    assert (report["run_a"], report["run_b"]) == (run_id(2), run_id(5))


def test_no_earlier_run_of_the_device_exits_2_naming_the_runs(tmp_path, capsys):
    store = Store(tmp_path)
    write_check(store, 0)
    write_check(store, 1, devices=H100, impls=("torch:rms_norm",))
    rc, out = compare(tmp_path, capsys)
    text = " ".join(out.split())
    assert rc == 2 and f"the newest run (check {run_id(1)}) has no earlier check run" in text
    assert f"runs here: 1 check on {H100['torch']}, 1 check on cpu" in text


def test_a_bench_after_checks_compares_nothing_in_two_short_lines(tmp_path, capsys):
    """No-argument compare pairs the newest run with the previous one of its kind; a bench
    after checks has none: two lines counting the runs here, however many there are (it used
    to list every run: a line of over 1,000 characters)."""
    store = Store(tmp_path)
    for i in range(40):
        write_check(store, i)
    write_bench(store, 40, seed=1)
    rc, out = compare(tmp_path, capsys)
    lines = out.splitlines()
    assert rc == 2 and len(lines) == 2 and max(map(len, lines)) <= 120, out
    assert f"the newest run (bench {run_id(40)}) has no earlier bench run" in lines[0]
    assert "runs here: 1 bench, 40 check; name two: kparity compare RUN_A RUN_B" in lines[1]
    write_bench(store, 41, seed=2)  # two of a kind: compared, the checks left alone
    rc, report = compare_json(tmp_path, capsys)
    assert (report["run_a"], report["run_b"], report["tables"]) == \
        (run_id(40), run_id(41), ["bench"])


def test_unknown_run_or_filter_exits_2_closest_first(tmp_path, capsys):
    store = Store(tmp_path)
    write_check(store, 0)
    write_check(store, 1)
    typo = run_id(1)[:-1] + "x"
    rc, out = compare(tmp_path, capsys, run_id(0), typo)
    text = " ".join(out.split())
    assert rc == 2 and f"unknown run '{typo}'" in text
    assert text.index(run_id(1)) < text.index(run_id(0))  # closest first
    rc, out = compare(tmp_path, capsys, "--impl", "torch:rms_nrom")
    assert rc == 2 and "Valid impls (closest first): torch:rms_norm" in " ".join(out.split())
    rc, out = compare(tmp_path, capsys, "--baseline", "3", run_id(0), run_id(1))
    assert rc == 2 and "at most one run id" in out


def test_json_schema_is_strict(tmp_path, capsys):
    store = Store(tmp_path)
    write_check(store, 0)
    write_check(store, 1, status={(IMPLS[0], CASES[0]): "fail"})
    write_bench(store, 2, seed=1)
    write_bench(store, 3, seed=2, slower={(IMPLS[0], CASES[0]): 1.2})
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    rc, checks = compare_json(tmp_path, capsys, run_id(0), run_id(1))
    assert rc == 1 and checks["correctness"][0]["change"] == "new_failure"
    rc, report = compare_json(tmp_path, capsys)
    assert rc == 1 and report["speed"][0]["verdict"] == "SLOWER"
    report["correctness"] = checks["correctness"]
    jsonschema.validate(report, schema)
    broken = []
    for path in (("summary",), ("thresholds", "z"), ("speed", 0, "verdict"),
                 ("summary", "speed", "slower"), ("correctness", 0, "budget_b"), ("run_a",)):
        bad = copy.deepcopy(report)
        target = bad
        for step in path[:-1]:
            target = target[step]
        del target[path[-1]]
        broken.append(bad)
    bad = copy.deepcopy(report)
    bad["speed"][0]["verdict"] = "SLOWISH"
    broken.append(bad)
    bad = copy.deepcopy(report)
    bad["speed"][0]["surprise"] = 1
    broken.append(bad)
    for bad in broken:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_markdown_lists_the_regression_first(tmp_path, capsys):
    store = Store(tmp_path)
    write_bench(store, 0, seed=1)
    write_bench(store, 1, seed=2, slower={(IMPLS[0], CASES[2]): 1.08,
                                          (IMPLS[1], CASES[0]): 0.8})
    rc, out = compare(tmp_path, capsys, "--format", "markdown")
    assert rc == 1
    lines = out.splitlines()
    assert lines[0] == "### kparity compare: 1 regression"
    regression = next(ln for ln in lines if ln.startswith("| SLOWER |"))
    assert f"| {IMPLS[0]} | {CASES[2]} | bf16 | wall |" in regression
    improvement = next(ln for ln in lines if ln.startswith("| FASTER |"))
    assert lines.index("#### Regressions") < lines.index(regression) < \
        lines.index("#### Improvements") < lines.index(improvement) < lines.index("#### Counts")
    assert "**1 regressions, 1 improvements, 4 unchanged**" in out


# --- against history ---------------------------------------------------------------------------

def test_baseline_flags_a_slowdown_against_the_last_n_runs(tmp_path, capsys):
    store = Store(tmp_path)
    for i in range(12):
        write_bench(store, i, seed=10 + i)
    write_bench(store, 12, seed=30, slower={(IMPLS[1], CASES[1]): 1.08})
    rc, report = compare_json(tmp_path, capsys, "--baseline", "10")
    assert rc == 1 and report["mode"] == "baseline" and report["run_a"] is None
    assert report["baseline_runs"] == [run_id(i) for i in range(2, 12)]
    assert report["thresholds"]["min_history"] == 10
    slow = report["speed"][0]
    assert (slow["impl"], slow["case_id"], slow["verdict"]) == (IMPLS[1], CASES[1], "SLOWER")
    assert slow["z"] > 5 and slow["ci_lo"] is None
    assert {e["verdict"] for e in report["speed"][1:]} == {"SAME"}
    # The run before it, against its own history: nothing.
    rc, report = compare_json(tmp_path, capsys, run_id(11), "--baseline", "10")
    assert rc == 0 and report["run_b"] == run_id(11)
    # A history of 3 runs: min_history follows N.
    rc, report = compare_json(tmp_path, capsys, "--baseline", "3")
    assert report["thresholds"]["min_history"] == 3 and len(report["baseline_runs"]) == 3


def test_baseline_flags_a_budget_jump_and_a_new_failure(tmp_path, capsys):
    store = Store(tmp_path)
    for i in range(6):
        write_check(store, i, budgets={(IMPLS[0], CASES[0]): 0.12})
    write_check(store, 6, budgets={(IMPLS[0], CASES[0]): 0.31, (IMPLS[1], CASES[2]): 1.5},
                status={(IMPLS[1], CASES[2]): "fail"})
    rc, report = compare_json(tmp_path, capsys, "--baseline", "5")
    assert rc == 1
    assert [(e["impl"], e["case_id"], e["change"]) for e in report["correctness"]] == [
        (IMPLS[0], CASES[0], "budget_jump"), (IMPLS[1], CASES[2], "new_failure")]
    jump = report["correctness"][0]
    assert jump["budget_a"] == pytest.approx(0.12) and jump["z"] == pytest.approx(19)


# --- accept ------------------------------------------------------------------------------------

def test_accept_makes_a_regressing_compare_pass(tmp_path, capsys):
    store = Store(tmp_path)
    write_bench(store, 0, seed=1)
    write_bench(store, 1, seed=2, slower={(IMPLS[0], CASES[1]): 1.3})
    assert compare(tmp_path, capsys)[0] == 1

    capsys.readouterr()
    rc = main(["--store", str(tmp_path), "accept", IMPLS[0], "--reason", "new tiling"])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0 and f"accepted {IMPLS[0]} (every metric) from run {run_id(1)}" in out
    note = store.read("annotations").to_pylist()
    assert len(note) == 1 and note[0]["run_id"] == run_id(1) and note[0]["kind"] == "accept"
    assert note[0]["command"] == f"kparity accept {IMPLS[0]} --reason 'new tiling'"
    assert note[0]["created"] is not None and note[0]["host"]

    rc, report = compare_json(tmp_path, capsys)
    assert rc == 0 and report["summary"]["accepted"] == 1
    slow = next(e for e in report["speed"] if e["verdict"] == "SLOWER")
    assert slow["accepted_by"] == "new tiling" and slow["regression"] is False
    rc, out = compare(tmp_path, capsys, "--format", "markdown")
    assert rc == 0 and "#### Accepted" in out and "(accepted: new tiling)" in out
    # A later run is compared with the accepted run as its A: no regression either.
    write_bench(store, 2, seed=3, slower={(IMPLS[0], CASES[1]): 1.3})
    assert compare(tmp_path, capsys)[0] == 0


def test_accept_for_another_metric_or_an_older_run_does_not_accept(tmp_path, capsys):
    store = Store(tmp_path)
    write_bench(store, 0, seed=1)
    write_bench(store, 1, seed=2, slower={(IMPLS[0], CASES[1]): 1.3})
    for argv in (["--metric", "budget", "--run", run_id(1)], ["--run", run_id(0)]):
        capsys.readouterr()
        assert main(["--store", str(tmp_path), "accept", CASES[1], "--reason", "x", *argv]) == 0
    assert compare(tmp_path, capsys)[0] == 1
    capsys.readouterr()
    assert main(["--store", str(tmp_path), "accept", CASES[1], "--reason", "case",
                 "--metric", "median_ns"]) == 0
    assert compare(tmp_path, capsys)[0] == 0


def test_accept_rejects_unknown_targets_and_runs(tmp_path, capsys):
    store = Store(tmp_path)
    write_check(store, 0)
    capsys.readouterr()
    assert main(["--store", str(tmp_path), "accept", "torch:rms_nrom", "--reason", "x"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "unknown target 'torch:rms_nrom'" in out and "closest first: torch:rms_norm" in out
    assert main(["--store", str(tmp_path), "accept", IMPLS[0], "--reason", "x",
                 "--run", "nope"]) == 2
    assert "unknown run 'nope'" in capsys.readouterr().out
    # A bench-only metric for a target that has only correctness rows needs --run.
    assert main(["--store", str(tmp_path), "accept", IMPLS[0], "--reason", "x",
                 "--metric", "median_ns"]) == 2
    assert store.read("annotations").num_rows == 0


# --- verdicts that cannot mislead (issue 25) ---------------------------------------------------

MUTANT = "torch:mutant_rms"


def test_new_failing_cases_are_a_regression_listed_first(tmp_path, capsys):
    """A mutant's check against a clean check: its cases are new to the comparison, and a new
    case that fails is a failure to report, not just "new"."""
    store = Store(tmp_path)
    write_check(store, 0)
    write_check(store, 1, impls=IMPLS + (MUTANT,), budgets={(IMPLS[1], CASES[0]): 0.9},
                status={(MUTANT, CASES[0]): "fail", (MUTANT, CASES[2]): "error"})
    rc, report = compare_json(tmp_path, capsys)
    assert rc == 1 and report["regression"] is True
    first = [(e["impl"], e["case_id"], e["change"], e["status_a"], e["regression"])
             for e in report["correctness"]]
    assert first == [(MUTANT, CASES[0], "new_case_failure", None, True),
                     (MUTANT, CASES[2], "new_case_failure", None, True),
                     (IMPLS[1], CASES[0], "budget_jump", "pass", True)]
    c = report["summary"]["correctness"]
    assert (c["new_cases"], c["new_case_failure"], report["summary"]["regressions"]) == (3, 2, 3)
    rc, out = compare(tmp_path, capsys)
    text = " ".join(out.split())
    assert rc == 1 and "new case failing" in text and "correctness: 3 new (2 failing)" in text
    assert text.index("new case failing") < text.index("budget jump")
    rc, out = compare(tmp_path, capsys, "--format", "markdown")
    rows = [ln for ln in out.splitlines() if ln.startswith("| new case failing |")]
    assert rc == 1 and len(rows) == 2 and f"| {MUTANT} | {CASES[0]} |" in rows[0]
    assert out.index("#### Regressions") < out.index(rows[0]) < out.index("| budget jump |")
    # Expected to fail (a mutant): listed as accepted, only the budget jump regresses.
    rc, report = compare_json(tmp_path, capsys, "--new-may-fail")
    assert rc == 1 and report["summary"]["regressions"] == 1
    assert report["thresholds"]["new_may_fail"] is True
    new = [e for e in report["correctness"] if e["change"] == "new_case_failure"]
    assert len(new) == 2 and {e["accepted_by"] for e in new} == \
        {"new cases may fail (--new-may-fail)"} and not any(e["regression"] for e in new)
    rc, report = compare_json(tmp_path, capsys, "--new-may-fail", "--impl", MUTANT + "," + IMPLS[0])
    assert rc == 0 and report["summary"]["accepted"] == 2


def test_new_failing_cases_against_history_and_in_bench(tmp_path, capsys):
    store = Store(tmp_path)
    for i in range(3):
        write_check(store, i)
    write_check(store, 3, impls=IMPLS + (MUTANT,), status={(MUTANT, CASES[1]): "fail"})
    rc, report = compare_json(tmp_path, capsys, "--baseline", "3")
    assert rc == 1 and [(e["impl"], e["change"]) for e in report["correctness"]] == \
        [(MUTANT, "new_case_failure")]
    assert compare_json(tmp_path, capsys, "--baseline", "3", "--new-may-fail")[0] == 0
    # A bench case new in B that was not timed because the kernel is wrong: NEW_FAILED.
    write_bench(store, 4, seed=1)
    write_bench(store, 5, seed=2, impls=IMPLS + (MUTANT,), status={(MUTANT, CASES[0]): "fail"})
    rc, report = compare_json(tmp_path, capsys)
    assert rc == 1 and report["tables"] == ["bench"]
    assert [(e["impl"], e["case_id"], e["verdict"], e["status_a"], e["status_b"])
            for e in report["speed"] if e["regression"]] == \
        [(MUTANT, CASES[0], "NEW_FAILED", None, "fail")]
    assert report["summary"]["speed"]["new_failed"] == 1
    assert report["summary"]["speed"]["new_cases"] == 3
    assert compare_json(tmp_path, capsys, "--new-may-fail")[0] == 0


def test_an_annotation_never_accepts_a_correctness_failure(tmp_path, capsys):
    """Annotations written by an older kparity (or with --run at an older run) still match the
    failing series: compare does not let them accept a failure, only the budget change."""
    store = Store(tmp_path)
    write_check(store, 0)
    write_check(store, 1, status={(IMPLS[0], CASES[0]): "fail"},
                budgets={(IMPLS[0], CASES[0]): 3.0, (IMPLS[0], CASES[1]): 0.9})
    store.write("annotations", [{"run_id": run_id(1), "created": T0, "kind": "accept",
                                 "target": IMPLS[0], "metric": "", "reason": "slower now"}],
                "accept-x", 0)
    rc, report = compare_json(tmp_path, capsys)
    assert rc == 1
    got = {e["change"]: (e["regression"], e["accepted_by"]) for e in report["correctness"]}
    assert got == {"new_failure": (True, None), "budget_jump": (False, "slower now")}


def failing_store(tmp_path) -> Store:
    store = Store(tmp_path)
    write_bench(store, 0, seed=1)
    write_bench(store, 1, seed=2, slower={(IMPLS[0], CASES[1]): 1.3})
    write_check(store, 2, status={(IMPLS[0], CASES[0]): "fail", (IMPLS[0], CASES[2]): "crash"})
    return store


def test_accept_refuses_a_target_that_fails_correctness(tmp_path, capsys):
    store = failing_store(tmp_path)
    for target in (IMPLS[0], CASES[0]):
        for metric in ([], ["--metric", "budget"]):
            capsys.readouterr()
            rc = main(["--store", str(tmp_path), "accept", target, "--reason", "x", *metric])
            text = " ".join(capsys.readouterr().out.split())
            assert rc == 2, (target, metric, text)
            assert f"not accepted: {target} has" in text and f"newest sweep {run_id(2)}" in text
            assert f"{IMPLS[0]} {CASES[0]} (c0decode bf16): fail" in text
            assert "gpu_impls/known_issues.py" in text and "--metric median_ns" in text
    capsys.readouterr()
    main(["--store", str(tmp_path), "accept", IMPLS[0], "--reason", "x"])
    text = " ".join(capsys.readouterr().out.split())
    assert "has 2 failing correctness cases" in text and ("crash" in text or "1 more" in text)
    assert store.read("annotations").num_rows == 0
    # The other impl passes everything: accepted; and the speed alone of the failing one.
    assert main(["--store", str(tmp_path), "accept", IMPLS[1], "--reason", "ok"]) == 0
    assert main(["--store", str(tmp_path), "accept", IMPLS[0], "--reason", "tiling",
                 "--metric", "median_ns"]) == 0
    assert store.read("annotations").num_rows == 2
    assert compare(tmp_path, capsys, run_id(0), run_id(1))[0] == 0  # the speed change accepted


def test_too_little_history_is_not_judged_never_unchanged(tmp_path, capsys):
    store = Store(tmp_path)
    write_check(store, 0)
    write_check(store, 1)
    rc, report = compare_json(tmp_path, capsys, "--baseline", "10")
    s = report["summary"]
    assert rc == 0 and (s["unchanged"], s["not_judged"]) == (0, 6)
    assert s["correctness"]["not_judged"] == 6 and s["correctness"]["unchanged"] == 0
    assert s["not_judged_history"] == {"min_runs": 1, "max_runs": 1, "needed": 10}
    rc, out = compare(tmp_path, capsys, "--baseline", "10")
    text = " ".join(out.split())
    assert "0 unchanged, 6 not judged (1 of 10 runs)" in text and "6 unchanged" not in text
    rc, out = compare(tmp_path, capsys, "--baseline", "10", "--format", "markdown")
    assert "6 not judged (1 of 10 runs)" in out and "6 not judged, 0 new cases" in out
    # A status change needs no history: a new failure is still judged (and not counted twice).
    write_check(store, 2, status={(IMPLS[0], CASES[0]): "fail"})
    rc, report = compare_json(tmp_path, capsys, "--baseline", "10")
    assert rc == 1 and report["summary"]["not_judged"] == 5
    assert report["summary"]["not_judged_history"]["max_runs"] == 2
    # min_history follows N: --baseline 2 needs 2 earlier runs; run 1 has one, run 3 two.
    rc, report = compare_json(tmp_path, capsys, run_id(1), "--baseline", "2")
    assert rc == 0 and (report["summary"]["unchanged"], report["summary"]["not_judged"]) == \
        (0, 6)
    write_check(store, 3)
    rc, report = compare_json(tmp_path, capsys, run_id(3), "--baseline", "2", "--impl",
                              IMPLS[1])
    assert rc == 0 and (report["summary"]["unchanged"], report["summary"]["not_judged"]) == \
        (3, 0)


def test_speed_with_too_little_history_is_not_judged(tmp_path, capsys):
    store = Store(tmp_path)
    for i in range(3):
        write_bench(store, i, seed=i)
    rc, report = compare_json(tmp_path, capsys, "--baseline", "10")
    assert rc == 0 and {e["verdict"] for e in report["speed"]} == {"NOT_JUDGED"}
    assert {e["history_runs"] for e in report["speed"]} == {2}
    assert {e["direction"] for e in report["speed"]} == {"not_judged"}
    s = report["summary"]
    assert (s["unchanged"], s["ambiguous"], s["not_judged"], s["speed"]["not_judged"]) == \
        (0, 0, 6, 6)
    rc, out = compare(tmp_path, capsys, "--baseline", "10")
    text = " ".join(out.split())
    assert "NOT_JUDGED (2 of 10 runs)" in text and "6 not judged (2 of 10 runs)" in text


def write_repro(store: Store, i: int, impl: str, case: str, status: str = "fail") -> str:
    """A `kparity repro` run: one (impl, case) rerun."""
    rid = write_run(store, i, "repro")
    store.write("correctness", [{**case_fields(rid, impl, case, CPU), "expect": "valid",
                                 "status": status, "budget": 3.0}], rid, 1)
    return rid


def test_repro_runs_are_never_a_baseline_nor_the_default_contender(tmp_path, capsys):
    store = Store(tmp_path)
    write_check(store, 0)
    write_check(store, 1)
    write_repro(store, 2, IMPLS[0], CASES[0])
    rc, report = compare_json(tmp_path, capsys)  # the newest sweep, not the repro
    assert rc == 0 and (report["run_a"], report["run_b"]) == (run_id(0), run_id(1))
    write_check(store, 3)
    rc, report = compare_json(tmp_path, capsys)  # against the check before, not the repro
    assert rc == 0 and (report["run_a"], report["run_b"]) == (run_id(1), run_id(3))
    rc, report = compare_json(tmp_path, capsys, "--baseline", "5")
    assert report["baseline_runs"] == [run_id(0), run_id(1)]
    # Named, a repro run is compared.
    rc, report = compare_json(tmp_path, capsys, run_id(1), run_id(2))
    assert rc == 1 and report["correctness"][0]["change"] == "new_failure"
