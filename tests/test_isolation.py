"""Process isolation (`--isolate case|impl`): a sweep survives a hung case, a segfault and a sticky
device error, each becoming that case's row while every other case passes; a device that stays
broken after a crash ends the sweep loudly; no worker outlives the sweep, Ctrl-C included. The
faults are the test-only torch impls of tests/faults.py, on the 6 bf16 qwen3-0.6b cases."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from cases.distributions import DISTRIBUTIONS
from collections import Counter
from pathlib import Path

import pytest

from cases.generate import plan
from gpu_impls import backend, impls
from results.store import Store
from verbs.cli import main
from runners.correctness import check
from runners.verdicts import is_failure
from runners.isolation import row_without_result

FAULTS = str(Path(__file__).with_name("faults.py"))
CASES = ["--preset", "qwen3-0.6b", "--dtype", "bf16"]
FAULTY = "torch:fault_hang,torch:fault_segv,torch:fault_sticky,torch:fault_none"
N = len(DISTRIBUTIONS)  # bf16 cases of one preset: one per distribution


def workers_alive() -> list[int]:
    """Pids of this process's spawned children still in the process table (zombies included)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == os.getpid() and b"spawn_main" in cmdline:
            pids.append(int(entry.name))
    return pids


def assert_no_workers():
    assert multiprocessing.active_children() == []
    assert workers_alive() == []


def rows(store: Path) -> list[dict]:
    return Store(store).read("correctness").to_pylist()


@pytest.mark.parametrize("mode", ["case", "impl"])
def test_hang_segfault_and_sticky_error_each_become_one_row(tmp_path, mode):
    store = tmp_path / "store"
    rc = main(["--store", str(store), "--plugin", FAULTS, "check", "--impl", FAULTY, *CASES,
               "--isolate", mode, "--case-timeout", "3"])
    assert rc == 1
    got = rows(store)
    assert Counter((r["impl"], r["status"]) for r in got) == {
        ("torch:fault_hang", "timeout"): 1, ("torch:fault_hang", "pass"): N - 1,
        ("torch:fault_segv", "crash"): 1, ("torch:fault_segv", "pass"): N - 1,
        ("torch:fault_sticky", "crash"): 1, ("torch:fault_sticky", "pass"): N - 1,
        ("torch:fault_none", "pass"): N}
    bad = {r["impl"]: r for r in got if r["status"] != "pass"}
    assert bad["torch:fault_hang"]["dist"] == "tiny"
    assert "within 3 s" in bad["torch:fault_hang"]["message"]
    assert "--case-timeout" in bad["torch:fault_hang"]["message"]
    assert bad["torch:fault_segv"]["dist"] == "zero_rows"
    assert "SIGSEGV" in bad["torch:fault_segv"]["message"]
    assert "in segv" in bad["torch:fault_segv"]["message"]  # faulthandler's stack, from stderr
    assert bad["torch:fault_sticky"]["dist"] == "outlier_rows"
    assert "sticky device error" in bad["torch:fault_sticky"]["message"]
    for r in bad.values():  # every case column filled, every metric null, and a failure
        assert r["case_id"] and r["case_json"] and r["dims"] and r["device"] == "cpu"
        assert r["label"] == "preset:qwen3-0.6b" and r["expect"] == "valid" and r["run_id"]
        assert r["budget"] is None and r["max_ulp"] is None and is_failure(r)
    assert_no_workers()


def test_isolate_none_runs_the_control_in_process(tmp_path):
    store = tmp_path / "store"
    assert main(["--store", str(store), "--plugin", FAULTS, "check", "--impl",
                 "torch:fault_none", *CASES, "--isolate", "none"]) == 0
    assert {r["status"] for r in rows(store)} == {"pass"} and len(rows(store)) == len(DISTRIBUTIONS)
    assert_no_workers()


def test_a_device_broken_by_a_crash_ends_the_sweep(tmp_path, monkeypatch, capsys):
    store = tmp_path / "store"
    monkeypatch.setenv("KPARITY_FAULT_BRICK_MARK", str(tmp_path / "bricked"))
    assert main(["--store", str(store), "--plugin", FAULTS, "check", "--impl",
                 "torch:fault_brick", *CASES, "--isolate", "case", "--case-timeout", "10"]) == 1
    out = " ".join(capsys.readouterr().out.split())  # one message, however rich wraps it
    assert "stopped: device unusable after the crash of case" in out
    assert "no CUDA-capable device" in out and "--resume" in out
    statuses = [r["status"] for r in rows(store)]  # the rows before it, the crash included
    assert sorted(statuses) == ["crash", "pass", "pass", "pass"]
    assert_no_workers()


def test_ctrl_c_during_a_hung_case_leaves_no_worker(tmp_path, monkeypatch):
    store = tmp_path / "store"
    hanging = tmp_path / "hanging"  # the worker creates it as the hung case starts (faults.py)
    monkeypatch.setenv("KPARITY_FAULT_HANG_MARK", str(hanging))
    stop = threading.Event()
    seen = []  # what the watcher did, for the failure message

    def interrupt_once_hung():  # the 4th case (bf16 tiny) hangs: Ctrl-C while it runs
        # to the main thread, where a terminal's Ctrl-C is handled
        while not stop.wait(0.05):
            if hanging.exists():
                seen.append("saw the hung case start")
                stop.wait(0.5)
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                seen.append("sent SIGINT to the main thread")
                return

    # Ctrl-C at a terminal raises KeyboardInterrupt; a process started as a background job
    # (`cmd &` in a script, as some CI launchers do) inherits SIGINT ignored, and then Python
    # installs no handler. Give this test the terminal's handler whatever the launcher did.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    watcher = threading.Thread(target=interrupt_once_hung, daemon=True)
    watcher.start()
    try:  # the CLI ends an interrupted sweep with one line and exit 130
        rc = main(["--store", str(store), "--plugin", FAULTS, "check", "--impl",
                   "torch:fault_hang", *CASES, "--isolate", "case", "--case-timeout", "60"])
    except KeyboardInterrupt:
        rc = "KeyboardInterrupt escaped"
    finally:
        stop.set()
        watcher.join()
        signal.signal(signal.SIGINT, previous)
    assert rc == 130, f"exit {rc}; the watcher: {seen or 'never saw the hang'}"
    assert_no_workers()
    assert Counter(r["status"] for r in rows(store)) == {"pass": 3}  # written before the hang


def test_timeout_and_crash_rows_have_exactly_checks_columns():
    w = plan([impls()["torch:rms_norm"]], dtypes=["f32"], presets=["qwen3-0.6b"])[0]
    made = row_without_result(w, "run", "timeout", "no answer", 1.5)
    checked = check(w, backend("torch"), "run")
    assert made.keys() == checked.keys()
    assert {k: made[k] for k in ("status", "message", "seconds", "expect")} == {
        "status": "timeout", "message": "no answer", "seconds": 1.5, "expect": "valid"}
    assert all(made[k] == checked[k] for k in ("case_id", "case_json", "dims", "params", "label",
                                               "device", "dtype", "dist", "op", "impl"))
    assert made["budget"] is None and made["outputs_json"] == "{}"
