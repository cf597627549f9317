"""The CPU threads of the processes a sweep spawns.

numpy's BLAS and torch's OpenMP each start one thread per core, counted when they load, from the
environment (THREAD_VARS); torch.compile's Inductor starts as many compile workers (at most 32)
at its first compile. Several such processes on one host put several times as many threads
as cores on it, and their spinning threads slow one another: on a 32-core host two `--devices`
workers ran each row 1.6x slower than one worker alone, and 31 oracle-pool processes with 32
BLAS threads each slowed a one-GPU sweep 1.4x. So a process spawned as one of N gets the
environment `cores // N` threads (at least one; fewer where the user set fewer) while it starts;
this process keeps its own.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import signal
import sys
import threading
from contextlib import contextmanager

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS")

# Inductor's own default is min(32, cores): a share never raises it past that.
CAPS = {"TORCHINDUCTOR_COMPILE_THREADS": 32}

# The environment is the process's, and --devices starts workers from one thread per device:
# one spawn at a time, or one thread would restore what another's child is still reading.
_SPAWNING = threading.Lock()


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def share(processes: int) -> int:
    """Threads for each of `processes` processes that share this host's cores."""
    return max(1, cores() // max(processes, 1))


def limited(threads: int) -> dict[str, str]:
    """THREAD_VARS set to `threads` (at most a variable's cap, CAPS), or to fewer where this
    environment already asks for fewer (a count set by hand)."""
    out = {}
    for var in THREAD_VARS:
        given = os.environ.get(var, "").strip()
        ours = min(threads, CAPS.get(var, threads))
        out[var] = str(min(ours, int(given)) if given.isdigit() and int(given) > 0 else ours)
    return out


@contextmanager
def spawning_with(threads: int | None):
    """Processes spawned inside start with `threads` BLAS / OpenMP threads; None: inherited."""
    if threads is None:
        yield
        return
    with _SPAWNING:
        saved = {var: os.environ.get(var) for var in THREAD_VARS}
        os.environ.update(limited(threads))
        try:
            yield
        finally:
            for var, value in saved.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value


@contextmanager
def ctrl_c_blocked():
    """SIGINT blocked in this thread meanwhile, so a process spawned inside starts with it
    blocked (a signal mask survives fork and exec): a Ctrl-C pressed while it imports, before
    its own code can ignore it, reaches the whole process group but raises no
    KeyboardInterrupt (and traceback) there. The worker then ignores SIGINT and unblocks it
    (`runners/isolation.py`, `runners/oracle_cache.py`); here a Ctrl-C pressed meanwhile waits
    the few milliseconds of the spawn, then arrives."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows
        yield
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # the first spawn starts it, which unblocks SIGINT after
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def tether_to_parent() -> None:
    """In a spawned worker: on Linux, die (SIGKILL) with the parent, even a parent SIGKILLed
    mid-sweep, rather than live on writing to its closed pipes. Linux counts the thread that
    started the worker as its parent: a worker started from a thread dies with that thread."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class _SharedProcess(multiprocessing.context.SpawnProcess):
    """A spawned process that starts with `threads` threads (None: inherited) whenever it
    starts, and with Ctrl-C blocked (`ctrl_c_blocked`) (module level: the child unpickles
    it)."""

    threads: int | None = None

    def start(self) -> None:
        with spawning_with(self.threads), ctrl_c_blocked():
            super().start()


class SharedSpawnContext(multiprocessing.context.SpawnContext):
    """multiprocessing's spawn context whose processes each start with `threads` threads (None:
    inherited), the one way kparity spawns: an isolation worker (`runners/isolation.py`, from a
    device's thread under --devices), and the oracle pool (`ProcessPoolExecutor(...,
    mp_context=SharedSpawnContext(n))`), which starts its processes as tasks come."""

    def __init__(self, threads: int | None):
        super().__init__()
        self.threads = threads

    def Process(self, *args, **kwargs) -> _SharedProcess:  # noqa: N802  (multiprocessing's name)
        process = _SharedProcess(*args, **kwargs)
        process.threads = self.threads
        return process
