"""The MLX timer: host wall time around `mx.eval` of many queued calls (`wall_eval`).

MLX exposes no device timestamps (`mx.metal` has no GPU-timestamp API; MLX's own benchmarks,
`benchmarks/python/time_utils.py`, time `mx.eval` with `time.perf_counter`), and one `mx.eval`
costs a synchronisation (~0.25 ms on Apple GPUs, ml-explore/mlx#4265): a sample therefore queues
R >= 64 calls over rotating input sets and evaluates all their outputs at once, so the sync is
amortised over R.
"""

from __future__ import annotations

import time

from gpu_impls.timer import Timer


COPIES = 8  # copies of the ceiling's 128 MiB per eval on a GPU


class MlxTimer(Timer):
    modes = ("wall_eval",)
    min_calls = 64

    def sequence(self, calls, capture=True):  # no graphs here: `capture` changes nothing
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

        src = mx.random.normal((32 << 20,), dtype=mx.float32)  # 128 MiB, past any cache
        mx.eval(src)

        # One eval costs a sync (~0.2 ms on MLX CUDA, H100: one copy an eval read 889-918 GB/s
        # against 2967-3004 from CUDA events; benchmarks/HISTORY.md, h100-2026-11-24-mlx-cuda).
        # On a GPU the ceiling is therefore the difference of an eval of COPIES copies and one of
        # a single copy: COPIES - 1 copies, the sync cancelled (should noise make that difference
        # non-positive, all COPIES copies over the one eval's time, the sync counted in). On
        # the CPU the sync is nothing next to a 128 MiB copy: one copy an eval.
        def best(copies: int) -> float:
            def run():
                mx.eval([src + i for i in range(copies)])  # each reads and writes every element
            run()
            return min(self.elapsed(run) for _ in range(5))

        if mx.default_device().type == mx.cpu:
            seconds, moved = best(1), 2 * src.nbytes
        else:
            many, one = best(COPIES), best(1)
            seconds, moved = ((many - one, 2 * src.nbytes * (COPIES - 1)) if many > one
                              else (many, 2 * src.nbytes * COPIES))
        return {"copy_bytes": moved, "copy_gbps": moved / seconds / 1e9, "gemm": "",
                "gemm_tflops": None}


TIMER = MlxTimer()
