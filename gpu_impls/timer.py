"""Timers: the device-side clock of a backend, and the primitives the timing modes are built from.

A `Timer` knows how to run a list of calls as one unit (`sequence`: a CUDA graph on a GPU, a
plain loop elsewhere), how long a unit took on the device (`elapsed`), how to evict the cache
(`flush`), the device's clocks while it runs, and its ceilings (a large copy, a large GEMM).
The modes themselves (`runners/timing.py`) are written once against this interface:

    mode        timer          one sample
    chain       cuda_events    primary: a graph of R calls over rotating input sets, each call
                               preceded by `predecessor` (an ordinary kernel rewriting that
                               set's chain input, as the op before it in a decode step would),
                               replayed, minus the replay of the predecessors alone; / R
    graph_rot   cuda_events    a graph of R back-to-back calls of the impl itself over rotating
                               input sets, replayed; time / R (a programmatic dependent launch
                               overlaps its own previous call here: its best case)
    cold        cuda_events    flush the L2, then one call between events
    eager       cuda_events    one call between events, back to back: API-level (launch gaps)
    wall        host_wall      R calls over rotating input sets on a synchronous CPU backend
    wall_eval   host_wall      R >= 64 calls queued, then one `mx.eval` (MLX exposes no
                               device timer: the per-eval sync is amortised over R)
    metal_ts    metal_gpu_...  R >= 64 PyObjC-dispatched calls over rotating sets, each one
                               command buffer; sum of GPUEndTime - GPUStartTime / R (macOS)

`HostTimer` is the CPU backends' timer (torch on CPU); CUDA and MLX timers live next to their
backends (`gpu_impls/<backend>/_timer.py`).
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np


def _cpu_cache_bytes() -> int:
    """The largest CPU cache (L3 where there is one), from sysfs; 32 MiB if unreadable."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes, default=32 << 20)


class Timer:
    kind = "host_wall"          # cuda_events | host_wall
    modes: tuple[str, ...] = ("wall",)  # the first is the primary mode
    min_calls = 50              # calls per sample in rotating modes (graph_rot: >= 50)
    # Rotating sets at most: a host sample runs every set once, so 4x a 32 MiB L3 over a 16 KiB
    # decode case (8192 sets) would make one sample last a second; small host cases therefore
    # run partly cache-resident (the row records n_sets). GPU timers replay a graph: no cap.
    max_sets = 1024

    def cache_bytes(self) -> int:
        """The cache that rotating input sets must overflow (x4)."""
        return _cpu_cache_bytes()

    def memory_budget(self) -> int:
        """Bytes the rotating input sets may take."""
        return 1 << 30

    def stream(self):
        """Context manager under which calls run on the timed stream."""
        return nullcontext()

    def sequence(self, calls: list, capture: bool = True):
        """A callable that runs `calls` in order, once, synchronously for host timers. GPU
        timers capture the calls in a graph; `capture=False`: a plain loop enqueuing them."""
        def run():
            for call in calls:
                call()
        return run

    def predecessor(self, array):
        """`chain` mode: a zero-argument call that queues one ordinary (non-PDL) kernel rewriting
        `array` (a device input of this timer's backend) with the values it already holds, so
        the call after it waits for a kernel that wrote its input and computes the same result.
        Timers without `chain` have none."""
        raise NotImplementedError(f"{type(self).__name__} has no chain predecessor: mode chain "
                                  f"is not among its modes ({', '.join(self.modes)})")

    def elapsed(self, fn) -> float:
        """Seconds `fn` took; host wall clock (the backends using it are synchronous)."""
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def flush(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no cache flush")

    def clocks(self) -> tuple[float | None, float | None]:
        """(SM clock, memory clock) in MHz right now; None where the device does not say."""
        return None, None

    def throttle_floor_mhz(self) -> float | None:
        """Samples taken while the SM clock is under this are dropped (75 % of default)."""
        return None

    def context(self) -> dict:
        return {"cache_bytes": self.cache_bytes(), "cpu_count": os.cpu_count()}

    def copy_calls(self, nbytes: int, k: int) -> list:
        """`kparity bench --copy-same-bytes`: k (call, src) pairs, each call one ordinary kernel
        copying its own src (random data) to its own dst, nbytes read + written in all: a
        copy of a case's bytes, timed in the case's mode and rotation, is the ceiling of a
        kernel that small (launch and latency included, which a 1 GiB copy amortises away).
        Only the CUDA timers have one."""
        raise NotImplementedError(f"{type(self).__name__} has no size-matched copy: "
                                  "--copy-same-bytes needs a CUDA timer")

    def ceilings(self) -> dict:
        """A large copy (GB/s, read + write) and, where cheap, a GEMM (TFLOP/s)."""
        src = np.random.default_rng(0).standard_normal(32 << 20, dtype=np.float32)  # 128 MiB
        dst = np.empty_like(src)
        best = min(self.elapsed(lambda: np.copyto(dst, src)) for _ in range(5))
        return {"copy_bytes": 2 * src.nbytes, "copy_gbps": 2 * src.nbytes / best / 1e9,
                "gemm": "", "gemm_tflops": None}


HOST_TIMER = Timer()
