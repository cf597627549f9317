"""How fast can one kernel read N bytes, timed as kparity times a GEMV? (issue 4's ceiling)

The GEMV target is a fraction of the copy ceiling measured on 1 GiB. A GEMV at the issue's
shapes reads only 33-147 MB per call, so launch, ramp-up and drain weigh more. This script
times a plain streaming read of the same byte counts. Each thread loads 16-byte vectors
grid-stride and folds them; one word is stored per block. It uses graph_rot's protocol
(`CupyTimer.sequence`: a graph of 64 calls over rotating buffers totalling >= 4x L2), launched
ordinarily and as PDL. It prints GB/s and % of the copy ceiling of the same run.

    PYTHONPATH=. python3 scripts/read_ceiling.py     # on a CUDA machine, from the checkout
"""

from __future__ import annotations

import numpy as np

SOURCE = r'''
#include "common.cuh"
extern "C" __global__ void __launch_bounds__(256) read_all(const uint4* __restrict__ p, long long n,
                                                           unsigned* __restrict__ out) {
    pdl_launch_dependents();  // as the kp kernels: no-ops in an ordinary launch
    pdl_wait();
    unsigned acc = 0;
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (; i + 3 * step < n; i += 4 * step) {  // 4 loads in flight per thread
        uint4 a = p[i], b = p[i + step], c = p[i + 2 * step], d = p[i + 3 * step];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y
               ^ d.z ^ d.w;
    }
    for (; i < n; i += step) { uint4 a = p[i]; acc ^= a.x ^ a.y ^ a.z ^ a.w; }
    if (acc == 0x9E3779B9u) out[blockIdx.x] = acc;  // practically never: keeps the loads live
}
'''

SIZES = {"llama3-8b-up/down (int4 g64, bytes of the op)": 33_070_000,
         "qwen2.5-32b-up (int4 g64)": 79_690_000, "1 GiB": 1 << 30}
CALLS = 64


def graph_seconds(timer, calls: list, repeats: int) -> float:
    """Median seconds per call of a graph of CALLS launches cycling over `calls` (one per
    buffer set: graph_rot's protocol), replayed `repeats` times after a warm-up replay."""
    with timer.stream():
        for c in calls:
            c()
        replay = timer.sequence([calls[i % len(calls)] for i in range(CALLS)])
    replay()
    times = sorted(timer.elapsed(replay) / CALLS for _ in range(repeats))
    return times[len(times) // 2]


def main() -> None:
    import cupy

    from gpu_impls.cuda._module import KERNEL_DIR, launch
    from gpu_impls.cuda._timer import CupyTimer

    timer = CupyTimer()
    k = cupy.RawKernel(SOURCE, "read_all", options=(f"-I{KERNEL_DIR}",))
    sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    copy = timer.ceilings()["copy_gbps"]
    print(f"copy ceiling {copy:.0f} GB/s, L2 {timer.l2_bytes() >> 20} MiB, {sms} SMs")
    sink = cupy.zeros(1 << 16, dtype=cupy.uint32)
    for label, nbytes in SIZES.items():
        n = nbytes // 16
        sets = max(1, -(-4 * timer.l2_bytes() // nbytes))
        bufs = [cupy.random.default_rng(s).integers(0, 2**31, size=4 * n, dtype=cupy.uint32)
                for s in range(sets)]
        for blocks_per_sm in (8, 16):
            grid = min(sms * blocks_per_sm, -(-n // 256))
            for pdl in (False, True):
                t = graph_seconds(timer, [lambda b=b: launch(k, (grid, 1, 1), (256, 1, 1),
                                                             (b, np.int64(n), sink), pdl=pdl)
                                          for b in bufs], repeats=15)
                gbps = nbytes / t / 1e9
                print(f"{label:48s} grid {grid:5d} pdl={pdl!s:5}  {t * 1e6:8.2f} us  "
                      f"{gbps:6.0f} GB/s  {100 * gbps / copy:5.1f} % of copy")
        del bufs


if __name__ == "__main__":
    main()
