"""The known-issues ledger (`gpu_impls/known_issues.py`): an xfail entry turns its case's failure
into `xfail` and its pass into a failing `xpass`; a never-launch entry's case is recorded
`quarantined` and never runs (a hang that would otherwise run here); a malformed entry stops the
sweep before anything runs, naming the file, the entry and the field."""

from __future__ import annotations

import json
from cases.distributions import DISTRIBUTIONS
from pathlib import Path

import pytest

from cases.model import Case
from gpu_impls import known_issues
from gpu_impls.known_issues import KnownIssueError, load_file, parse
from results.store import Store
from verbs.cli import main

FAULTS = str(Path(__file__).with_name("faults.py"))
CASES = ["--preset", "qwen3-0.6b", "--dtype", "bf16", "--isolate", "none"]


@pytest.fixture
def ledger(monkeypatch):
    """Registered entries for this test only."""
    monkeypatch.setattr(known_issues, "_REGISTERED", [])
    return known_issues


def _rows(store):
    return {(r["impl"], r["dist"]): r for r in Store(store).read("correctness").to_pylist()}


def test_xfail_xpass_and_never_launch(tmp_path, ledger, capsys):
    ledger.register(
        # the unwritten-last fault fails on constant_rows only: there it is an xfail
        {"impl": "torch:fault_unwritten_last", "case": {"dist": "constant_rows"},
         "issue": "kparity/faults#1", "class": "xfail", "why": "last element unwritten"},
        # an xfail entry on a case that passes: xpass, failing
        {"impl": "torch:fault_in_place", "case": {"dist": "normal", "dims.n": "1024"},
         "issue": "#2", "class": "xfail"},
        # the hang, never launched (this run is not isolated: it would hang the test)
        {"impl": "torch:fault_hang", "case": {"dtype": "bf16", "dist": "t?ny"},
         "issue": "https://example.org/issues/3", "class": "never-launch"})
    rc = main(["--store", str(tmp_path), "--plugin", FAULTS, "check", "--impl",
               "torch:fault_unwritten_last,torch:fault_in_place,torch:fault_hang", *CASES])
    assert rc == 1  # the xpass
    rows = _rows(tmp_path)
    assert len(rows) == 3 * len(DISTRIBUTIONS)
    xfail = rows[("torch:fault_unwritten_last", "constant_rows")]
    assert xfail["status"] == "xfail" and "known:kparity/faults#1" in xfail["flags"]
    assert xfail["message"].startswith("known issue kparity/faults#1 (xfail: last element "
                                       "unwritten): fail: out: never written")
    xpass = rows[("torch:fault_in_place", "normal")]
    assert xpass["status"] == "xpass" and "remove or narrow it in plugin entry 1" \
        in xpass["message"]
    hung = rows[("torch:fault_hang", "tiny")]
    assert hung["status"] == "quarantined" and hung["seconds"] == 0.0
    assert hung["message"].startswith("not launched: known issue https://example.org/issues/3")
    others = [r for k, r in rows.items() if k not in
              {("torch:fault_unwritten_last", "constant_rows"), ("torch:fault_in_place", "normal"),
               ("torch:fault_hang", "tiny")}]
    assert len(others) == 3 * len(DISTRIBUTIONS) - 3 and all(r["status"] == "pass" for r in others)
    out = capsys.readouterr().out
    assert "xfail" in out and "xpass" in out and "quarantined" in out
    assert "XPASS torch:fault_in_place" in out


def test_repro_runs_a_known_case_and_says_so(tmp_path, ledger, capsys):
    ledger.register({"impl": "torch:fault_unwritten_last", "case": {"dist": "constant_rows"},
                     "issue": "#1", "class": "never-launch"})
    assert main(["--store", str(tmp_path), "--plugin", FAULTS, "check", "--impl",
                 "torch:fault_unwritten_last", *CASES]) == 0
    quarantined, = [r for r in Store(tmp_path).read("correctness").to_pylist()
                    if r["status"] == "quarantined"]
    capsys.readouterr()
    assert main(["--store", str(tmp_path), "--plugin", FAULTS, "repro", quarantined["case_id"],
                 "--impl", "torch:fault_unwritten_last", "--isolate", "none"]) == 1
    out = capsys.readouterr().out
    assert "known issue #1 (never-launch), from plugin entry 0: run anyway" in out
    assert "fail: out: never written" in out


def test_xfail_alone_does_not_fail_the_sweep(tmp_path, ledger):
    ledger.register({"impl": "torch:fault_unwritten_*", "case": {"dist": "constant_rows"},
                     "issue": "#1", "class": "xfail"})
    assert main(["--store", str(tmp_path), "--plugin", FAULTS, "check", "--impl",
                 "torch:fault_unwritten_last", *CASES]) == 0


def test_matching_fields():
    case = Case.make("rms_norm", {"rows": 7, "n": 4096}, "bf16", "tiny",
                     params={"eps": 1e-6}, label="preset:qwen3-8b")
    def entry(**where):
        return parse({"impl": "cuda:*", "case": where, "issue": "#1", "class": "xfail"}, "t")
    assert entry().matches("cuda:kp_rms_norm", case)
    assert not entry().matches("torch:rms_norm", case)
    assert entry(dtype="bf16", **{"dims.n": "409[5-7]", "label": "preset:*"}).matches(
        "cuda:x", case)
    assert not entry(**{"dims.n": "4095"}).matches("cuda:x", case)
    assert entry(**{"params.eps": "1e-06", "op": "rms_norm", "id": case.id}).matches("cuda:x",
                                                                                      case)
    assert entry(**{"params.eps": "1e-6"}).matches("cuda:x", case)  # numbers as numbers
    assert not entry(**{"params.eps": "1e-5"}).matches("cuda:x", case)
    assert not entry(**{"params.weight_offset": "1"}).matches("cuda:x", case)
    assert not entry(**{"dims.experts": "*"}).matches("cuda:x", case)  # rms_norm has none


def test_never_launch_wins_over_a_broader_xfail():
    case = Case.make("rms_norm", {"rows": 7, "n": 4096}, "bf16", "tiny")
    broad = parse({"impl": "cuda:*", "issue": "#1", "class": "xfail"}, "a")
    hang = parse({"impl": "cuda:k", "case": {"dist": "tiny"}, "issue": "#2",
                  "class": "never-launch"}, "b")
    assert known_issues.find("cuda:k", case, [broad, hang]) is hang
    assert known_issues.find("cuda:other", case, [broad, hang]) is broad
    assert known_issues.find("torch:k", case, [broad, hang]) is None


def test_xfail_entries_leave_violating_cases_alone_and_stale_entries_are_named(tmp_path, ledger,
                                                                                capsys):
    ledger.register({"impl": "mlx:fast_rms_norm", "issue": "#1", "class": "xfail"},
                    {"impl": "cuda:no_such_kernel", "issue": "#2", "class": "xfail"})
    rc = main(["--store", str(tmp_path), "check", "--impl", "mlx:fast_rms_norm", "--preset",
               "violates", "--isolate", "none"])
    assert rc == 0  # the violating cases' expected rejections are not judged by the ledger
    rows = Store(tmp_path).read("correctness").to_pylist()
    assert rows and {r["status"] for r in rows} == {"rejected"}
    assert "names impl 'cuda:no_such_kernel', which matches no impl here" \
        in capsys.readouterr().out


@pytest.mark.parametrize("entry, says", [
    ({"impl": "cuda:x", "issue": "#1", "class": "skip"}, "class 'skip'; valid: xfail, "
                                                         "never-launch"),
    ({"impl": "cuda:x", "issue": "flaky", "class": "xfail"}, "issue 'flaky' is no tracked "
                                                              "reference"),
    ({"impl": "cuda:x", "class": "xfail"}, "field 'issue' is missing"),
    ({"impl": "cuda:x", "issue": "#1", "class": "xfail", "case": {"shape": "1"}},
     "case field 'shape'; valid: id, op, dtype, dist, label, dims.<name>, params.<name>"),
    ({"impl": "cuda:x", "issue": "#1", "class": "xfail", "reason": "x"},
     "unknown field(s) reason"),
    ({"impl": "cuda:x", "issue": "#1", "class": "xfail", "why": 3}, "'why' must be a string"),
    ({"impl": "cuda:x", "issue": "#1", "class": "xfail", "case": {"dims.N": "4096"}},
     "case field 'dims.N': no dims 'N' in any op; valid: "),
    ({"impl": "cuda:x", "issue": "#1", "class": "xfail",
      "case": {"op": "rms_norm", "params.expert": "1"}},
     "no params 'expert' in op rms_norm; valid: eps, ftz, overflow, rounding, weight_offset"),
])
def test_malformed_entries_are_named(tmp_path, entry, says):
    path = tmp_path / "known_issues.json"
    path.write_text(json.dumps([{"impl": "cuda:ok", "issue": "#9", "class": "xfail"}, entry]))
    with pytest.raises(KnownIssueError) as e:
        load_file(path)
    assert str(e.value).startswith(f"{path} entry 1: ") and says in str(e.value)


def test_a_malformed_ledger_stops_check_before_anything_runs(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "known_issues.json"
    bad.write_text(json.dumps([{"impl": "torch:rms_norm", "issue": "#1", "class": "xfial"}]))
    monkeypatch.setattr(known_issues, "ledger", lambda: load_file(bad))
    store = tmp_path / "store"
    assert main(["--store", str(store), "check", "--impl", "torch:rms_norm", *CASES]) == 2
    assert f"{bad} entry 0: class 'xfial'" in capsys.readouterr().out
    assert not store.exists()


def test_every_backend_ships_a_ledger_that_parses(ledger):
    """Guards the shipped data: load_file raises on a malformed entry (all empty today)."""
    root = Path(known_issues.__file__).parent
    files = sorted(p.parent.name for p in root.glob("*/known_issues.json"))
    assert files == ["cuda", "metal", "mlx", "torch"]
    assert isinstance(ledger.ledger(), list)
