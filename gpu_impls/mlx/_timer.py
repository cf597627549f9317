"""The MLX timer: host wall time around `mx.eval` of many queued calls (`wall_eval`).

MLX exposes no device timestamps (`reference/measurement.md` §5), and one `mx.eval` costs a
synchronisation (~0.25 ms on Apple GPUs): a sample therefore queues R >= 64 calls over rotating
input sets and evaluates all their outputs at once, so the sync is amortised over R.
"""

from __future__ import annotations

import time

from gpu_impls.timer import Timer


class MlxTimer(Timer):
    modes = ("wall_eval",)
    min_calls = 64

    def sequence(self, calls):
        import mlx.core as mx

        def run():
            outs = [call() for call in calls]
            mx.eval([v for o in outs if o for v in o.values()])
        return run

    def elapsed(self, fn):
        import mlx.core as mx

        mx.synchronize()
        t0 = time.perf_counter()
        fn()
        mx.synchronize()
        return time.perf_counter() - t0

    def ceilings(self):
        import mlx.core as mx

        src = mx.random.normal((32 << 20,), dtype=mx.float32)  # 128 MiB
        mx.eval(src)

        def copy():
            mx.eval(mx.array(src) + 0)  # one read and one write of every element
        copy()
        best = min(self.elapsed(copy) for _ in range(5))
        return {"copy_bytes": 2 * src.nbytes, "copy_gbps": 2 * src.nbytes / best / 1e9,
                "gemm": "", "gemm_tflops": None}


TIMER = MlxTimer()
