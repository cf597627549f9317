"""Where a model's decode step spends its GPU time (issue 28's roofline gap): the kernels of
`--steps` CUDA-graph replays of one plan's decode step, timed by the CUDA profiler (CUPTI, via
torch.profiler: every kernel in the process, CuPy's included), summed per kernel name, beside
the step's wall time. A kernel's share of the step and the step's time outside any kernel (the
gaps between dependent kernels) are what a fusion or a faster kernel can take back.

    python3 scripts/model_profile.py --model synthetic:llama3-8b --dtype bf16 [--batch 8]

Prints one table (kernel, calls per step, µs per step, % of the step) and the step's wall time
and bytes; the roofline's numerator is `models.decode_speed.step_bytes`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo's packages


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="synthetic:llama3-8b")
    ap.add_argument("--plan", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--batch", default="1", help="batch sizes, comma-separated (1,8)")
    ap.add_argument("--position", type=int, default=32, help="the step's position")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    from models.gate import load_model

    model = load_model(args.model)
    for batch in map(int, args.batch.split(",")):
        profile(model, args, batch)


def profile(model, args, batch: int) -> None:
    import torch

    from models.decode import Decoder
    from models.decode_speed import step_bytes

    args.batch = batch
    p = args.position
    dec = Decoder(model.weights, args.plan, args.dtype, max_len=p + 2, batch=args.batch)
    dec.use_graph()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.weights.config.vocab, (args.batch, p + 2))
    dec.load(ids if args.batch > 1 else ids[0])
    for q in range(p + 1):  # fill the cache; the graph is captured and verified on the way
        dec.synchronize(dec.forward(q))
    walls = []
    for _ in range(args.steps):
        dec.synchronize()
        t0 = time.perf_counter()
        dec.synchronize(dec.forward(p))
        walls.append((time.perf_counter() - t0) * 1e6)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            dec.synchronize(dec.forward(p))
    per = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name.split("(")[0][:60]
            per[name][0] += 1
            per[name][1] += next(getattr(e, a) for a in ("device_time_total", "cuda_time_total",
                                                         "device_time") if hasattr(e, a))
    if not per:  # the profiler's own table, to see what it recorded
        print(prof.key_averages().table(row_limit=40))
    wall = statistics.median(walls)
    busy = sum(t for _, t in per.values()) / args.steps
    print(f"{args.model} plan {args.plan} {args.dtype} batch {args.batch} position {p} "
          f"graph={dec.graph} notes={dec.notes}")
    print(f"step wall {wall:.1f} µs (median of {args.steps}); kernels busy {busy:.1f} µs; "
          f"outside kernels {wall - busy:.1f} µs; bytes {step_bytes(dec, p) / 1e9:.3f} GB")
    print(f"{'kernel':60s} {'calls':>6s} {'µs/step':>9s} {'% step':>7s}")
    for name, (calls, total) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        us = total / args.steps
        print(f"{name:60s} {calls // args.steps:6d} {us:9.1f} {100 * us / wall:7.1f}")


if __name__ == "__main__":
    main()
