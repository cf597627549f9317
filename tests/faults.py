"""Test-only faulty impls for process isolation: each is torch:rms_norm, except on one bf16 case
(picked by its distribution, so the rest of a sweep passes) where it misbehaves as a broken GPU
kernel would. Loaded as a plugin (`kparity --plugin tests/faults.py check --impl torch:fault_hang
--isolate case`), never registered by default. Only ever run them isolated: `fault_hang` hangs
the process that runs it forever, `fault_segv` kills it.

| impl               | on the bf16 case of dist   | does                                         |
|--------------------|----------------------------|----------------------------------------------|
| torch:fault_hang   | tiny                       | loops forever (a kernel that never returns)  |
| torch:fault_segv   | zero_rows                  | SIGSEGV to its own process                   |
| torch:fault_sticky | outlier_rows               | raises CUDA's illegal-address error text     |
| torch:fault_brick  | tiny                       | SIGSEGV, leaving the "device" unusable: a    |
|                    |                            | worker that loads this plugin afterwards has |
|                    |                            | a torch backend whose to_device raises       |
| torch:fault_none   | (none)                     | torch:rms_norm, renamed                      |
| torch:fault_pinned | every case                 | raises where CUDA_VISIBLE_DEVICES is 1 (the  |
|                    |                            | second `--devices` stand-in): shows the pin  |

`fault_hang` creates the file `$KPARITY_FAULT_HANG_MARK` (when set) as it starts hanging.
`fault_brick` marks the device broken by creating the file `$KPARITY_FAULT_BRICK_MARK` (unset:
it only crashes); only isolation workers read the mark, never the process that runs the sweep.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

from gpu_impls import impls, register
from gpu_impls.impl import Impl

BASE = impls()["torch:rms_norm"]
FAULTY_DIST = {"fault_hang": "tiny", "fault_segv": "zero_rows", "fault_sticky": "outlier_rows",
               "fault_brick": "tiny"}
BRICK_MARK = os.environ.get("KPARITY_FAULT_BRICK_MARK", "")
HANG_MARK = os.environ.get("KPARITY_FAULT_HANG_MARK", "")


def hang(case):
    if HANG_MARK:  # tells a test the hang has begun (test_isolation's Ctrl-C)
        Path(HANG_MARK).touch()
    while True:
        time.sleep(0.05)


def segv(case):
    os.kill(os.getpid(), signal.SIGSEGV)


def sticky(case):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def brick(case):
    if BRICK_MARK:
        Path(BRICK_MARK).touch()
    segv(case)


FAULTS = {"fault_hang": hang, "fault_segv": segv, "fault_sticky": sticky, "fault_brick": brick}


def faulty(name: str, fault):
    def run(launch, inputs, outputs, case):
        if case.dtype == "bf16" and case.dist == FAULTY_DIST[name]:
            fault(case)
        return BASE.run(launch, inputs, outputs, case)
    return Impl(BASE.op, BASE.backend, name, run, BASE.contract,
                doc=f"{BASE.id}, but {fault.__name__} on bf16 {FAULTY_DIST[name]}")


def pinned(launch, inputs, outputs, case):
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "1":
        raise RuntimeError("fault_pinned runs where CUDA_VISIBLE_DEVICES=1")
    return BASE.run(launch, inputs, outputs, case)


FAULT_IMPLS = (*(faulty(name, fault) for name, fault in FAULTS.items()),
               Impl(BASE.op, BASE.backend, "fault_none", BASE.run, BASE.contract,
                    doc=f"{BASE.id}, renamed: the control"),
               Impl(BASE.op, BASE.backend, "fault_pinned", pinned, BASE.contract,
                    doc=f"{BASE.id}, but an error where CUDA_VISIBLE_DEVICES=1"))


def _device_lost(self, array):
    raise RuntimeError("CUDA error: no CUDA-capable device is detected")


# the name runners/isolation.py gives its workers: the sweep's own process is never touched
if BRICK_MARK and Path(BRICK_MARK).exists() \
        and multiprocessing.current_process().name == "kparity-worker":
    from gpu_impls.torch.backend import TorchBackend

    TorchBackend.to_device = _device_lost

_existing = impls()
register(*(i for i in FAULT_IMPLS if i.id not in _existing))


# --- repeats (`kparity check --repeat N`) ------------------------------------------------------
# torch:fault_jitter{,_declared}: torch:rms_norm whose exact zeros come out as -0.0 on every
# second call: the same values, other bits (a race that passes the oracle every time); only the
# second declares determinism. torch:fault_nan_once: NaN in its second call of each case only.

def _jitter(launch, inputs, outputs, case):
    import torch

    out = BASE.run(launch, inputs, outputs, case)
    _calls[("jitter", case.id)] = _calls.get(("jitter", case.id), 0) + 1
    if _calls[("jitter", case.id)] % 2 == 0:
        out = {k: torch.where(v == 0, -v.abs(), v) for k, v in out.items()}
    return out


_calls: dict = {}


def _nan_once(launch, inputs, outputs, case):
    out = BASE.run(launch, inputs, outputs, case)
    _calls[("nan", case.id)] = _calls.get(("nan", case.id), 0) + 1
    if _calls[("nan", case.id)] == 2:
        out = {k: v * float("nan") for k, v in out.items()}
    return out


for _name, _run, _det in (("fault_jitter", _jitter, False),
                          ("fault_jitter_declared", _jitter, True),
                          ("fault_nan_once", _nan_once, True)):
    if f"torch:{_name}" not in impls():
        register(Impl(BASE.op, "torch", _name, _run, BASE.contract,
                      doc=f"test-only: {_name}", deterministic=_det))


# --- output defects (guard regions and poison) -------------------------------------------------
# torch:fault_oob_write: torch:rms_norm written in place, plus one element one past the end of
# its output (bf16 constant_rows only), as a kernel whose last block misses its bounds check.
# torch:fault_unwritten_last: every element but the last written (bf16 constant_rows only);
# torch:fault_unwritten_view: the same, returning a view of the output it was given.

def _in_place(launch, inputs, outputs, case):
    """torch:rms_norm's result copied into the runner's (poisoned, guarded) output."""
    for name, value in BASE.run(launch, inputs, None, case).items():
        outputs[name].copy_(value)


def _oob_write(launch, inputs, outputs, case):
    _in_place(launch, inputs, outputs, case)
    if case.dtype == "bf16" and case.dist == "constant_rows":
        out = outputs["out"]
        # the storage around a view is reachable, as device memory is to a kernel
        past = out.as_strided((out.numel() + 1,), (1,), out.storage_offset())
        past[out.numel()] = 1.0


def _unwritten_last(launch, inputs, outputs, case):
    if case.dtype == "bf16" and case.dist == "constant_rows":
        out = BASE.run(launch, inputs, None, case)["out"].reshape(-1)
        outputs["out"].view(-1)[:-1].copy_(out[:-1])
        return None
    _in_place(launch, inputs, outputs, case)


def _unwritten_view(launch, inputs, outputs, case):
    """fault_unwritten_last, returning a view of its output: still the runner's memory."""
    _unwritten_last(launch, inputs, outputs, case)
    return {"out": outputs["out"].view(-1).view(outputs["out"].shape)}


for _name, _run in (("fault_oob_write", _oob_write), ("fault_unwritten_last", _unwritten_last),
                    ("fault_in_place", _in_place), ("fault_unwritten_view", _unwritten_view)):
    if f"torch:{_name}" not in impls():
        register(Impl(BASE.op, "torch", _name, _run, BASE.contract, doc=f"test-only: {_name}"))


# --- `bench --devices`: each measurement in a worker logged ------------------------------------
# With $KPARITY_FAULT_MEASURE_LOG set, an isolation worker appends "start end pid" (wall clock)
# to that file for each `measure` it runs: a test sees whether two devices' measurements overlap.
MEASURE_LOG = os.environ.get("KPARITY_FAULT_MEASURE_LOG", "")
if MEASURE_LOG and multiprocessing.current_process().name == "kparity-worker":
    import runners.bench as _bench

    _measure = _bench.measure

    def _logged_measure(*args, **kwargs):
        start = time.time()
        try:
            return _measure(*args, **kwargs)
        finally:
            with open(MEASURE_LOG, "a", encoding="utf-8") as f:
                f.write(f"{start} {time.time()} {os.getpid()}\n")

    _bench.measure = _logged_measure
