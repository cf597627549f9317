"""Where a process's first torch.compile goes on a CUDA machine (issue 48):
`python3 scripts/compile_start.py [--profile N]`.

The gate's compiled torch impls each took about 11 s alone on the H100 host for their first
test in a process, Inductor's cache warm or cold (benchmarks/README.md "Tiers"), against 2.6 s for
the same first compile on a 2-core CPU. This times the phases of one process: importing torch
and starting CUDA, importing Dynamo and Inductor, the first compile and call of an RMSNorm
(the gate's `torch:rms_norm_compiled` graph, bf16 5 x 2046) and a second, different compile;
`--profile N` adds cProfile's N costliest calls of the first compile, cumulative and own
time. Run it twice on one TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR, the first time empty,
to split the cacheable work from the rest.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time


def rms(x, w):
    import torch

    xf = x.float()
    return (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    import torch

    x = torch.randn(5, 2046, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2046, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401

    t2 = time.perf_counter()
    first = torch.compile(rms, dynamic=False)
    profile = cProfile.Profile() if args.profile else None
    if profile:
        profile.enable()
    first(x, w)
    torch.cuda.synchronize()
    if profile:
        profile.disable()
    t3 = time.perf_counter()
    second = torch.compile(lambda x, w: rms(x, w) * 2, dynamic=False)
    second(x, w)
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    print(f"torch + CUDA start {t1 - t0:.2f} s, Dynamo + Inductor import {t2 - t1:.2f} s, "
          f"first compile + call {t3 - t2:.2f} s{' (profiled)' if profile else ''}, "
          f"second compile + call {t4 - t3:.2f} s")
    for key in ("cumulative", "tottime") if profile else ():
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(key).print_stats(args.profile)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
