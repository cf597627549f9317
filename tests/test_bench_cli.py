"""`kparity bench` / `ab` / `check` verdicts and conventions (issue 25): timing flags validated,
unconverged rows marked, JSON and JUnit outputs, `ab A B C`, bench presets, the CPU default and
why nothing ran. Each test runs one tiny case on torch CPU (or none at all)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pyarrow.dataset as ds
import pytest

from verbs.cli import main

CASE = ["--impl", "torch:rms_norm", "--preset", "decode-1x4096", "--dtype", "f32"]
QUICK = ["--min-time", "0.005", "--min-samples", "2", "--timeout", "0.2"]


def _rows(store, table):
    files = sorted(str(p) for p in (store / table).glob("date=*/*.parquet"))
    return ds.dataset(files, format="parquet").to_table().to_pylist() if files else []


def _flat(text: str) -> str:
    """Output with its line wrapping undone (rich wraps at the console width)."""
    return " ".join(text.split())


@pytest.fixture
def quick(monkeypatch):
    """Warm-up by count only (3 calls) and a fixed copy ceiling instead of timing a 128 MiB
    copy: the measurement path is the same, a test takes less time."""
    from gpu_impls.timer import Timer

    monkeypatch.setattr("runners.timing.WARMUP_S", 0.0)
    monkeypatch.setattr(Timer, "ceilings", lambda self: {"copy_bytes": 2 << 20, "copy_gbps": 10.0,
                                                         "gemm": "", "gemm_tflops": None})


# --- 1. every numeric timing flag in its range ----------------------------------------------------

@pytest.mark.parametrize("verb, flag, value, expect", [
    ("bench", "--max-noise", "-1", "in (0, 1]"),
    ("bench", "--max-noise", "nan", "in (0, 1]"),
    ("bench", "--max-noise", "5", "in (0, 1]"),
    ("bench", "--timeout", "0", "above 0"),
    ("bench", "--min-time", "-1", "at least 0"),
    ("bench", "--min-samples", "1", "at least 2"),
    ("bench", "--min-time", "0.5", "not below --timeout 0.2"),
    ("ab", "--timeout", "0", "above 0"),
])
def test_timing_flags_out_of_range_are_refused(tmp_path, capsys, verb, flag, value, expect):
    impls = ["torch:rms_norm", "torch:rms_norm"] if verb == "ab" else ["--impl", "torch:rms_norm"]
    rc = main(["--store", str(tmp_path), verb, *impls, "--preset", "decode-1x4096", "--dtype",
               "f32", *QUICK, flag, value])
    out = _flat(capsys.readouterr().out)
    assert rc == 2, out
    assert f"{flag} " in out and expect in out
    assert not _rows(tmp_path, "bench")  # refused before anything was measured


# --- 2 and 3. unconverged rows, JSON and JUnit of bench -------------------------------------------

def test_bench_marks_unconverged_rows_and_writes_json_and_junit(tmp_path, capsys, quick):
    """A noise target no CPU meets: the row stops on --timeout and must not read plain `ok`."""
    out_json, out_xml = tmp_path / "bench.json", tmp_path / "bench.xml"
    rc = main(["--store", str(tmp_path / "store"), "bench", *CASE, *QUICK,
               "--max-noise", "0.00001", "--json", str(out_json), "--junit-xml", str(out_xml)])
    out = _flat(capsys.readouterr().out)
    assert rc == 0, out
    (row,) = _rows(tmp_path / "store", "bench")
    assert row["status"] == "ok" and row["stop_reason"] == "timeout"
    assert "ok, not converged (noise" in out and "1 not converged (stopped at --timeout" in out

    doc = json.loads(out_json.read_text())
    assert doc["verb"] == "bench" and doc["run_id"] == row["run_id"] and doc["verdict"] == "OK"
    assert doc["counts"]["rows"] == 1 and doc["counts"]["not_converged"] == 1
    (rec,) = doc["rows"]
    assert rec["impl"] == "torch:rms_norm" and rec["case_id"] == row["case_id"]
    assert rec["converged"] is False and rec["note"].startswith("not converged (noise")
    assert rec["metrics"]["median_ns"] == pytest.approx(row["median_ns"])
    assert rec["repro"] == (f"kparity --store {tmp_path / 'store'} bench --impl torch:rms_norm "
                            "--preset decode-1x4096 --dtype f32 --mode wall")

    suite = ET.parse(out_xml).getroot().find("testsuite")
    (case,) = suite.findall("testcase")
    assert suite.get("tests") == "1" and suite.get("failures") == "0"
    assert case.get("classname") == "torch:rms_norm"
    assert case.get("name").startswith(row["case_id"]) and case.get("name").endswith(" wall")
    assert float(case.get("time")) == pytest.approx(row["seconds"], abs=1e-3)
    assert "not converged" in case.find("system-out").text


def test_one_sample_has_no_noise_estimate():
    """One sample used to report `noise 0.00 %`: a perfect measurement it is not."""
    from runners.abstats import summarize
    from runners.stopping import shortfall

    assert summarize([1e-6])["rel_std"] is None
    assert shortfall("timeout", None, 1, 0.005) == "not converged (1 sample: no noise estimate)"
    assert shortfall("converged", 0.001, 50, 0.005) == ""
    assert shortfall("plateau", 0.03, 900, 0.005) == "noise plateau (noise 3 % > 0.5 %)"


# --- 3. JSON and JUnit of check, with a failing mutant --------------------------------------------

def test_check_json_and_junit_count_a_mutants_failures(tmp_path, capsys):
    out_json, out_xml = tmp_path / "check.json", tmp_path / "check.xml"
    rc = main(["--plugin", "tests/mutants.py", "--store", str(tmp_path / "store"), "check",
               "--impl", "torch:mutant_skip_lane,torch:rms_norm", "--preset", "qwen3-8b,violates",
               "--dtype", "f32", "--show-failures", "0", "--json", str(out_json),
               "--junit-xml", str(out_xml)])
    assert rc == 1, capsys.readouterr().out
    rows = _rows(tmp_path / "store", "correctness")
    failing = [r for r in rows if r["status"] == "fail"]
    refused = [r for r in rows if r["status"] == "rejected" and r["expect"] == "rejected"]
    assert failing and refused and all(r["impl"] == "torch:mutant_skip_lane" for r in failing)

    doc = json.loads(out_json.read_text())  # strict JSON: the mutant's budget inf is "inf"
    assert doc["verdict"] == "FAILED" and doc["run_id"] == rows[0]["run_id"]
    assert doc["counts"]["rows"] == len(rows) and doc["counts"]["failing"] == len(failing)
    bad = [r for r in doc["rows"] if r["failing"]]
    assert {(r["impl"], r["case_id"]) for r in bad} == {(r["impl"], r["case_id"]) for r in failing}
    assert all(r["metrics"]["budget"] == "inf" for r in bad)
    assert all(r["repro"].startswith("kparity --store ")
               and f"repro {r['case_id']} --impl {r['impl']}" in r["repro"] for r in bad)

    suite = ET.parse(out_xml).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(rows) and suite.get("tests") == str(len(rows))
    failures = [c for c in cases if c.find("failure") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert len(failures) == len(failing) == int(suite.get("failures"))
    assert len(skipped) == len(refused) == int(suite.get("skipped"))
    assert {c.get("classname") for c in failures} == {"torch:mutant_skip_lane"}
    assert {c.get("name").split()[0] for c in failures} == {r["case_id"] for r in failing}
    for c in failures:
        text = c.find("failure").text
        assert "never written" in c.find("failure").get("message")
        assert "--plugin tests/mutants.py repro" in text and "repro: kparity --store" in text
        assert f"repro {c.get('name').split()[0]} --impl torch:mutant_skip_lane" in text


def test_output_file_in_a_missing_directory_is_refused_before_the_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--store", str(tmp_path), "check", *CASE[:2], "--json",
              str(tmp_path / "missing" / "out.json")])
    assert e.value.code == 2
    assert "missing does not exist" in _flat(capsys.readouterr().err)
    assert not _rows(tmp_path, "runs")


# --- 4. ab with a baseline and N impls ------------------------------------------------------------

def test_ab_baseline_against_two_impls_one_table(tmp_path, capsys, quick):
    """A = torch:rms_norm against B = a mutant (wrong: not timed) and C = A itself (timed)."""
    rc = main(["--plugin", "tests/mutants.py", "--store", str(tmp_path), "ab", "torch:rms_norm",
               "torch:mutant_skip_lane", "torch:rms_norm", "--preset", "decode-1x4096",
               "--dtype", "f32", *QUICK[:-1], "0.02"])
    out = _flat(capsys.readouterr().out)
    assert rc == 1, out  # one pair failed
    ab = _rows(tmp_path, "ab")
    assert [(r["impl_a"], r["impl_b"], r["status"]) for r in ab] == [
        ("torch:rms_norm", "torch:mutant_skip_lane", "fail"),
        ("torch:rms_norm", "torch:rms_norm", "ok")]
    assert len({r["ab_id"] for r in ab}) == 1 and "not timed" in ab[0]["message"]
    runs = sorted(_rows(tmp_path, "bench"), key=lambda r: (r["rep"], r["arm"]))
    assert [r["arm"] for r in runs] == ["A", "C"] * 5
    assert ab[1]["runs_a_ns"] == [r["median_ns"] for r in runs if r["arm"] == "A"]
    assert ab[1]["runs_b_ns"] == [r["median_ns"] for r in runs if r["arm"] == "C"]
    assert "C = torch:rms_norm" in out and "C/A [95% CI]" in out and ab[1]["verdict"] in out


def test_ab_needs_two_impls(tmp_path, capsys):
    rc = main(["--store", str(tmp_path), "ab", "torch:rms_norm"])
    assert rc == 2 and "at least one impl to compare" in capsys.readouterr().out


# --- 5. bench presets listed and accepted; a bad mode ---------------------------------------------

def test_cases_lists_the_bench_presets(capsys):
    assert main(["cases", "--impl", "torch:rms_norm", "--dtype", "f32"]) == 0
    out = _flat(capsys.readouterr().out)
    assert "bench presets (7): kparity bench --preset NAME" in out
    assert "decode-1x4096, decode-16x4096" in out


def test_a_bench_preset_given_to_cases_is_pointed_at_bench(capsys):
    assert main(["cases", "--impl", "torch:rms_norm", "--preset", "decode-1x4096"]) == 2
    assert "kparity bench --preset decode-1x4096" in _flat(capsys.readouterr().out)


def test_bench_unknown_mode_lists_the_modes_closest_first(tmp_path, capsys):
    rc = main(["--store", str(tmp_path), "bench", *CASE, "--mode", "wal"])
    out = _flat(capsys.readouterr().out)
    assert rc == 2 and "unknown mode 'wal' Valid modes (closest first): wall" in out


# --- 6. bench on a CPU with nothing narrowing it: the decode presets ------------------------------

def test_bench_without_filters_on_cpu_benches_the_decode_presets(tmp_path, capsys, monkeypatch,
                                                                  quick):
    """The measurement itself is stubbed: what is tested is the plan and what is said."""
    import verbs.timing as tv
    from runners.bench import bench_base_row

    def measured(impl, backend, case, mode, *args, **kwargs):
        return {**bench_base_row(impl, backend, case, mode, args[2]), "status": "ok",
                "stop_reason": "converged", "n_samples": 10, "median_ns": 1e3, "rel_std": 1e-3}
    monkeypatch.setattr(tv, "bench_one", measured)
    rc = main(["--store", str(tmp_path), "bench", "--backend", "torch", "--dtype", "f32"])
    out = _flat(capsys.readouterr().out)
    assert rc == 0, out
    rows = _rows(tmp_path, "bench")
    assert rows and all(r["label"].startswith("bench:decode-") for r in rows)
    assert (f"benching the decode presets ({len(rows)} measurements); --preset all for every "
            "bench case" in out)
    assert f"benching {len(rows)} (impl, case, mode) measurements" in out


# --- 7. why nothing ran ---------------------------------------------------------------------------

def test_bench_says_which_contract_invariant_refuses_every_bench_case(tmp_path, capsys):
    rc = main(["--store", str(tmp_path), "bench", "--impl", "torch:grouped_linear", "--preset",
               "qwen3-30b-a3b-up-affine4-t1"])
    out = _flat(capsys.readouterr().out)
    assert rc == 3
    assert ("torch:grouped_linear: its contract refuses the bench case of moe_grouped_gemm: "
            "`weights == 'dense'` (weights=affine4" in out)
    assert "What would match: torch:grouped_dequant_linear" in out


# --- 8. rounding conventions (issue 35): timed on the same shapes, said, never dropped -----------

def test_a_normed_impl_is_benched_on_every_bench_shape_under_its_convention():
    """torch:rms_norm_llama (HF Llama: x·inv rounded to T, then ·w) refuses the bench cases'
    default rounding="once"; bench times it on each of them under rounding="normed"."""
    import gpu_impls
    from cases.generate import bench_cases, bench_plan, convention

    llama = gpu_impls.impls()["torch:rms_norm_llama"]
    cases = bench_cases("rms_norm")
    work = bench_plan([llama])
    assert len(work) == len(cases) and {convention(w.case) for w in work} == {"rounding=normed"}
    assert [(w.case.label, w.case.dtype, w.case.dims) for w in work] == [
        (c.label, c.dtype, c.dims) for c in cases]
    once = bench_plan([gpu_impls.impls()["torch:rms_norm"]])
    assert [w.case for w in once] == cases  # an impl admitting the case gets the case itself


def test_a_mixed_bench_shows_each_impls_convention(tmp_path, capsys, quick):
    rc = main(["--store", str(tmp_path), "bench", "--op", "rms_norm", "--impl",
               "torch:rms_norm,torch:rms_norm_llama", "--preset", "decode-1x4096", "--dtype",
               "f32", *QUICK])
    out = _flat(capsys.readouterr().out)
    assert rc == 0, out
    rows = {r["impl"]: json.loads(r["params"])["rounding"] for r in _rows(tmp_path, "bench")}
    assert rows == {"torch:rms_norm": "once", "torch:rms_norm_llama": "normed"}
    assert "convention" in out and "rounding=once" in out and "rounding=normed" in out


def test_ab_of_a_normed_and_a_once_impl_runs_and_names_each_arms_convention(tmp_path, capsys,
                                                                             quick):
    rc = main(["--store", str(tmp_path), "ab", "torch:rms_norm_llama", "torch:rms_norm",
               "--preset", "decode-1x4096", "--dtype", "f32", *QUICK[:-1], "0.02"])
    out = _flat(capsys.readouterr().out)
    assert rc == 0, out
    (ab,) = _rows(tmp_path, "ab")
    assert ab["status"] == "ok" and (ab["convention_a"], ab["convention_b"]) == (
        "rounding=normed", "rounding=once")
    assert ab["ab_max_ulp"] <= 1  # one rounding apart, on the same inputs
    assert ("conventions: torch:rms_norm_llama rounding=normed; torch:rms_norm rounding=once"
            in out)
    assert "A convention" in out and "B convention" in out
    runs = {r["arm"]: json.loads(r["params"])["rounding"] for r in _rows(tmp_path, "bench")}
    assert runs == {"A": "normed", "B": "once"}


def _refusing_impl(monkeypatch):
    """torch:rms_norm under a contract no bench case meets (eps == 1)."""
    import dataclasses

    import gpu_impls
    from gpu_impls.contract import Contract, Invariant

    base = gpu_impls.impls()["torch:rms_norm"]
    eps_one = Invariant("eps == 1", lambda ns: ns["eps"] == 1.0, "a test contract",
                        lambda ns: "torch:rms_norm", {"eps": 1e-6}, ("eps",))
    refusing = dataclasses.replace(base, name="test_eps_one",
                                   contract=Contract(invariants=(eps_one,)))
    gpu_impls.impls()  # loaded before the registry is patched
    monkeypatch.setitem(gpu_impls._IMPLS, refusing.id, refusing)
    return refusing


def test_no_selected_impl_is_left_out_of_a_bench_without_a_line(tmp_path, capsys, quick,
                                                                 monkeypatch):
    refusing = _refusing_impl(monkeypatch)
    rc = main(["--store", str(tmp_path), "bench", "--op", "rms_norm", "--backend", "torch",
               "--impl", f"torch:rms_norm,{refusing.id}", "--preset", "decode-1x4096",
               "--dtype", "f32", *QUICK])
    out = _flat(capsys.readouterr().out)
    assert rc == 0, out
    assert {r["impl"] for r in _rows(tmp_path, "bench")} == {"torch:rms_norm"}
    assert (f"not benched: {refusing.id}: its contract refuses the bench case of rms_norm: "
            "`eps == 1`") in out


def test_no_selected_impl_is_left_out_of_a_check_without_a_line(tmp_path, capsys, monkeypatch):
    refusing = _refusing_impl(monkeypatch)
    rc = main(["--store", str(tmp_path), "check", "--impl", f"torch:rms_norm,{refusing.id}",
               "--preset", "qwen3-8b", "--dtype", "f32"])
    out = _flat(capsys.readouterr().out)
    assert rc == 0, out
    assert f"not checked: {refusing.id}: its contract refuses all" in out and "`eps == 1`" in out


def test_a_convention_variant_is_timed_on_its_bench_cases_inputs(tmp_path, capsys, quick,
                                                                 monkeypatch):
    """torch:rms_norm_llama's variant (rounding=normed, its own case id) runs on the inputs of
    the bench case it stands for, the ones every other impl of that case gets."""
    import verbs.timing as tv
    from cases.generate import bench_cases

    drawn = []
    real = tv.make_inputs
    monkeypatch.setattr(tv, "make_inputs", lambda case: drawn.append(case.id) or real(case))
    rc = main(["--store", str(tmp_path), "bench", "--op", "rms_norm", "--impl",
               "torch:rms_norm,torch:rms_norm_llama", "--preset", "decode-1x4096", "--dtype",
               "f32", *QUICK])
    assert rc == 0, capsys.readouterr().out
    (case,) = [c for c in bench_cases("rms_norm")
               if c.label == "bench:decode-1x4096" and c.dtype == "f32"]
    assert drawn == [case.id]  # one draw, the bench case's, for both impls
    ids = {r["impl"]: r["case_id"] for r in _rows(tmp_path, "bench")}
    assert ids["torch:rms_norm"] == case.id != ids["torch:rms_norm_llama"]


def test_not_checked_names_the_refusing_invariant_where_only_a_variant_would_run(tmp_path,
                                                                                 capsys):
    """The gate never runs a case under another convention: where a preset has no
    rounding=normed case, torch:rms_norm_llama is named with the invariant that refuses."""
    rc = main(["--store", str(tmp_path), "check", "--impl",
               "torch:rms_norm,torch:rms_norm_llama", "--preset", "gemma-4-31b", "--dtype",
               "f32"])
    out = _flat(capsys.readouterr().out)
    assert rc == 0, out
    assert "not checked: torch:rms_norm_llama: its contract refuses" in out
    assert "`rounding == 'normed'`" in out