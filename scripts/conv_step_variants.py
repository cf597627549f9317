"""Profile of `cuda:kp_conv1d_causal_step` at its bench cases against threads per block (issue
30's speed analysis): the kernel launched with t threads a block for t in 32..256, back to back over enough input sets to overflow the L2 four times (each launch reads its own
set from memory), timed with CUDA events, beside the timer's copy of the same bytes timed the
same way. A profile, not a kparity measurement (back to back, no chain predecessor).

    python3 scripts/conv_step_variants.py
"""

from __future__ import annotations

import numpy as np

import cupy

import gpu_impls
from cases.generate import bench_plan
from cases.model import make_inputs
from gpu_impls.cuda import ssm
from gpu_impls.cuda._module import kernel

BATCHES = 7


def _time(calls) -> float:
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for c in calls:
        c()
    times = []
    for _ in range(BATCHES):
        start.record()
        for c in calls:
            c()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / len(calls))
    return sorted(times)[BATCHES // 2]


def main() -> None:
    impl = gpu_impls.impls()["cuda:kp_conv1d_causal_step"]
    backend = gpu_impls.backend("cuda")
    timer = backend.timer()
    l2 = timer.l2_bytes()
    for w in bench_plan([impl]):
        case = w.case
        d, p = case.dims, case.params
        nbytes = case.spec.bytes(case)
        k = max(1, 4 * l2 // nbytes)
        host = make_inputs(case)
        sets = []
        for _ in range(k):
            ins = {n: backend.to_device(v) for n, v in host.items()}
            outs = {t.name: backend.poisoned(t.shape_of(case), t.dtype(case))
                    for t in case.spec.outputs}
            sets.append((ins, outs))
        vec, chunks = ssm._chunks(d, {**p, "dtype": case.dtype})
        line = [f"{case.label:32s} {nbytes / 1e3:7.1f} kB"]
        for threads in (32, 64, 128, 256):
            kern = kernel(ssm.CONV_SOURCE, "kp_conv1d_causal_step", case.dtype, (),
                          (d["width"],))
            grid = (-(-d["batch"] * chunks // threads),)
            calls = []
            for ins, outs in sets:
                args = (ins["x"], ins["weight"], ins["bias"], ins["conv_state_in"],
                        outs["conv_state_out"], outs["y"], np.int32(d["batch"]),
                        np.int32(d["channels"]), np.int32(chunks), np.int32(bool(p["bias"])),
                        np.int32(bool(p["silu"])), np.int32(1))
                calls.append(lambda a=args: kern(grid, (threads,), a))
            line.append(f"t{threads} {_time(calls):6.2f} us")
        copies = [c for c, _ in timer.copy_calls(nbytes, k)]
        line.append(f"copy {_time(copies):6.2f} us")
        print("  ".join(line))


if __name__ == "__main__":
    main()
