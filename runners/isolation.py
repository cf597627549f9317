"""Where a case runs: in this process (`--isolate none`) or in worker processes that a hung or
crashed kernel cannot take down with it (`case`, `impl`).

`case_runner(args, work)` yields the function that checks one case where the isolation mode
says, `run(work_item, run_id) -> row`; `serial_rows` runs a sweep's items in order on it (the
serial executor of `runners.sweep.runner_for`).

`case`: one worker process (multiprocessing "spawn": CUDA must never be initialised in a forked
child) runs the cases one at a time and is reused until something goes wrong. It loads the same
plugins as this process, imports the selected backends' frameworks before its first case (not a
case's time), and per case receives (impl id, case JSON, expect, invariant) and answers with
`runners.correctness.check`'s row. `impl`: the same, with a fresh worker for each impl, so no
state (caches, allocator, a half-broken context) leaks from one impl into the next.

What becomes of a case whose worker misbehaves (the worker is replaced each time):
- no answer within the case's timeout (`case_timeout`, or `--case-timeout`): `timeout`, the
  worker is killed (terminate, then kill);
- the worker dies (segfault, abort, `os._exit`, OOM kill): `crash`, with the exit code or
  signal and the tail of the worker's stderr (faulthandler's Python stack for a segfault);
- the row is an `error` whose text is a sticky device error (`STICKY_ERROR`: after an illegal
  address the CUDA context answers every later call with the same error): `crash`.
After a timeout or a crash, the next worker first runs a probe (`_probe`: a small computation on
the device, checked); if it fails the sweep ends with a RuntimeError saying the device is
unusable after that case, the rows so far already handed to the store.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import tempfile
import time
from contextlib import contextmanager

from runners.limits import DeviceUnusable, case_timeout
from runners.threads import SharedSpawnContext, tether_to_parent

MODES = ("auto", "none", "case", "impl")

# A worker imports torch/CuPy/MLX before it is ready; a cold disk can make that slow.
STARTUP_S = 300.0
# The probe's first kernel may be compiled (CuPy's elementwise kernels, cached on disk after).
PROBE_S = 120.0

# Errors after which the CUDA context is unusable: every later call fails the same way, so the
# worker must go (cudaErrorIllegalAddress, LaunchFailure, MisalignedAddress, IllegalInstruction,
# HardwareStackError, Assert, and the driver API's CUDA_ERROR_* names for them).
STICKY_ERROR = re.compile("|".join((
    r"illegal memory access", r"illegal address", r"unspecified launch failure",
    r"misaligned address", r"an illegal instruction", r"hardware stack error",
    r"device-side assert", r"cudaError(IllegalAddress|LaunchFailure|MisalignedAddress|"
    r"IllegalInstruction|HardwareStackError|Assert)",
    r"CUDA_ERROR_(ILLEGAL_ADDRESS|LAUNCH_FAILED|MISALIGNED_ADDRESS|ILLEGAL_INSTRUCTION|"
    r"HARDWARE_STACK_ERROR|ASSERT)")), re.IGNORECASE)


def _backend(name):
    from gpu_impls import backend

    return backend(name)


def isolation_mode(requested: str | None, work) -> str:
    """`auto` (the default): `case` when any selected backend runs on an accelerator, `none`
    for CPU-only runs, which stay fast."""
    if requested and requested != "auto":
        return requested
    return "case" if any(_backend(b).accelerator for b in {w.impl.backend for w in work}) \
        else "none"


def serial_rows(run_case):
    """The serial executor: each item in order, on `run_case`; a `DeviceUnusable` or a
    KeyboardInterrupt propagates at once (every row before it already yielded)."""
    def rows(work, one):
        for w in work:
            yield w, one(w, run_case)
    return rows


@contextmanager
def case_runner(args, work):
    """`run(w, run_id) -> row` where `--isolate` says: in this process (`none`) or in an
    isolated worker (`case`, `impl`)."""
    mode = isolation_mode(getattr(args, "isolate", None), work)
    if mode == "none":
        def run(w, run_id):
            return check_noting_cache(w, _backend(w.impl.backend), run_id)

        yield run
        return
    if mode not in ("case", "impl"):
        raise ValueError(f"--isolate {mode}: expected one of {', '.join(MODES)}")
    runner = IsolatedRunner(plugins=list(getattr(args, "plugin", None) or []),
                            backends=sorted({w.impl.backend for w in work}),
                            fresh_per_impl=mode == "impl",
                            fixed_timeout=getattr(args, "case_timeout", None))
    try:
        yield runner.run
    finally:  # normal exit, an exception, KeyboardInterrupt: no worker outlives the sweep
        runner.close()


# --- the parent's side -------------------------------------------------------------------------

class IsolatedRunner:
    def __init__(self, plugins: list[str], backends: list[str], fresh_per_impl: bool,
                 fixed_timeout: float | None, visible: str | None = None, hold=None,
                 threads: int | None = None):
        self.hold = hold  # a multiprocessing lock the workers hold while they time (bench)
        self.threads = threads  # the workers' BLAS / OpenMP threads (None: inherited)
        self.plugins, self.backends = plugins, backends
        self.fresh_per_impl, self.fixed_timeout = fresh_per_impl, fixed_timeout
        self.visible = visible  # the workers' CUDA_VISIBLE_DEVICES (None: inherited)
        self.suspect = None  # (work, status) whose crash or timeout the next worker must probe
        self.worker = self._new_worker()  # started now: it imports while we set up

    def _new_worker(self) -> "_Worker":
        return _Worker(self.plugins, self.backends, self.visible, self.hold, self.threads)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None

    def _replace(self) -> None:
        self.worker.kill()
        self.worker = self._new_worker()  # imports while the row is written

    def _worker_for(self, w) -> "_Worker":
        if self.worker is None or (self.fresh_per_impl
                                   and self.worker.impl not in (None, w.impl.id)):
            self.close()
            self.worker = self._new_worker()
        self.worker.wait_ready()
        self.worker.impl = w.impl.id
        return self.worker

    def run(self, w, run_id: str) -> dict:
        worker = self._worker_for(w)
        if self.suspect is not None:
            self._probe(worker, run_id)
        shape = (w.impl.id, w.case.dtype, w.case.dim_items)
        timeout = self.fixed_timeout or case_timeout(w.case, shape not in worker.seen)
        worker.seen.add(shape)
        outcome, row, seconds = worker.ask(
            ("check", (w.impl.id, w.case.to_json(), w.expect, w.invariant, run_id)), timeout)
        if outcome == "timeout":
            how = ("set by --case-timeout" if self.fixed_timeout
                   else "derived from the case: runners/limits.py case_timeout")
            row = row_without_result(
                w, run_id, "timeout",
                f"no answer within {timeout:.3g} s (the per-case limit, {how}); the worker was "
                f"killed. If the case is only slow, raise the limit: --case-timeout SECONDS",
                seconds)
        elif outcome == "died":
            row = row_without_result(
                w, run_id, "crash",
                f"the worker died running this case{worker.death()}", seconds)
        elif row["status"] == "error" and STICKY_ERROR.search(row["message"]):
            row["status"] = "crash"
            row["message"] = ("sticky device error (the context is unusable after it; the "
                              "worker was replaced): " + row["message"])
        else:
            return row
        self.suspect = (w, row["status"])
        self._replace()
        return row

    def bench(self, item, run_id: str, settings: dict, timeout: float) -> dict:
        """`runners.bench.bench_one`'s row for `item` = (work, mode), run in the worker
        (`settings`: its keyword arguments, the stopping rule's factory as `new_stop`). A hang or a crash
        is an `error` row, and the worker is replaced (no probe: bench rows have no crash
        status, and the next measurement meets a broken device as its own error)."""
        from runners.bench import bench_base_row

        w, mode = item
        worker = self._worker_for(w)
        outcome, row, seconds = worker.ask(
            ("bench", (w.impl.id, w.case.to_json(), mode, run_id, settings)), timeout)
        if outcome == "answer":
            return row
        row = bench_base_row(w.impl, _backend(w.impl.backend), w.case, mode, run_id)
        row["message"] = (f"no answer within {timeout:.3g} s; the worker was killed"
                          if outcome == "timeout" else
                          f"the worker died measuring this case{worker.death()}")
        row["seconds"] = seconds
        self._replace()
        return row

    def _probe(self, worker: "_Worker", run_id: str) -> None:
        w, status = self.suspect
        worker.conn.send(("probe", w.impl.backend))
        outcome, answer = worker.answer(PROBE_S)
        if outcome == "answer" and answer is None:
            self.suspect = None
            return
        why = {"timeout": f"no answer within {PROBE_S:g} s",
               "died": f"the worker died ({_death(worker.proc.exitcode)})"}.get(outcome, answer)
        raise DeviceUnusable(
            f"device unusable after the {status} of case {w.case.id} ({w.impl.id}, "
            f"{w.case.short()}): a probe on the {w.impl.backend} backend in a fresh worker "
            f"failed: {why}. The rows so far are in the store (run {run_id}); once the device "
            f"works again, `kparity check --resume {run_id}` runs the rest")


def check_noting_cache(w, backend, run_id: str) -> dict:
    """`check`'s row, with the oracle cache's outcome on it under `oracle_cache.CACHE_KEY`
    (not a store column: the sweep counts it and pops it)."""
    from runners import oracle_cache
    from runners.correctness import check

    oracle_cache.take_outcome()
    row = check(w, backend, run_id)
    outcome = oracle_cache.take_outcome()
    if outcome is not None:
        row[oracle_cache.CACHE_KEY] = outcome
    return row


def row_without_result(w, run_id: str, status: str, message: str, seconds: float) -> dict:
    """`check`'s row for `w` with every metric null, our status and message."""
    from runners.rows import base_row

    row = base_row(w, _backend(w.impl.backend).device(), run_id)
    row.update(status=status, message=message, seconds=seconds)
    return row


def _death(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class _Worker:
    """One spawned worker process, the pipe to it, and the file its stdout and stderr go to."""

    def __init__(self, plugins: list[str], backends: list[str], visible: str | None = None,
                 hold=None, threads: int | None = None):
        ctx = SharedSpawnContext(threads)  # numpy and torch count their threads when they load
        fd, self.stderr_path = tempfile.mkstemp(prefix="kparity-worker-", suffix=".log")
        os.close(fd)
        self.conn, child_conn = ctx.Pipe()
        # Not a daemon: an impl may start processes of its own (torch.compile's compile
        # workers); close() and the worker's parent-death signal see that none outlives us.
        self.proc = ctx.Process(target=worker_main, name="kparity-worker",
                                args=(child_conn, plugins, backends, self.stderr_path, visible,
                                      hold))
        self.proc.start()
        child_conn.close()  # ours closed: the worker's death reads as EOF here
        self.ready = False
        self.impl = None  # the impl it has run (`--isolate impl`: its only one)
        self.seen = set()  # (impl, dtype, dims) it has run: compiled already

    def wait_ready(self) -> None:
        if self.ready:
            return
        outcome, answer = self.answer(STARTUP_S)
        if outcome != "answer" or answer[0] != "ready":
            why = (f"not ready within {STARTUP_S:g} s" if outcome == "timeout"
                   else f"died ({_death(self.proc.exitcode)})" if outcome == "died"
                   else answer[-1])
            tail = self.stderr_tail()
            self.kill()
            raise RuntimeError(f"isolation worker could not start: {why}"
                               + (f"; its stderr: {tail}" if tail else ""))
        self.ready = True

    def answer(self, timeout: float) -> tuple[str, object]:
        """("answer", what the worker sent) | ("died", None) | ("timeout", None)."""
        ready = multiprocessing.connection.wait([self.conn, self.proc.sentinel], timeout)
        if self.conn in ready:
            try:
                return "answer", self.conn.recv()
            except EOFError:  # the worker died and closed its end
                pass
        if ready:
            self.proc.join(5)
            return "died", None
        return "timeout", None

    def ask(self, message: tuple, timeout: float) -> tuple[str, object, float]:
        """Send `message`; (`answer`'s outcome, what came back, seconds waited)."""
        t0 = time.perf_counter()
        try:
            self.conn.send(message)
        except BrokenPipeError:
            pass  # it died between cases: answer() says so
        outcome, row = self.answer(timeout)
        return outcome, row, time.perf_counter() - t0

    def death(self) -> str:
        """' (how it died); its stderr: the tail', for a message about a dead worker."""
        tail = self.stderr_tail()
        return f" ({_death(self.proc.exitcode)})" + (f"; its stderr: {tail}" if tail else "")

    def stderr_tail(self, lines: int = 6, chars: int = 600) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.stderr_path) - 65536))  # the dump fits
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        fatal = text.rfind("Fatal Python error")
        if fatal >= 0:  # faulthandler's dump: its first lines are the innermost frames
            kept = [ln.strip() for ln in text[fatal:].splitlines() if ln.strip()][:lines]
            return " / ".join(kept)[:chars]
        kept = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
        return " / ".join(kept)[-chars:]

    def stop(self) -> None:
        """Ask it to exit; kill it if it does not within a second."""
        if self.proc.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.proc.join(1)
        self.kill()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()
        try:
            os.unlink(self.stderr_path)
        except OSError:
            pass


# --- the worker's side -------------------------------------------------------------------------

def worker_main(conn, plugins: list[str], backends: list[str], stderr_path: str,
                visible: str | None = None, hold=None) -> None:
    if visible is not None:  # before any framework starts CUDA, which reads it once
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    _detach_output_and_tether(stderr_path)
    try:
        import gpu_impls

        for module in plugins:
            gpu_impls.load_plugin(module)
        impls = gpu_impls.impls()
        for name in backends:  # import the frameworks now, outside any case's timeout
            gpu_impls.backend(name).available()
    except BaseException as e:  # noqa: BLE001  (the parent reports it)
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    from cases.generate import Work
    from cases.model import Case

    conn.send(("ready",))
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent is gone
            return
        if message is None:
            return
        kind, payload = message
        if kind == "check":
            impl_id, case_json, expect, invariant, run_id = payload
            w = Work(impls[impl_id], Case.from_json(case_json), expect, invariant)
            conn.send(check_noting_cache(w, gpu_impls.backend(w.impl.backend), run_id))
        elif kind == "probe":
            conn.send(_probe(gpu_impls.backend(payload)))
        elif kind == "bench":
            conn.send(_bench(impls, *payload, hold=hold))


def _bench(impls, impl_id: str, case_json: str, mode: str, run_id: str, settings: dict,
           hold=None) -> dict:
    """A worker's `bench_one` row (`IsolatedRunner.bench`; `settings`: its keyword arguments,
    the stopping rule's factory `new_stop` among them)."""
    import gpu_impls
    from cases.model import Case
    from runners.bench import bench_one

    impl = impls[impl_id]
    return bench_one(impl, gpu_impls.backend(impl.backend), Case.from_json(case_json), mode,
                     run_id=run_id, hold=hold, **settings)


def _detach_output_and_tether(stderr_path: str) -> None:
    """stdout and stderr to the worker's file (the parent's progress bar stays intact, the file's
    tail explains a crash); faulthandler prints the Python stack on a segfault; Ctrl-C is the
    parent's to handle (it reaches the whole process group); on Linux the worker dies with its
    parent even when the parent is SIGKILLed mid-case."""
    import faulthandler

    fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # started blocked: threads.py
    tether_to_parent()


def _probe(backend) -> str | None:
    """None when a small computation on the device gives the right answer, else what went wrong:
    1024 floats to the device, x * 2 + 1 there (a kernel launch on CuPy, torch and MLX alike),
    back, compared exactly."""
    import numpy as np

    x = np.arange(1024, dtype=np.float32)
    try:
        got = backend.to_host(backend.to_device(x) * 2 + 1, "f32")
        backend.synchronize()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    if not np.array_equal(got, x * 2 + 1):
        return "wrong values from x * 2 + 1"
    return None
