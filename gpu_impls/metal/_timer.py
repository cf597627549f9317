"""Device time for Metal kernels dispatched from Python through PyObjC: command-buffer GPU
timestamps (`MTLCommandBuffer.GPUStartTime` / `GPUEndTime`), mode `metal_ts`.

A Metal impl that dispatches its own pipeline returns the committed `MTLCommandBuffer` (or a
list of them), one dispatch per command buffer so each buffer's window is one kernel. A sample
waits on every buffer and sums `GPUEndTime() - GPUStartTime()` (seconds, on the
mach_absolute_time base); `kernelStartTime` is not used (unreliable on Apple silicon: TornadoVM
PR #908 saw it inflate times up to ~1700x). Kernels dispatched inside MLX (`mx.fast.metal_kernel`)
expose no command buffer: the `metal` backend, which runs through MLX, times with the MLX timer
(`wall_eval`). This path needs macOS and an Apple GPU; here it is exercised only with stand-in
command buffers (tests/test_timing.py).
"""

from __future__ import annotations

from gpu_impls.timer import Timer


def _buffers(returned) -> list:
    if returned is None:
        raise RuntimeError("a Metal impl timed with metal_ts must return its committed "
                           "MTLCommandBuffer(s)")
    return list(returned) if isinstance(returned, (list, tuple)) else [returned]


class MetalCommandBufferTimer(Timer):
    kind = "metal_gpu_timestamps"
    modes = ("metal_ts",)
    min_calls = 64

    def sequence(self, calls, capture=True):  # no graphs here: `capture` changes nothing
        return lambda: [b for call in calls for b in _buffers(call())]

    def elapsed(self, fn) -> float:
        total = 0.0
        for buffer in _buffers(fn()):
            buffer.waitUntilCompleted()
            total += buffer.GPUEndTime() - buffer.GPUStartTime()
        return total


TIMER = MetalCommandBufferTimer()
