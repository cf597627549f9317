"""Compile every listed CUDA kernel instance ahead of a run, on every core:

    python -m gpu_impls.cuda.prebuild [--jobs N]

Fills CuPy's disk cache with the batch modules `_module.module` loads (`_module.batches`: up to
BATCH listed instances of one file and dtype per NVRTC run), largest batches first. A process
that needs a module while this one compiles it waits on the module's lock and then loads it
(`_module._compile_lock`), so a run started beside the prebuild never compiles a module twice.
`pytest -m gpu` starts it in the background (tests/conftest.py, `start_prebuild`): a cold gate's
workers used to compile instance by instance, each file parsed once per instance, while they
also imported and collected; mutants (their defines) still compile at first use.

Needs CuPy and a GPU (CuPy loads what it compiles). Exit status 0 when every module built; 1
with the failures named (the gate then meets the same compile error in the test that needs it).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from gpu_impls.cuda._module import TRAIT, batch_module, batches


def jobs() -> list[tuple[str, tuple[str, ...]]]:
    """(source file, batch) for every batch of every listed file and dtype, largest first."""
    from gpu_impls.cuda.listed import listed_kernels

    todo = [(source, batch) for source in listed_kernels() for dtype in TRAIT
            for batch in batches(source, dtype)]
    return sorted(todo, key=lambda job: -len(job[1]))


def start_background(cwd: str) -> subprocess.Popen:
    """This module's main in the background, in its own process group (its pool's processes
    with it: `stop` ends them all, the main gone or not); its summary goes to stderr."""
    return subprocess.Popen([sys.executable, "-m", "gpu_impls.cuda.prebuild"], cwd=cwd,
                            stdout=subprocess.DEVNULL, start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    """End a background prebuild and every process of its group, now. Its pool's processes
    hold the stderr it inherited: left running after their parent ended, they kept a caller's
    pipe open (`pytest ... | tail` waited for them: a gate call that never returned)."""
    if process.poll() is None or _group_alive(process.pid):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies aside: a container's PID 1 may
    never reap the orphans it inherits)."""
    proc = "/proc"
    if not os.path.isdir(proc):
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command's name
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            return True
    return False


def build(source: str, batch: tuple[str, ...]) -> float:
    start = time.perf_counter()
    batch_module(source, batch)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_impls.cuda.prebuild",
                                     description=__doc__.split("\n\n")[0])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parser.add_argument("--jobs", type=int, default=max(1, (cores or 1) - 1),
                        help="processes compiling at once (default: the cores but one)")
    args = parser.parse_args(argv)
    todo = jobs()
    start, failed, busy = time.perf_counter(), [], 0.0
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        futures = {pool.submit(build, source, batch): (source, batch) for source, batch in todo}
        for future in as_completed(futures):
            source, batch = futures[future]
            try:
                busy += future.result()
            except Exception as e:  # noqa: BLE001  (named below; the gate meets it too)
                failed.append(f"{source} ({batch[0]}, ...): {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}")
    instances = sum(len(batch) for _, batch in todo)
    print(f"prebuild: {len(todo) - len(failed)} of {len(todo)} modules ({instances} instances) "
          f"in {time.perf_counter() - start:.1f} s over {args.jobs} processes "
          f"({busy:.1f} s of compiling)", file=sys.stderr)
    for line in failed:
        print(f"prebuild: failed {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
