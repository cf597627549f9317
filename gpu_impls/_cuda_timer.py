"""The CUDA timer, written once over two APIs (CuPy, torch): events, graphs, the L2 flush.

Everything runs on one non-default stream owned by the timer: impls launch on the current stream,
and `stream()` makes it current. `sequence(calls)` captures the calls into one CUDA graph (the
calls must already have run once, outside capture, so that compilation and allocation are done);
`elapsed(fn)` records an event before and after `fn` on the stream and returns the device time
between them. The flush writes a buffer of twice the L2 size (nvbench writes exactly the L2
size; twice leaves no doubt) before the start event, so it is not timed; after the flush a
spin kernel holds the stream for `HOLD_US` while the host queues start event, call and end
event, so the host's time to issue the call is not timed either (nvbench blocks the stream for
the same reason; without it, torch's F.rms_norm read ~20 us slower than `do_bench` on an H100,
whose 256 MiB flush hides the issue time the same way).

`predecessor(array)` is the `chain` mode's kernel before each call: an ordinary launch (never a
programmatic dependent one) that XORs the first `CHAIN_BYTES` of the array with a key of 0
passed at run time (the compiler cannot drop the store), so the call after it must wait for a
kernel that wrote its input, as in a decode step, and still computes the same result. Its first
word only: the kernel is then the same small one (about a microsecond, the graph's launch floor)
for every op and size, and the activation stays where the rotation left it, out of the L2, as
the work model (each input read from memory) and `graph_rot` have it. Rewriting all of x
(<= 1 MiB) was tried on an H100: x then came from the L2, and ordinary launches of the decode
RMSNorms read 8-24 % under `graph_rot` (cuda:mt_rms_norm 2.75 against 2.99 us at 1x4096 bf16,
torch:rms_norm 6.26 against 8.18); rewriting its first word, they agree within 1.2 %, so
`chain` differs from `graph_rot` only in the kernel each call follows.

Clocks come from NVML, read at most every `CLOCK_PERIOD_S`: the SM and memory clock during each
sample, and 75 % of the default SM clock as the throttle floor (nvbench's rule).
"""

from __future__ import annotations

import time

from gpu_impls import _nvml
from gpu_impls.timer import Timer

CLOCK_PERIOD_S = 0.01
HOLD_US = 200             # cold mode: how long the spin kernel holds the stream after a flush
COPY_BYTES = 1 << 30      # the copy ceiling: >= 1 GiB, far beyond any L2
GEMM_N = 8192             # the GEMM ceiling: bf16 8192^3 on random data
CHAIN_BYTES = 4           # chain: the predecessor rewrites this much of the input (one word)


class CudaTimer(Timer):
    kind = "cuda_events"
    modes = ("chain", "graph_rot", "cold", "eager")
    max_sets = 1 << 16

    def __init__(self):
        self._stream = None
        self._flush_buf = None
        self._flushes = 0
        self._last_clock = (0.0, (None, None))

    # --- the API-specific primitives --------------------------------------------------------
    def _new_stream(self):
        raise NotImplementedError

    def _stream_context(self, stream):
        raise NotImplementedError

    def _capture(self, stream, calls):
        """A zero-argument callable replaying a graph of `calls` on `stream`."""
        raise NotImplementedError

    def _events(self):
        raise NotImplementedError

    def _record(self, event, stream) -> None:
        raise NotImplementedError

    def _elapsed_ms(self, start, end) -> float:
        raise NotImplementedError

    def _spin(self, cycles: int) -> None:
        """Queue a kernel that spins for `cycles` SM clock cycles and touches no memory."""
        raise NotImplementedError

    def _nbytes(self, array) -> int:
        """Bytes of the device array `array`."""
        raise NotImplementedError

    def _rewrite(self, array, nbytes: int) -> None:
        """Queue one ordinary kernel that XORs the first `nbytes` bytes of `array` with 0."""
        raise NotImplementedError

    def _alloc_bytes(self, nbytes: int):
        """A device buffer of `nbytes` bytes."""
        raise NotImplementedError

    def _memset(self, buf, value: int) -> None:
        """Overwrite every byte of `buf` with `value`, on the current stream."""
        raise NotImplementedError

    def _copy_pair(self, nbytes: int):
        """(copy callable, bytes) for a device-to-device copy of random data."""
        raise NotImplementedError

    def _copy_kernel_pair(self, nbytes: int):
        """(call, src): one ordinary kernel (never a memcpy, which a graph would turn into a
        memcpy node) copying `nbytes` (a multiple of 16) of random data from src to a dst."""
        raise NotImplementedError

    def _gemm(self, n: int):
        """(callable, dtype name) for an n^3 matrix product on random data, or (None, '')."""
        return None, ""

    def l2_bytes(self) -> int:
        raise NotImplementedError

    def free_bytes(self) -> int:
        raise NotImplementedError

    # --- the Timer interface ------------------------------------------------------------------
    def _get_stream(self):
        if self._stream is None:
            self._stream = self._new_stream()
        return self._stream

    def stream(self):
        return self._stream_context(self._get_stream())

    def cache_bytes(self) -> int:
        return self.l2_bytes()

    def memory_budget(self) -> int:
        return min(int(0.5 * self.free_bytes()), 16 << 30)

    def sequence(self, calls: list, capture: bool = True):
        stream = self._get_stream()
        if capture:
            return self._capture(stream, calls)

        def enqueue():  # uncaptured: each call launched from Python, its host syncs included
            with self._stream_context(stream):
                for call in calls:
                    call()
        return enqueue

    def predecessor(self, array):
        nbytes = min(self._nbytes(array), CHAIN_BYTES)
        return lambda: self._rewrite(array, nbytes)

    def elapsed(self, fn) -> float:
        stream = self._get_stream()
        start, end = self._events()
        with self._stream_context(stream):
            self._record(start, stream)
            fn()
            self._record(end, stream)
        end.synchronize()
        return self._elapsed_ms(start, end) / 1e3

    def flush(self) -> None:
        if self._flush_buf is None:
            self._flush_buf = self._alloc_bytes(2 * self.l2_bytes())
        self._flushes += 1
        with self._stream_context(self._get_stream()):
            self._memset(self._flush_buf, self._flushes % 251)  # a new value each time
            # cycles at the default clock: at any lower clock the hold only lasts longer
            self._spin(int(HOLD_US * (_nvml.default_sm_clock_mhz() or 2000)))

    def clocks(self):
        now = time.monotonic()
        if now - self._last_clock[0] >= CLOCK_PERIOD_S:
            self._last_clock = (now, (_nvml.clock_mhz(_nvml.NVML_CLOCK_SM),
                                      _nvml.clock_mhz(_nvml.NVML_CLOCK_MEM)))
        return self._last_clock[1]

    def throttle_floor_mhz(self):
        default = _nvml.default_sm_clock_mhz()
        return 0.75 * default if default else None

    def context(self) -> dict:
        return {"l2_bytes": self.l2_bytes(), **_nvml.context()}

    def _per_call(self, fn, calls: int, samples: int = 7) -> float:
        """Median device seconds per call over `calls` back-to-back eager calls of fn. Eager on
        purpose: captured into a graph, a device-to-device memcpy becomes a memcpy node (seen on
        an H100: 2.43 TB/s in a graph; see benchmarks/HISTORY.md, 9fa9d9a), and at >= 1 GiB
        launch gaps do not matter."""
        def batch():
            for _ in range(calls):
                fn()
        self.elapsed(batch)  # warm: handles, workspaces
        times = sorted(self.elapsed(batch) / calls for _ in range(samples))
        return times[len(times) // 2]

    def copy_calls(self, nbytes: int, k: int) -> list:
        half = max(16, -(-nbytes // 32) * 16)  # read + write: half each way, whole 16-byte words
        return [self._copy_kernel_pair(half) for _ in range(k)]

    def ceilings(self) -> dict:
        copy, nbytes = self._copy_pair(COPY_BYTES)
        out = {"copy_bytes": nbytes, "copy_gbps": nbytes / self._per_call(copy, 5) / 1e9,
               "gemm": "", "gemm_tflops": None}
        del copy
        gemm, dtype = self._gemm(GEMM_N)
        if gemm is not None:
            out["gemm"] = f"{dtype} {GEMM_N}x{GEMM_N}x{GEMM_N}"
            out["gemm_tflops"] = 2 * GEMM_N ** 3 / self._per_call(gemm, 3) / 1e12
        return out
