"""Per-kernel device time of `cuda:kp_ssd_chunked` (issue 30's speed analysis): at each bench
case of ssd_chunked (or --label), each of its kernels (`ssd.KERNEL_OF`: cb, state, out) launched alone
N times back to back after one full run, timed with CUDA events; median of 7 such batches per
kernel. A profile, not a kparity measurement (no chain predecessor, no rotation: the inputs stay
in the L2 where they fit): it says where the pipeline's time goes, not what a user sees.

    python3 scripts/ssd_stages.py [--label nemotron-3-nano-t2048]
"""

from __future__ import annotations

import argparse

import cupy

import gpu_impls
from cases.generate import bench_plan
from cases.model import make_inputs
from gpu_impls.cuda import ssd
from gpu_impls.cuda._module import kernel, launch as cuda_launch

REPS, BATCHES = 20, 7


def _time(fn) -> float:
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(BATCHES):
        start.record()
        for _ in range(REPS):
            fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / REPS)
    return sorted(times)[BATCHES // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    impl = gpu_impls.impls()["cuda:kp_ssd_chunked"]
    backend = gpu_impls.backend("cuda")
    for w in bench_plan([impl]):
        case = w.case
        if args.label and not case.label.endswith(args.label):
            continue
        launches = impl.contract.check(impl.id, case)
        inputs = {k: backend.to_device(v) for k, v in make_inputs(case).items()}
        outputs = {t.name: backend.poisoned(t.shape_of(case), t.dtype(case))
                   for t in case.spec.outputs}
        impl.run(launches, inputs, outputs, case)
        ws = ssd.workspace(case)
        parts = {}
        for name in ssd.KERNEL_OF:
            k = kernel(ssd.SOURCE, ssd.KERNEL_OF[name], case.dtype)
            a = ssd.args_of(name, inputs, outputs, ws, case)
            ln = launches[name]
            parts[name] = _time(lambda: cuda_launch(k, ln.grid, ln.block, a,
                                                    shared_bytes=ln.shared_bytes))
        total = _time(lambda: impl.run(launches, inputs, outputs, case))
        print(f"{case.label:40s} " + "  ".join(f"{n} {t:8.1f} us" for n, t in parts.items())
              + f"  all {total:8.1f} us")


if __name__ == "__main__":
    main()
