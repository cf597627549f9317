"""Which weight access pattern can a GEMV stream at the HBM limit? (issue 4, diagnostic)

kp_qgemv_mma's copies alone (its `_diag_load_only` variant) stayed ~2 us above a plain streaming
read of the same bytes at llama3-8b-up while a warp copied 32 rows x 64 bytes a step. This
script times read-only kernels over a row-major [rows, row_bytes] matrix that differ only in
the shape of a warp's per-step chunk: R rows x B bytes of each (R B = 2 KiB), every lane 4 x 16-byte loads
per step, 2 steps in flight. Warps take (R-row group, K part) units, K split so that about
`warps` units exist; graph_rot's protocol (a graph of 64 calls over buffers totalling >= 4x
L2), each launch a programmatic dependent launch. It prints us, GB/s and % of the copy ceiling.

    PYTHONPATH=. python3 scripts/access_pattern.py     # on a CUDA machine, from the checkout
"""

from __future__ import annotations

import numpy as np

SOURCE = r'''
#include "common.cuh"
template <int HINT>
__device__ __forceinline__ uint4 load(const uint4* p) {
    uint4 v;
    if constexpr (HINT)
        asm volatile("ld.global.nc.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else
        v = __ldg(p);
    return v;
}

// rows x row_bytes, units = (rows / R) x split; warp-units, 2 KiB a step (4 vectors a lane)
template <int R, int HINT>
__global__ void __launch_bounds__(128) read_tiles(const uint4* __restrict__ w, int rows,
                                                  int row_bytes, int split,
                                                  unsigned* __restrict__ out) {
    pdl_launch_dependents();
    pdl_wait();
    constexpr int B = 2048 / R;                    // bytes of each row per step
    const int lane = threadIdx.x & 31;
    const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    const int row_vec = row_bytes / 16, part = row_vec / split;
    const int units = rows / R * split;
    unsigned acc = 0;
    for (int u = gw; u < units; u += warps) {
        const int rg = u / split, kp = u % split;
        const uint4* base = w + (size_t)rg * R * row_vec + kp * part;
        // load j (0..3) of a step: vectors 32 j .. 32 j + 31 of the R x B chunk (row-major)
        const uint4* p[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int v = j * 32 + lane;          // vector index within the R x B chunk
            p[j] = base + (size_t)(v / (B / 16)) * row_vec + v % (B / 16);
        }
        const int steps = part / (B / 16);
        for (int s = 0; s < steps; s += 2) {
            const int s1 = s + 1 < steps ? s + 1 : s;  // an odd last step: read twice (L1 hit)
            uint4 a[8];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                a[j] = load<HINT>(p[j] + s * (B / 16));
                a[4 + j] = load<HINT>(p[j] + s1 * (B / 16));
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) acc ^= a[j].x ^ a[j].y ^ a[j].z ^ a[j].w;
        }
    }
    if (acc == 0x9E3779B9u) out[blockIdx.x] = acc;  // practically never: keeps the loads live
}
'''

from read_ceiling import graph_seconds  # noqa: E402  (scripts/ is this script's directory)

SHAPES = {"llama3-8b-up": (14336, 2048), "llama3-8b-down": (4096, 7168),
          "qwen2.5-32b-up": (27648, 2560)}

def main() -> None:
    import cupy

    from gpu_impls.cuda._module import KERNEL_DIR, launch
    from gpu_impls.cuda._timer import CupyTimer

    timer = CupyTimer()
    names = [f"read_tiles<{r}, {h}>" for r in (32, 8, 4, 2, 1) for h in (0, 1)]
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17", f"-I{KERNEL_DIR}"),
                            name_expressions=names)
    sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    copy = timer.ceilings()["copy_gbps"]
    print(f"copy ceiling {copy:.0f} GB/s, {sms} SMs")
    sink = cupy.zeros(1 << 16, dtype=cupy.uint32)
    for label, (rows, row_bytes) in SHAPES.items():
        nbytes = rows * row_bytes
        sets = max(1, -(-4 * timer.l2_bytes() // nbytes))
        bufs = [cupy.random.default_rng(s).integers(0, 2**31, size=nbytes // 4, dtype=cupy.uint32)
                for s in range(sets)]
        for r in (32, 8, 4, 2, 1):
            b = 2048 // r
            if row_bytes % b:
                continue
            for target_warps in (sms * 14, sms * 28):
                split = 1  # the largest power of two giving at most target_warps units
                while (row_bytes // b) % (2 * split) == 0 and rows // r * 2 * split <= target_warps:
                    split *= 2
                units = rows // r * split
                warps = min(units, target_warps)
                for hint in (0, 1):
                    k = module.get_function(f"read_tiles<{r}, {hint}>")
                    grid = -(-warps // 4)
                    t = graph_seconds(timer, [lambda buf=buf: launch(
                        k, (grid, 1, 1), (128, 1, 1),
                        (buf, np.int32(rows), np.int32(row_bytes), np.int32(split), sink),
                        pdl=True) for buf in bufs], repeats=11)
                    gbps = nbytes / t / 1e9
                    print(f"{label:15s} {r:2d} rows x {b:4d} B  split {split:2d}  warps {warps:5d}"
                          f"  L2::128B {hint}  {t * 1e6:7.2f} us  {gbps:5.0f} GB/s"
                          f"  {100 * gbps / copy:5.1f} % of copy")
        del bufs


if __name__ == "__main__":
    main()
