"""Where does kp_qgemv_mma's time go? A per-warp timeline (issue 4, diagnostic).

kp_qgemv_mma compiled with KPARITY_DIAG_TRACE has lane 0 of every warp record clock64 when each
phase ends (x landed, prologue done, each step landed and computed, the end) and globaltimer at
its start and end (`kpm_trace` in the .cu). This script launches it at the issue's shapes over
rotating buffers (weights never in L2 from the launch before), reads the trace of the last
launch and prints, per shape, the kernel's span and the phases' times from each block's start:
the median over a block's warps, then the 10th / 50th / 90th percentile over blocks. Beside
it: `subtract` (always the subtraction path, KPARITY_DIAG_SUBTRACT) and `load_only` (copies
without the math): the gaps are what the fast path saves and where the math shows. Last, per
warp of the block: the SM sub-partition it ran on (%warpid % 4), how many of the block's warps
shared it, and its step times (benchmarks/HISTORY.md, h100-2026-11-24-balance: the full
sub-partitions' warps end last).

    PYTHONPATH=. python3 scripts/mma_trace.py     # on a CUDA machine, from the checkout
    KPM_DUMP=$OUT PYTHONPATH=. python3 scripts/mma_trace.py   # also saves each raw trace (.npy)
"""

from __future__ import annotations

import os

import numpy as np

SHAPES = {"llama3-8b-up": (14336, 4096), "llama3-8b-down": (4096, 14336),
          "qwen2.5-32b-up": (27648, 5120)}
GROUP = 64  # the group size: the kernel instance and every buffer below
EVENTS = 40
VARIANTS = {"math": ("KPARITY_DIAG_TRACE",),
            "subtract": ("KPARITY_DIAG_TRACE", "KPARITY_DIAG_SUBTRACT"),
            "load_only": ("KPARITY_DIAG_TRACE", "KPARITY_DIAG_LOAD_ONLY")}


def _pct(values, q) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def summarize(trace: np.ndarray, warps_per_block: int, ns_per_clock: float) -> list[str]:
    """Lines: each phase's time (us from its block's first warp start) over blocks."""
    blocks = trace.shape[0] // warps_per_block
    t = trace[:blocks * warps_per_block].reshape(blocks, warps_per_block, EVENTS)
    start = t[:, :, 3].min(axis=1, keepdims=True)
    rel = (t - start[:, :, None]) * ns_per_clock / 1e3  # us, clock events only
    steps = int(t[0, 0, 2])
    rows = [("x landed", 4), ("prologue done", 5)]
    for i in range(min(steps, 16)):
        rows += [(f"step {i} landed", 6 + 2 * i), (f"step {i} computed", 7 + 2 * i)]
    rows.append(("end", 38))
    lines = []
    for label, e in rows:
        per_block = np.median(rel[:, :, e], axis=1)
        lines.append(f"  {label:18s} {_pct(per_block, 10):6.2f} {_pct(per_block, 50):6.2f} "
                     f"{_pct(per_block, 90):6.2f}   last warp p50 "
                     f"{_pct(rel[:, :, e].max(axis=1), 50):6.2f}")
    landed = [6 + 2 * i for i in range(min(steps, 16))]
    wait = rel[:, :, landed[0]] - rel[:, :, 5]
    compute = np.zeros_like(wait)
    for k, e in enumerate(landed):
        compute += rel[:, :, e + 1] - rel[:, :, e]
        if k:
            wait += rel[:, :, e] - rel[:, :, e - 1]
    after = rel[:, :, 38] - rel[:, :, landed[-1] + 1]
    lines.append(f"  per warp (p50): waiting for steps {np.median(wait):.2f} us, computing "
                 f"{np.median(compute):.2f} us, after the last step {np.median(after):.2f} us")
    # Per warp of the block (its index; its SM sub-partition, %warpid % 4): medians over blocks.
    subpartition = (t[:, :, 1] >> 16) % 4
    lines.append("  warp  sub  on-sub  step 0 landed  last landed  last computed  computing")
    for w in range(warps_per_block):
        sub = int(np.bincount(subpartition[:, w]).argmax())
        sharing = np.median((subpartition == subpartition[:, w:w + 1]).sum(axis=1))
        lines.append(f"  {w:4d}  {sub:3d}  {sharing:6.0f}  {np.median(rel[:, w, landed[0]]):13.2f}  "
                     f"{np.median(rel[:, w, landed[-1]]):11.2f}  "
                     f"{np.median(rel[:, w, landed[-1] + 1]):13.2f}  {np.median(compute[:, w]):9.2f}")
    return lines


def main() -> None:
    import cupy
    import ml_dtypes

    from gpu_impls.cuda import gemv
    from gpu_impls.cuda._module import kernel as compiled_kernel
    from gpu_impls.cuda._module import launch
    from gpu_impls.cuda._module import module as compiled_module
    from gpu_impls.cuda._timer import CupyTimer

    timer = CupyTimer()
    for label, (out_dim, in_dim) in SHAPES.items():
        dims = {"out": out_dim, "in": in_dim, "group_size": GROUP, "bits": 4}
        _, geo = gemv.mma_geometry(dims, {})
        stages = geo.extra["stages"]
        warps_per_block = geo.block[0] // 32 * geo.block[1]
        nbytes = out_dim * in_dim // 2
        sets = max(2, -(-4 * timer.l2_bytes() // nbytes))
        rng = np.random.default_rng(0)
        groups = in_dim // GROUP

        def bf16_bits(values):  # the kernel takes bf16 as its 16 bits
            return cupy.asarray(values.astype(ml_dtypes.bfloat16).view(np.uint16))

        bufs = [(cupy.asarray(rng.integers(0, 2**32, size=nbytes // 4, dtype=np.uint32)),
                 bf16_bits(rng.random(out_dim * groups) * 0.01 + 0.001),
                 bf16_bits(-rng.random(out_dim * groups) * 0.05)) for _ in range(sets)]
        x = bf16_bits(rng.standard_normal(in_dim) / np.sqrt(in_dim))
        out = cupy.zeros(out_dim, dtype=cupy.uint16)
        print(f"{label} ({out_dim} x {in_dim}, int4 g{GROUP}, bf16): grid {geo.grid[0]} blocks of "
              f"{warps_per_block} warps, {stages} stages; times in us from each block's start, "
              f"p10 / p50 / p90 over blocks")
        for variant, defines in VARIANTS.items():
            kernel = compiled_kernel(gemv.MMA, "kp_qgemv_mma", "bf16", defines, (stages, GROUP))
            trace_ptr = compiled_module(gemv.MMA, "kp_qgemv_mma", "bf16", defines,
                                        (stages, GROUP)).get_global("kpm_trace")
            for w, sc, bi in bufs * 3:  # the last launch's trace is read
                launch(kernel, geo.grid, geo.block,
                       (w, sc, bi, x, out, np.int32(out_dim), np.int32(in_dim), np.int32(GROUP)),
                       pdl=True, shared_bytes=geo.shared_bytes)
            cupy.cuda.Device().synchronize()
            warps = geo.grid[0] * warps_per_block
            trace = cupy.ndarray((16384, EVENTS), dtype=cupy.int64, memptr=trace_ptr).get()[:warps]
            span_ns = trace[:, 39].max() - trace[:, 0].min()
            clocks = (trace[:, 38] - trace[:, 3]).astype(np.float64)
            ns_per_clock = float(np.sum(trace[:, 39] - trace[:, 0]) / np.sum(clocks))
            starts = (trace[:, 0] - trace[:, 0].min()) / 1e3
            ends = (trace[:, 39] - trace[:, 0].min()) / 1e3
            sms = len(set((trace[:, 1] & 0xFFFF).tolist()))
            print(f" {variant}: span {span_ns / 1e3:.2f} us on {sms} SMs ({1 / ns_per_clock:.2f} "
                  f"GHz); block starts p50/max {np.median(starts):.2f}/{starts.max():.2f} us, "
                  f"ends p10/p50/max {_pct(ends, 10):.2f}/{_pct(ends, 50):.2f}/{ends.max():.2f}")
            if os.environ.get("KPM_DUMP"):  # a folder: the raw trace, for per-warp analysis
                np.save(f"{os.environ['KPM_DUMP']}/{label}-{variant}.npy", trace)
            for line in summarize(trace, warps_per_block, ns_per_clock):
                print(line)
        del bufs


if __name__ == "__main__":
    main()
