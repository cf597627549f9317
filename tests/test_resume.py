"""A sweep killed with SIGKILL loses no finished row, and `kparity check --resume RUN_ID` runs
only what is missing, under the same run id, ending with exactly the rows of an unbroken run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from cases.distributions import DISTRIBUTIONS
from collections import Counter
from pathlib import Path

from results.store import Store
from verbs.cli import main

ROOT = Path(__file__).parents[1]
SELECTION = ["--impl", "torch:rms_norm", "--dtype", "f32,bf16"]


def _keys(rows):
    return Counter((r["impl"], r["case_id"], r["expect"]) for r in rows)


def _journal_lines(store_dir: Path) -> int:
    files = list((store_dir / ".journal" / "correctness").glob("*.jsonl"))
    return sum(f.read_text().count("\n") for f in files)


def test_sigkill_mid_sweep_then_resume(tmp_path, capsys):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "verbs.cli", "--store", str(killed),
                             "check", *SELECTION], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _journal_lines(killed) < 40 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the sweep ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    finished = _journal_lines(killed)  # every row handed to the OS before the kill
    store = Store(killed)
    before = store.read("correctness").to_pylist()
    assert len(before) == finished >= 40  # none lost, none read twice (parts + journal)
    assert max(_keys(before).values()) == 1
    run_id = store.read("runs").column("run_id").to_pylist()[0]

    assert main(["--store", str(whole), "check", *SELECTION]) == 0
    expected = _keys(Store(whole).read("correctness").to_pylist())
    assert len(before) < sum(expected.values())

    capsys.readouterr()
    assert main(["--store", str(killed), "check", "--resume", run_id]) == 0
    out = capsys.readouterr().out
    assert f"resuming run {run_id}: {len(before)} rows kept" in out
    after = Store(killed).read("correctness").to_pylist()
    assert _keys(after) == expected  # every case once, none twice
    assert {r["run_id"] for r in after} == {run_id}
    assert not list((killed / ".journal").rglob("*.jsonl"))  # recovered, then closed cleanly
    assert Store(killed).read("runs").num_rows == 1


def test_resume_rejects_unknown_runs_and_other_filters(tmp_path, capsys):
    store = ["--store", str(tmp_path)]
    assert main([*store, "check", "--impl", "torch:rms_norm", "--preset", "qwen3-0.6b"]) == 0
    run_id = Store(tmp_path).read("runs").column("run_id").to_pylist()[0]
    capsys.readouterr()
    assert main([*store, "check", "--resume", "20990101T000000Z-nope"]) == 2
    assert run_id in capsys.readouterr().out  # the valid check runs are listed
    assert main([*store, "check", "--resume", run_id, "--impl", "torch:rms_norm_llama"]) == 2
    assert "differs from the run's own" in capsys.readouterr().out
    # a finished run resumes to nothing more
    assert main([*store, "check", "--resume", run_id]) == 0
    assert f"{3 * len(DISTRIBUTIONS)} rows kept (0 recovered from its journal), 0 to run" in capsys.readouterr().out
    assert Store(tmp_path).read("correctness").num_rows == 3 * len(DISTRIBUTIONS)


QWEN = ["check", "--impl", "torch:rms_norm", "--preset", "qwen3-0.6b"]


def test_ctrl_c_ends_with_one_line_and_resume_last_runs_the_rest(tmp_path, capsys, monkeypatch):
    """Ctrl-C mid-sweep: exit 130 and one line (rows kept, the run id, the resume command), not a
    traceback; the finished rows are in the store and `--resume last` completes the run."""
    import verbs.check as check

    real, ran = check.run_one, []

    def interrupted_after_5(*args, **kwargs):
        if len(ran) == 5:
            raise KeyboardInterrupt
        ran.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(check, "run_one", interrupted_after_5)
    store = tmp_path / "store"
    try:
        rc = main(["--store", str(store), *QWEN])
    except KeyboardInterrupt:  # escaping main: the traceback a user saw (not pytest's own ^C)
        rc = "KeyboardInterrupt raised"
    assert rc == 130
    rows = Store(store).read("correctness").to_pylist()
    assert len(rows) == 5 and not list((store / ".journal").rglob("*.jsonl"))  # parts, closed
    run_id = rows[0]["run_id"]
    out = capsys.readouterr().out.strip()
    assert "Traceback" not in out and out.splitlines()[-1] == (
        f"interrupted: 5 rows of run {run_id} kept in {store}/; the rest: kparity --store "
        f"{store} check --resume {run_id}")

    monkeypatch.setattr(check, "run_one", real)
    assert main(["--store", str(store), "check", "--resume", "last"]) == 0
    after = Store(store).read("correctness").to_pylist()
    assert len(_keys(after)) == len(after) == 3 * len(DISTRIBUTIONS)
    assert {r["run_id"] for r in after} == {run_id}


def test_maxfail_stops_keeps_the_rows_and_names_the_resume(tmp_path, capsys):
    """`-x` stops at the first failing row (exit 1), keeps what ran, says it stopped early and
    how to run the rest; `--maxfail 0` is bad input."""
    store = tmp_path / "store"
    mutant = ["--plugin", str(ROOT / "tests" / "mutants.py"), "check", "--impl",
              "torch:mutant_drop_eps", "--preset", "qwen3-0.6b", "--show-failures", "0"]
    assert main(["--store", str(store), *mutant, "-x"]) == 1
    rows = Store(store).read("correctness").to_pylist()
    assert [r["status"] for r in rows][-1] == "fail"
    assert [r["status"] for r in rows[:-1]] == ["pass"] * (len(rows) - 1)
    out, total = capsys.readouterr().out, 3 * len(DISTRIBUTIONS)
    assert (f"stopped early: 1 failing row reached --maxfail 1; {total - len(rows)} of {total} "
            f"(impl, case) pairs not run. The rest: kparity --store "
            f"{store} --plugin {ROOT / 'tests' / 'mutants.py'} check --resume "
            f"{rows[0]['run_id']}") in out
    assert main(["--store", str(store), *mutant, "--maxfail", "0"]) == 2
    assert "--maxfail 0: at least 1" in capsys.readouterr().out


# Ctrl-C at a terminal raises KeyboardInterrupt; a process started as a background job inherits
# SIGINT ignored, and then Python installs no handler: the sweep under test gets the terminal's.
LAUNCH = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
          "from verbs.cli import main; sys.exit(main())")
NOISE = ("Traceback", "BrokenPipe", "leaked semaphore", "resource_tracker", "Fatal Python error")


def _start_sweep(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """`check` of SELECTION in a session of its own (a terminal's process group), in isolated
    workers, with a cold oracle cache computed ahead by one pool process; the nightly tier's
    210 cases, so that the sweep is still running when it is stopped (the commit tier's 86 could
    end first on a fast machine: its journal then folds into the store, and no stop is seen)."""
    store = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KPARITY_CACHE": str(tmp_path / "cache"),
           "KPARITY_CACHE_WORKERS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "--store", str(store), "check",
                             *SELECTION, "--tier", "nightly", "--isolate", "case"], cwd=ROOT,
                            env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, store


def _wait_for_rows(proc: subprocess.Popen, store: Path, rows: int) -> None:
    deadline = time.monotonic() + 120
    while _journal_lines(store) < rows and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if proc.poll() is not None:  # what the sweep said, to tell a crash from a fast finish
        out, err = proc.communicate()
        raise AssertionError(f"the sweep ended (exit {proc.returncode}, {_journal_lines(store)} "
                             f"journal rows) before it could be stopped; its last output:\n"
                             f"{out[-1500:]}\n{err[-1500:]}")


def _workers(pid: int) -> list[int]:
    """The spawned children of `pid` (isolation worker, oracle pool), not the resource tracker."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # not a process, or gone meanwhile
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def _one_stop_line(proc: subprocess.Popen, store: Path, how: str) -> str:
    """The run id, once the stopped sweep printed exactly one line of what it kept and how to
    run the rest, and nothing else of its end: no traceback from any of its processes, no
    resource tracker warning."""
    out, err = proc.communicate(timeout=90)
    for noise in NOISE:
        assert noise not in out + err, f"{noise!r} in what the sweep printed:\n{out}\n{err}"
    run_id = Store(store).read("runs").column("run_id").to_pylist()[0]
    kept = [line for line in (out + err).splitlines() if "kept in" in line]
    assert len(kept) == 1 and kept[0].startswith(f"{how}: ") and kept[0].endswith(
        f"rows of run {run_id} kept in {store}/; the rest: kparity --store {store} check "
        f"--resume {run_id}"), out + err
    assert not _workers(proc.pid)
    return run_id


def test_sigterm_after_killed_workers_ends_with_one_line_and_resume_runs_the_rest(tmp_path,
                                                                                  capsys):
    """`kill -9` of the sweep's workers (the isolation worker and the oracle pool's process,
    as `pkill -9 -f spawn_main` would), then SIGTERM: exit 143, one line (rows kept, the resume
    command), no traceback or BrokenPipe from any process, no leaked-semaphore warning; the
    resume runs the rest. Before: the pool's terminate hung on the queue lock its killed process
    held, and SIGTERM killed the sweep outright (BrokenPipe tracebacks from the pool's process,
    the resource tracker's warning, no line)."""
    proc, store = _start_sweep(tmp_path)
    _wait_for_rows(proc, store, 10)
    workers = _workers(proc.pid)
    assert len(workers) == 2, workers  # the isolation worker and the pool's process
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    _wait_for_rows(proc, store, 20)  # a new worker took over; the checks compute the oracles
    proc.send_signal(signal.SIGTERM)
    run_id = _one_stop_line(proc, store, "terminated (SIGTERM)")
    assert proc.returncode == 143
    kept = Store(store).read("correctness").to_pylist()
    # the case its killed worker was running, if it was running one (it may die between two)
    assert {r["status"] for r in kept} <= {"pass", "crash"}

    capsys.readouterr()
    main(["--store", str(store), "check", "--resume", "last"])  # exit 1: that crash row
    after = Store(store).read("correctness").to_pylist()
    assert f"resuming run {run_id}: {len(kept)} rows kept" in capsys.readouterr().out
    assert len(after) > len(kept) and max(_keys(after).values()) == 1
    assert {r["run_id"] for r in after} == {run_id}


def test_ctrl_c_at_a_terminal_ends_the_sweep_with_one_line(tmp_path):
    """Ctrl-C at a terminal reaches the sweep's whole process group, workers included: exit 130
    and one line; the workers leave it to the sweep (no KeyboardInterrupt of theirs)."""
    proc, store = _start_sweep(tmp_path)
    _wait_for_rows(proc, store, 10)
    os.killpg(proc.pid, signal.SIGINT)
    _one_stop_line(proc, store, "interrupted")
    assert proc.returncode == 130
