"""The gate's background prebuild (gpu_impls/cuda/prebuild.py) ends with its whole process
group: its pool's processes inherited the caller's stderr, and left alive after the prebuild's
main process they kept a `pytest ... | tail` pipe open: a gate call on an H100 that never
returned (2026-12-07). No GPU needed: a stand-in process with a child of its own."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gpu_impls.cuda.prebuild import _group_alive, stop

PARENT = ("import subprocess, sys, time; "
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
          "time.sleep(120)")


def _started() -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", PARENT], start_new_session=True)
    time.sleep(0.5)  # its child started
    return process


def test_stop_ends_the_prebuild_and_its_children():
    process = _started()
    assert _group_alive(process.pid)
    stop(process)
    time.sleep(0.2)
    assert not _group_alive(process.pid)


def test_stop_after_the_main_process_ended_still_ends_its_children():
    process = _started()
    process.terminate()  # the main process gone, its child (a pool process) not
    process.wait()
    assert _group_alive(process.pid)
    stop(process)
    time.sleep(0.2)
    assert not _group_alive(process.pid)


def test_a_piped_caller_returns_once_the_prebuild_is_stopped(tmp_path):
    """The hang itself: a caller piping its output through `cat` returns within seconds."""
    script = tmp_path / "caller.py"
    script.write_text("import subprocess, sys, time\n"
                      "from gpu_impls.cuda.prebuild import stop\n"
                      f"p = subprocess.Popen([sys.executable, '-c', {PARENT!r}], "
                      "start_new_session=True)\n"
                      "time.sleep(0.5)\n"
                      "stop(p)\n")
    started = time.monotonic()
    subprocess.run(f"{sys.executable} {script} 2>&1 | cat", shell=True, timeout=60, check=True,
                   cwd=Path(__file__).resolve().parent.parent)
    assert time.monotonic() - started < 30
