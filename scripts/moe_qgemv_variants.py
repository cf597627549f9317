"""`cuda:kp_moe_grouped_gemm`'s int4 decode kernel (kp_moe_qgemv_mma) against its geometry: K parts
(warps splitting K), pipeline stages and tiles a block, at the affine4 decode bench cases, each
timed as `kparity bench` times it (`chain`, the runner's `bench_one`), with the geometry the
launcher picks first. Issue 31's speed analysis; prints one line per variant.

    python3 scripts/moe_qgemv_variants.py [--preset nemotron3-nano-up-affine4-t1,...]
"""

from __future__ import annotations

import argparse
from functools import partial

import gpu_impls
from cases.generate import bench_plan
from cases.model import make_inputs
from gpu_impls.cuda import moe_gemm
from runners.bench import bench_one
from runners.stopping import StdRel

PRESETS = "nemotron3-nano-up-affine4-t1,qwen3-30b-a3b-up-affine4-t1"
# (parts, stages, tiles); the first: the launcher's choice
VARIANTS = [(None, None, None),
            *[(p, s, t) for p in (1, 2, 3) for s in (2, 3) for t in (1, 2, 3, 4)]]
SHORT = [(None, None, None), (2, 3, 4), (2, 2, 3), (3, 2, 2)]  # --short


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default=PRESETS)
    ap.add_argument("--short", action="store_true", help="the launcher and three variants")
    args = ap.parse_args()
    impl = gpu_impls.impls()["cuda:kp_moe_grouped_gemm"]
    backend = gpu_impls.backend("cuda")
    wanted = args.preset.split(",")
    default = moe_gemm._qgemv_geometry
    for w in bench_plan([impl]):
        if not any(w.case.label.endswith(p) for p in wanted):
            continue
        host = make_inputs(w.case)
        for parts, stages, tiles in SHORT if args.short else VARIANTS:
            moe_gemm._qgemv_geometry = (default if parts is None else
                                        partial(default, stages=stages, parts=parts, tiles=tiles))
            launch = impl.contract.check(impl.id, w.case)
            row = bench_one(impl, backend, w.case, "chain",
                            lambda: StdRel(min_time_s=0.1, timeout_s=5.0), host_inputs=host,
                            verify=False)
            moe_gemm._qgemv_geometry = default
            name = "launcher" if parts is None else f"p{parts} s{stages} t{tiles}"
            us = row.get("median_ns", float("nan")) / 1e3
            print(f"{w.case.label:34s} {name:20s} block {launch.block} grid {launch.grid} "
                  f"stages {launch.extra['stages']}: {us:8.2f} us  {row['status']} "
                  f"{row.get('message', '')[:80]}", flush=True)


if __name__ == "__main__":
    main()
