"""`--devices all|0,1,...`: one sweep over several GPUs of one host.

One isolated worker per device (`runners/isolation.py`'s `IsolatedRunner`), pinned by
CUDA_VISIBLE_DEVICES set in the worker before any framework starts CUDA; one thread per device
pulls small batches of work (`Batches`), so a device that meets slow cases takes fewer batches
and none sits idle while work is left. A device keeps to one impl's batches while it has them
(an impl's set-up, its module's build or load, a JIT's compile or autotuning, torch.compile per
shape, is paid in each worker that runs it: dealt round-robin, every worker would pay for every
impl), and takes from another device's impl only when no impl is left unstarted. The threads hand rows back; the sweep's thread
writes them (one writer). Every row carries its device's index (`device_index`, the position
in `--devices all`'s list, or the index given).

What each guarantee of one device becomes:
- a hang or a crash on a device replaces that device's worker only (`IsolatedRunner`);
- a device found unusable after one (its probe fails) stops that device's thread: its batch
  goes back to the queue for the other devices, and the sweep says so; the sweep stops with
  `DeviceUnusable` only when no device is left;
- `--resume` skips what has rows, whichever device wrote them: a resumed run may use other
  devices, or none;
- Ctrl-C: the rows the devices finished are handed back (and written), the workers killed; a
  row that finished while the sweep was writing another may be left out, and `--resume` runs
  it again (nothing is written twice).

`--devices all`: the GPUs visible here, counted without starting CUDA in this process
(CUDA_VISIBLE_DEVICES when set, else `nvidia-smi -L`). On a CPU-only selection the indices are
stand-ins (CI tests the dealer so): the workers get CUDA_VISIBLE_DEVICES all the same.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import tempfile
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Callable, Hashable, NamedTuple

from runners.isolation import IsolatedRunner, isolation_mode
from runners.limits import BadInput, DeviceUnusable
from runners.threads import share

# Items a device takes at a time: few, so that one slow batch does not hold much work back.
BATCH = 4
# Seconds the sweep waits for the device threads to stop once it ends.
STOP_S = 30.0


class Device(NamedTuple):
    index: int     # what the rows carry: the position in `--devices`' list of visible devices
    visible: str   # the worker's CUDA_VISIBLE_DEVICES


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries, without starting CUDA:
    CUDA_VISIBLE_DEVICES's own entries when it is set, else the indices `nvidia-smi -L` lists;
    [] when neither names one."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [m.group(1) for m in re.finditer(r"^GPU (\d+):", out.stdout, re.MULTILINE)]


def parse_devices(text: str, accelerated: bool) -> list[Device]:
    """`--devices all|0,1,...` as the devices to deal to. `accelerated`: some selected backend
    runs on the GPU, so each index must name a visible GPU; otherwise indices are stand-ins."""
    visible = visible_gpus()
    where = ("CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in os.environ
             else "nvidia-smi -L")
    if text.strip() == "all":
        if not visible:
            raise BadInput(f"--devices all: no GPU visible here ({where} names none)\n  "
                               "name the devices instead, e.g. --devices 0,1 (stand-ins on a "
                               "CPU-only selection), or leave --devices out")
        return [Device(i, v) for i, v in enumerate(visible)]
    parts = [p.strip() for p in text.split(",")]
    for p in parts:
        if not p.isdigit():
            raise BadInput(f"--devices {text}: {p!r} is not a device index; give 'all' or "
                               "indices, e.g. --devices 0,1")
    indices = [int(p) for p in parts]
    for i in indices:
        if indices.count(i) > 1:
            raise BadInput(f"--devices {text}: device {i} twice; name each device once, "
                               "e.g. --devices 0,1")
    if accelerated:
        for i in indices:
            if i >= len(visible):
                raise BadInput(
                    f"--devices {text}: no device {i} here ({len(visible)} visible by {where}"
                    + (f": indices 0 to {len(visible) - 1}" if visible else "")
                    + "); --devices all takes every visible one")
    return [Device(i, visible[i] if i < len(visible) else str(i)) for i in indices]


def seconds_by_device(rows: list[dict]) -> list[tuple[int | None, list[float]]]:
    """The rows' `seconds` (each timed inside its worker) by `device_index`, devices in order,
    the rows of no device (a plain sweep's) last: how busy each device's worker was."""
    by: dict[int | None, list[float]] = {}
    for r in rows:
        by.setdefault(r.get("device_index"), []).append(r.get("seconds") or 0.0)
    return sorted(by.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))


def batch_size(items: int, devices: int) -> int:
    """BATCH, but small enough that every device gets a couple of batches."""
    return max(1, min(BATCH, items // (2 * devices)))


@contextmanager
def device_rows(args, work, say=lambda text, **_: print(text)):
    """`runner_for`'s executor for `--devices` (`args.devices`: parsed by the verb, a list of
    `Device`): yields the dealer's `rows(work, one)`; on exit every device's worker is gone.
    `say`: how its lines are printed (the sweep's console)."""
    mode = isolation_mode(getattr(args, "isolate", None), work)
    with _dealt(args, {w.impl.backend for w in work}, len(work), say, "(impl, case) pairs",
                fresh_per_impl=mode == "impl",
                fixed_timeout=getattr(args, "case_timeout", None)) as rows:
        yield rows


@contextmanager
def bench_rows(args, items, say):
    """`bench --devices`' executor: yields `rows(items, one)` over (work, mode) items, `one`
    given the device runner's `bench(item, run_id, settings, timeout)`. Unless
    `--concurrent-timing`, one lock (`HostLock`, shared by every worker) is held
    around each measurement: the devices verify in parallel and time one at a time."""
    with tempfile.TemporaryDirectory(prefix="kparity-timing-") as lock_dir:
        hold = None if args.concurrent_timing else HostLock(os.path.join(lock_dir, "lock"))
        timing = ("timing on every device at once (--concurrent-timing): GPUs of one host share "
                  "power and PCIe, so a time may differ from one measured alone" if hold is None
                  else "timing one device at a time (GPUs of one host share power and PCIe): "
                  "--concurrent-timing to overlap")
        with _dealt(args, {w.impl.backend for w, _ in items}, len(items), say, "measurements",
                    method="bench", hold=hold, note=timing) as rows:
            yield rows


@contextmanager
def _dealt(args, backends, items: int, say, what: str, method: str = "run",
           fresh_per_impl: bool = False, fixed_timeout=None, hold=None, note: str = ""):
    """The dealer of `items` over `args.devices`, one `_DeviceRunner` each (its `method` runs an
    item), said in a line; stopped (every worker gone) on exit. A checking worker starts with
    its share of the host's BLAS / OpenMP threads (`runners/threads.py`); a timing one with
    what a plain `bench` has, so that CPU timings stay comparable (they run one at a time)."""
    devices = args.devices
    dealer = Dealer(devices, lambda halt, device: _DeviceRunner(
        halt, plugins=list(getattr(args, "plugin", None) or []), backends=sorted(backends),
        fresh_per_impl=fresh_per_impl, fixed_timeout=fixed_timeout, visible=device.visible,
        hold=hold, threads=share(len(devices)) if method == "run" else None),
        batch_size(items, len(devices)), say=say, method=method,
        group=lambda item: (item[0] if method == "bench" else item).impl.id)
    say(f"dealing {items} {what} to {len(devices)} devices "
        f"({', '.join(str(d.index) for d in devices)}), one isolated worker each, in batches "
        f"of {dealer.batch}" + (f"; {note}" if note else ""), soft_wrap=True)
    try:
        yield dealer.rows
    finally:
        dealer.stop()


class HostLock:
    """The timing lock of `bench --devices`: an exclusive `flock` on a file, taken in a worker
    around each measurement. The kernel releases it when its holder dies, so a worker killed
    mid-measurement (a hang past its limit, a crash) does not stall every other device; a
    multiprocessing.Lock held by a killed process stays held. Picklable: the workers open the
    file themselves."""

    def __init__(self, path: str):
        self.path, self.fd = path, None

    def __getstate__(self):
        return {"path": self.path, "fd": None}

    def __enter__(self):
        import fcntl

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # closing the last descriptor releases the lock
        self.fd = None


class _DeviceRunner(IsolatedRunner):
    """An `IsolatedRunner` of one device whose worker the sweep may kill when it stops
    (`interrupt`): no new worker replaces one after that."""

    def __init__(self, halt: threading.Event, **kwargs):
        self.halt = halt
        super().__init__(**kwargs)

    def _replace(self) -> None:
        if self.halt.is_set():  # the sweep killed it: the "crash" is ours, and no case is left
            self.close()
            return
        super()._replace()

    def interrupt(self) -> None:
        """From the sweep's thread: kill the worker, so that a thread waiting on it returns."""
        worker = self.worker
        if worker is not None and worker.proc.is_alive():
            worker.proc.kill()


class Batches:
    """A work list's batches by group (an impl's items), dealt with affinity: `take(held)`
    gives the next batch of the group the device holds; a device whose group is done starts
    the first group (in the work's order) no device has started, and when none is left takes
    the last batch of the group with the most batches left (work stealing), from then on from
    that group's end while the group's first device goes on from its front. Thread-safe."""

    def __init__(self, work: list, batch: int, group: Callable[[object], Hashable]):
        self.lock = threading.Lock()
        self.groups: dict[Hashable, deque] = {}
        for item in work:
            batches = self.groups.setdefault(group(item), deque())
            if not batches or len(batches[-1]) == batch:
                batches.append([])
            batches[-1].append(item)
        self.unstarted = deque(self.groups)

    def take(self, held: tuple | None) -> tuple[tuple, list] | None:
        """(held, batch): `held` = (group, from its end?), what the device holds next time;
        None when no batch is left now (a device may still hand one back)."""
        with self.lock:
            if held is not None and self.groups[held[0]]:
                key, from_end = held
            elif self.unstarted:
                key, from_end = self.unstarted.popleft(), False
            else:
                key = max(self.groups, key=lambda k: len(self.groups[k]))
                if not self.groups[key]:
                    return None
                from_end = True
            batches = self.groups[key]
            return (key, from_end), (batches.pop() if from_end else batches.popleft())

    def hand_back(self, held: tuple, batch: list) -> None:
        """A batch a device could not run (its items did not start): first in its group."""
        with self.lock:
            self.groups[held[0]].appendleft(batch)


class Dealer:
    """Deals a work list in batches (`Batches`) to one thread per device; `rows(work, one)`
    yields (item, row) as the rows complete, each tagged with its device (`runner_for`'s
    executor).

    `open_runner(halt, device)` makes a device's runner (`run(w, run_id) -> row`, `close()`,
    `interrupt()`), in the device's thread: on Linux a worker dies with the thread that started
    it, so none outlives its thread. `group(item)`: the items a device keeps together (an
    impl's); one group when not given."""

    def __init__(self, devices: list[Device], open_runner, batch: int,
                 say=lambda text, **_: print(text), method: str = "run",
                 group: Callable[[object], Hashable] = lambda item: None):
        self.devices, self.open_runner, self.batch, self.say = devices, open_runner, batch, say
        self.method = method  # the runner's method handed to `one`: run (check), bench
        self.group = group
        self.batches: Batches | None = None
        self.results: queue.Queue = queue.Queue()  # ("row" | "unusable" | "error", device, x)
        self.halt = threading.Event()
        self.runners: dict[int, object] = {}
        self.threads: list[threading.Thread] = []

    def rows(self, work, one):
        if not work:  # nothing to deal (a resumed run with nothing left): no worker starts
            return
        self.batches = Batches(list(work), self.batch, self.group)
        for device in self.devices:
            thread = threading.Thread(target=self._serve, args=(device, one), daemon=True,
                                      name=f"kparity-device-{device.index}")
            thread.start()
            self.threads.append(thread)
        left, alive = len(work), {d.index for d in self.devices}
        try:
            while left:
                kind, device, payload = self._next()
                if kind == "row":
                    left -= 1
                    yield payload
                elif kind == "unusable":
                    alive.discard(device.index)
                    if not alive:
                        raise payload
                    self.say(f"[yellow]device {device.index} stopped[/]: {payload}. Its cases "
                             f"go to the other devices ({', '.join(map(str, sorted(alive)))})",
                             soft_wrap=True)
                else:
                    raise payload
        except KeyboardInterrupt:  # hand back what the devices finished, then stop
            self.halt.set()
            while True:
                try:
                    kind, _, payload = self.results.get_nowait()
                except queue.Empty:
                    break
                if kind == "row":
                    yield payload
            raise

    def _next(self):
        """The next message of a device thread (a short wait at a time: Ctrl-C gets through)."""
        while True:
            try:
                return self.results.get(timeout=0.2)
            except queue.Empty:
                if not any(t.is_alive() for t in self.threads) and self.results.empty():
                    raise RuntimeError("every device thread ended with work left (a bug)")

    def _serve(self, device: Device, one) -> None:
        runner = None
        try:
            runner = self.open_runner(self.halt, device)
            self.runners[device.index] = runner
            held = None
            while not self.halt.is_set():
                taken = self.batches.take(held)
                if taken is None:
                    self.halt.wait(0.1)  # another device may still hand a batch back
                    continue
                held, batch = taken
                for k, w in enumerate(batch):
                    if self.halt.is_set():
                        return
                    try:
                        row = one(w, getattr(runner, self.method))
                    except DeviceUnusable as e:  # the probe before `w`: `w` did not run
                        self.batches.hand_back(held, batch[k:])
                        self.results.put(("unusable", device, e))
                        return
                    if self.halt.is_set():  # a row after the halt may be from its kill
                        return
                    row["device_index"] = device.index
                    self.results.put(("row", device, (w, row)))
        except BaseException as e:  # noqa: BLE001  (the sweep's thread raises it)
            if not self.halt.is_set():
                self.results.put(("error", device, e))
        finally:
            if runner is not None:
                runner.close()

    def stop(self) -> None:
        """Halt the device threads, kill their workers, and wait for the threads (each closes
        its runner on the way out)."""
        self.halt.set()
        deadline = time.monotonic() + STOP_S
        for thread in self.threads:
            thread.join(0.5)  # an idle thread ends at once, closing its worker gently
            while thread.is_alive() and time.monotonic() < deadline:
                for runner in list(self.runners.values()):
                    runner.interrupt()  # a thread waiting on a case: its worker dies
                thread.join(0.2)


def xdist_gpu(worker: str | None, visible: list[str]) -> str | None:
    """The GPU a pytest-xdist worker (`PYTEST_XDIST_WORKER`, gwN) takes: entry N % G of the G
    visible GPUs, so `pytest -m gpu -n auto` spreads the gate over them; None outside xdist or
    without a GPU."""
    if not worker or not visible or not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    return visible[int(worker[2:]) % len(visible)]
