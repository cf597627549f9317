"""scripts/same_rows.py and scripts/same_tests.py: issue 32's judges of a spread run (it must give
the plain run's rows, the one-process gate's outcomes). Each must say "same" for equal runs
whatever the order or the devices, and exit 1 on one differing row or test."""

from __future__ import annotations

import json

from results.store import Store
from scripts import same_rows, same_tests


def _store(path, statuses: dict, devices=None) -> str:
    store = Store(path)
    run = "20261126T000000Z-0000000001"
    store.write("runs", [{"run_id": run, "verb": "check"}], run, 0)
    store.write("correctness", [
        {"run_id": run, "impl": "cuda:x", "case_id": case, "expect": "valid", "status": status,
         "seconds": 0.004, "device_index": None if devices is None else devices[i % len(devices)]}
        for i, (case, status) in enumerate(statuses.items())], run, 0)
    return str(path)


def test_same_rows_ignores_order_and_devices_and_catches_one_status(tmp_path, capsys):
    plain = _store(tmp_path / "a", {"c1": "pass", "c2": "pass", "c3": "fail"})
    spread = _store(tmp_path / "b", {"c3": "fail", "c1": "pass", "c2": "pass"}, devices=[0, 1])
    assert same_rows.main([plain, spread]) == 0
    out = capsys.readouterr().out
    assert "same rows" in out and "0: 0.0 s" in out and "1: 0.0 s" in out
    other = _store(tmp_path / "c", {"c1": "pass", "c2": "timeout", "c3": "fail"}, devices=[0])
    assert same_rows.main([plain, other]) == 1
    assert "DIFFERENT: 1 rows only in A, 1 only in B" in capsys.readouterr().out


def _junit(path, outcomes: dict) -> str:
    cases = "".join(
        f'<testcase classname="tests.test_gpu" name="{name}">'
        + {"passed": "", "skipped": "<skipped/>", "failed": "<failure/>"}[kind] + "</testcase>"
        for name, kind in outcomes.items())
    path.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return str(path)


def test_same_tests_compares_each_test_and_catches_one_outcome(tmp_path, capsys):
    one = _junit(tmp_path / "n0.xml", {"t1": "passed", "t2": "skipped"})
    assert same_tests.main([one, _junit(tmp_path / "n2.xml", {"t2": "skipped", "t1": "passed"})]) == 0
    out = capsys.readouterr().out
    assert "same outcome for every test" in out and "test time 0.0 s" in out
    assert same_tests.main([one, _junit(tmp_path / "x.xml", {"t1": "failed", "t2": "skipped"})]) == 1
    assert "tests.test_gpu::t1: passed in A, failed in B" in capsys.readouterr().out
    assert same_tests.main([one, _junit(tmp_path / "y.xml", {"t1": "passed"})]) == 1  # one missing


def test_same_tests_by_file_counts_run_tests_and_sums_seconds(tmp_path, capsys):
    xml = tmp_path / "a.xml"
    xml.write_text('<testsuites><testsuite name="pytest">'
                   '<testcase classname="tests.test_gpu" name="a" time="1.5"/>'
                   '<testcase classname="tests.test_gpu" name="b" time="2.0"/>'
                   '<testcase classname="tests.test_gpu_ssm" name="c" time="0.5"><skipped/>'
                   '</testcase></testsuite></testsuites>')
    assert same_tests.main(["--by-file", str(xml)]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows == {"test_gpu.py": ["2", "3.5"], "test_gpu_ssm.py": ["0", "0.5"],
                    "total": ["2", "4.0"]}


def test_long_tests_keeps_each_tests_longest_time_above_the_floor(tmp_path):
    from scripts import long_tests

    def junit(path, times):
        cases = "".join(f'<testcase classname="tests.test_gpu_ssm" name="{n}" time="{t}"/>'
                        for n, t in times.items())
        path.write_text(f'<testsuites><testsuite>{cases}</testsuite></testsuites>')
        return str(path)
    a = junit(tmp_path / "a.xml", {"test_step_batch_64[hpn]": 27.1, "test_x": 0.2})
    b = junit(tmp_path / "b.xml", {"test_step_batch_64[hpn]": 28.9, "test_y": 4.9})
    out = tmp_path / "long.json"
    assert long_tests.main([a, b, "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == {"tests/test_gpu_ssm.py::test_step_batch_64[hpn]": 28.9}


def test_the_worksteal_model_pays_for_long_tests_left_at_the_end():
    from scripts.simulate_worksteal import finish_time

    assert finish_time([3.0, 1.0, 2.0], 1) == 6.0                # one worker: the sum
    assert finish_time([10.0, 1.0, 1.0, 1.0], 2) == 11.0         # no steal leaves a queue < 2
    at_the_end = finish_time([1.0] * 8 + [10.0, 10.0], 2)
    first = finish_time([10.0, 10.0] + [1.0] * 8, 2)
    assert first < at_the_end and first >= 14.0                  # never below the ideal


def test_same_rows_lists_the_impls_whose_worker_seconds_grew():
    from scripts.same_rows import grown

    a = [{"impl": "torch:x", "seconds": 1.0}, {"impl": "cuda:y", "seconds": 2.0},
         {"impl": "cuda:z", "seconds": 3.0}]
    b = [{"impl": "torch:x", "seconds": 4.0, "device_index": 1},
         {"impl": "cuda:y", "seconds": 2.5, "device_index": 0},
         {"impl": "cuda:z", "seconds": 1.0, "device_index": 0}]
    lines = grown(a, b, 2)
    assert "torch:x" in lines[0] and "1.0 ->   4.0 s  on [1]" in lines[0]
    assert "cuda:y" in lines[1] and len(lines) == 3
    assert lines[2] == "  gross growth 3.5 s: torch 3.0 s, cuda 0.5 s"  # z shrank: not counted


def test_long_tests_update_keeps_the_tests_a_run_did_not_run(tmp_path):
    """`scripts/long_tests.py --update`: a test the runs ran takes its new time (or leaves the
    table, under --min); one they did not run keeps its old entry."""
    from scripts import long_tests

    run = tmp_path / "commit.xml"
    run.write_text('<testsuites><testsuite name="pytest">'
                   '<testcase classname="tests.test_gpu" name="test_gate[cuda:a-0123456789ab]" time="12.5"/>'
                   '<testcase classname="tests.test_gpu" name="test_gate[cuda:b-0123456789ab]" time="1.0"/>'
                   '</testsuite></testsuites>')
    table = tmp_path / "long.json"
    table.write_text(json.dumps({"tests/test_gpu.py::test_gate[cuda:a-*]": 40.0,
                                 "tests/test_gpu.py::test_gate[cuda:b-*]": 30.0,
                                 "tests/test_gpu.py::test_nightly_only": 60.0}))
    assert long_tests.main([str(run), "--out", str(table), "--update"]) == 0
    assert json.loads(table.read_text()) == {"tests/test_gpu.py::test_nightly_only": 60.0,
                                             "tests/test_gpu.py::test_gate[cuda:a-*]": 12.5}
    assert long_tests.main([str(run), "--out", str(table)]) == 0  # without: the runs' alone
    assert json.loads(table.read_text()) == {"tests/test_gpu.py::test_gate[cuda:a-*]": 12.5}
