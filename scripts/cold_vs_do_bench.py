"""Cross-check: the harness's `cold` median against `triton.testing.do_bench` (median, its own
256 MiB L2 flush) on the same call, for kernels >= 20 us (issue 3, done-when 1).

    python3 scripts/cold_vs_do_bench.py [--impl ID ...] [--preset hbm-16384x8192 ...]

Prints one line per (impl, case): harness cold median, do_bench median, their ratio.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpu_impls  # noqa: E402
from cases.generate import bench_cases  # noqa: E402
from cases.model import make_inputs  # noqa: E402
from runners.bench import bench_one  # noqa: E402
from runners.stopping import StdRel  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", nargs="+", default=["torch:rms_norm", "cuda:kp_rms_norm",
                                                 "cuda:mt_rms_norm_wide"])
    p.add_argument("--preset", nargs="+", default=["hbm-16384x8192", "hbm-65536x4096",
                                                   "prefill-2048x4096"])
    p.add_argument("--dtype", default="bf16")
    args = p.parse_args()
    import triton.testing

    impls = gpu_impls.impls()
    print(f"{'impl':28s} {'case':22s} {'cold us':>9s} {'do_bench us':>12s} {'ratio':>7s}")
    for impl_id in args.impl:
        impl = impls[impl_id]
        backend = gpu_impls.backend(impl.backend)
        for case in bench_cases(impl.op):
            label = case.label.split(":", 1)[-1]
            if case.dtype != args.dtype or label not in args.preset:
                continue
            inputs = make_inputs(case)
            row = bench_one(impl, backend, case, "cold", StdRel, host_inputs=inputs,
                            verify=False)
            launch = impl.contract.check(impl.id, case)
            dev_in = {k: backend.to_device(v) for k, v in inputs.items()}
            dev_out = ({t.name: backend.poisoned(t.shape_of(case), t.dtype(case))
                        for t in case.spec.outputs} if backend.writes_in_place else None)
            call = partial(impl.run, launch, dev_in, dev_out, case)
            ms = triton.testing.do_bench(call, warmup=100, rep=1000, return_mode="median")
            cold = row["median_ns"] / 1e3
            print(f"{impl_id:28s} {label:22s} {cold:9.2f} {ms * 1e3:12.2f} "
                  f"{cold / (ms * 1e3):7.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
