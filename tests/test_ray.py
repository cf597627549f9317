"""`check --ray` (runners/ray_sweep.py) on a local Ray cluster of 2 CPUs, started once for the
module: the sweep's rows equal the single-process sweep's; a Ray worker killed mid-task loses
no row (Ray reruns the task; a case that always kills its worker becomes a `crash` row, its
batch's other cases still run); a sweep stopped early resumes on Ray. The killers are
tests/ray_faults.py's impls."""

from __future__ import annotations

import json
import logging
import socket
from collections import Counter
from pathlib import Path

import pytest

from results.store import Store
from runners import ray_sweep
from verbs.cli import main
from runners.limits import BadInput

KILLERS = str(Path(__file__).with_name("ray_faults.py"))
CASES = ["--preset", "qwen3-0.6b", "--dtype", "bf16"]
KILLED_DIST = "zero_rows"  # tests/ray_faults.py's DIST: the case its impls kill their worker on


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False)
    yield ray
    ray.shutdown()


def rows(store: Path) -> list[dict]:
    return Store(store).read("correctness").to_pylist()


def outcomes(got: list[dict]) -> Counter:
    return Counter((r["impl"], r["case_id"], r["expect"], r["status"]) for r in got)


def test_ray_sweep_rows_equal_the_single_process_sweep(tmp_path, cluster):
    args = ["check", "--impl", "torch:rms_norm,torch:rms_norm_llama", *CASES]
    assert main(["--store", str(tmp_path / "one"), *args]) == 0
    assert main(["--store", str(tmp_path / "ray"), *args, "--ray", "local"]) == 0
    one, ray = rows(tmp_path / "one"), rows(tmp_path / "ray")
    assert len(ray) == len(one) > 8  # more than one batch a slot (runners/ray_sweep.batches)
    assert outcomes(ray) == outcomes(one)
    run_ids = {r["run_id"] for r in Store(tmp_path / "ray").read("runs").to_pylist()}
    assert {r["run_id"] for r in ray} == run_ids and len(run_ids) == 1  # the sweep's, not a task's
    # each row says where it ran: the task's host (one here), no GPU (CPU tasks)
    assert {(r["host"], r["device_index"]) for r in ray} == {(socket.gethostname(), None)}
    assert {r["host"] for r in one} == {None}  # a one-host run: the run's `runs.host`


# nightly: waits out Ray's restart of the killed worker (31 s on a 2-core CPU); the
# single-process sweep's kill tests (tests/test_resume.py) cover losing no row in commit
@pytest.mark.nightly
def test_a_killed_ray_worker_loses_no_row(tmp_path, cluster, monkeypatch):
    """3 impls x 3 cases: batches of 2 and 1 (9 items, 2 slots), the killed case second in its
    batch, so the worker dies with the batch's first row computed and not yet returned."""
    monkeypatch.setenv("KPARITY_RAY_KILL_DIR", str(tmp_path))  # KPARITY_*: passed to the tasks
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([{"op": "rms_norm", "dims": {"rows": 3, "n": 96},
                                  "dtype": "bf16", "dist": dist}
                                 for dist in ("normal", KILLED_DIST, "outlier_rows")]))
    store = tmp_path / "store"
    rc = main(["--store", str(store), "--plugin", KILLERS, "check", "--cases", str(cases),
               "--impl", "torch:ray_kill_once,torch:ray_kill_always,torch:rms_norm",
               "--ray", "local", "--ray-retries", "1"])
    assert rc == 1  # the crash row is a failure
    got = rows(store)
    assert (tmp_path / "once").exists()  # ray_kill_once did kill its worker once
    # ray_kill_always's case: its batch of 2 tried twice (--ray-retries 1), then alone twice
    assert (tmp_path / "always.log").read_text().count("killed") == 4
    assert Counter((r["impl"], r["status"]) for r in got) == {
        ("torch:rms_norm", "pass"): 3, ("torch:ray_kill_once", "pass"): 3,
        ("torch:ray_kill_always", "pass"): 2, ("torch:ray_kill_always", "crash"): 1}
    crash = next(r for r in got if r["status"] == "crash")
    assert crash["dist"] == KILLED_DIST and crash["expect"] == "valid" and crash["case_json"]
    assert "the Ray worker died running this case, on each of its 2 tries" in crash["message"]
    assert len({(r["impl"], r["case_id"]) for r in got}) == len(got) == 9


def test_a_ray_sweep_stopped_early_resumes_on_ray(tmp_path, cluster, capsys):
    """--maxfail 1 stops the sweep at its first failing row (tests/mutants.py's drop_eps fails
    2 of its 7 cases), the tasks still out cancelled; --resume runs the rest, each pair once."""
    sweep = ["check", "--impl", "torch:mutant_drop_eps,torch:rms_norm", *CASES]
    mutants = ["--plugin", str(Path(__file__).with_name("mutants.py"))]
    assert main(["--store", str(tmp_path / "one"), *mutants, *sweep]) == 1
    store = ["--store", str(tmp_path / "store"), *mutants]
    assert main([*store, *sweep, "--ray", "local", "--maxfail", "1"]) == 1
    said = capsys.readouterr().out
    if "stopped early" in said:  # (unless the failing batch was the last to finish)
        assert " --ray local" in said.split("The rest: ")[1]  # the resume command names it
    assert main([*store, "check", "--resume", "last", "--ray", "local"]) == 1
    got = rows(tmp_path / "store")
    assert outcomes(got) == outcomes(rows(tmp_path / "one"))  # each pair once, as one run
    assert {r["status"] for r in got} == {"pass", "fail"} and len({r["run_id"] for r in got}) == 1


def test_gpu_batches_on_a_cluster_without_gpus_are_refused_at_once():
    with pytest.raises(BadInput, match=r"cuda impls need a GPU each, and the Ray cluster has "
                                         r"none \(CPU 2\)"):
        ray_sweep._check_feasible({"cuda": True, "torch": False}, {"CPU": 2.0}, "local")
    ray_sweep._check_feasible({"cuda": True}, {"CPU": 2.0, "GPU": 1.0}, "local")
    ray_sweep._check_feasible({"torch": False}, {"CPU": 2.0}, "local")


def test_ray_without_ray_installed_is_bad_input(monkeypatch, capsys):
    monkeypatch.setattr(ray_sweep, "available", lambda: False)
    with pytest.raises(SystemExit) as e:
        main(["check", "--impl", "torch:rms_norm", "--ray", "local"])
    assert e.value.code == 2
    assert "pip install 'kparity[ray]'" in capsys.readouterr().err


@pytest.mark.parametrize("ids, index", [([], None), ([1], 1), (["2"], 2),
                                        (["GPU-5e1f0c8a"], None)])
def test_a_ray_row_names_its_host_and_the_gpu_ray_gave_its_task(monkeypatch, ids, index):
    """Ray gives a task's GPU as an int or a string (an index, or a UUID where the host lists
    its GPUs by UUID: not an index, so no `device_index`)."""
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[ray]'")
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: ids)
    assert ray_sweep._where() == {"host": socket.gethostname(), "device_index": index}
