"""The chunked SSD's bound against the ground truth, per T (issue 30): how much of it the torch
listing and the worst admissible kernel use, and how it grows with T.

For each T, an `ssd_chunked` case (narrow heads on CPU by default: H 2, P 4, G 1, N 8) on the
first T tokens of one draw at the largest T (drawn as the gate draws them: every T sees the same
heads, decays and initial state, so the growth is the bound's, not the draw's). The float64
recurrence (`oracle/ssd_math.py`, `ssd_scan`'s oracle) is the truth; B = the op's bound
(`oracle/ssd_chunked.py`'s kernel model, for torch's numerics) widened by |chunk oracle − truth|
(float64 noise). Printed per T: max |truth| and max B of y and of the final state; the budget
max(|x − truth| / B) of torch:ssd_chunked (the listing, f32 throughout) and of the worst
admissible kernel (every rounding off by its whole charge, all up, in the kernel path's form and
the listing's: the larger); and the growth of max B_S over the first T's. A budget above 1 is a
bound that does not hold; the worst kernel's near 1 shows the bound is what the contract admits
(the listing's own errors, random in sign, use less of it).

    python scripts/ssd_chunked_budget.py                          # T = 1 ... 16384, f32, slow
    python scripts/ssd_chunked_budget.py --dtype bf16 --dt mixed --tokens 64,4096 --no-worst
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root

from scripts.budget_growth import DEFAULT_TOKENS, budget, print_growth  # noqa: E402

NARROW = (2, 4, 1, 8)  # heads, dim_p, groups, dim_n


def draw(tokens: int, dtype: str, params: dict, heads=NARROW) -> dict:
    """The inputs of an `ssd_chunked` case at `tokens` (`measure` takes their prefixes)."""
    from cases.model import Case, make_inputs

    return make_inputs(Case.make("ssd_chunked", _dims(tokens, heads), dtype, params=params))


def _dims(tokens: int, heads) -> dict:
    h, p, g, n = heads
    return {"batch": 1, "tokens": tokens, "heads": h, "dim_p": p, "groups": g, "dim_n": n}


def prefix(inputs: dict, tokens: int) -> dict:
    """The inputs over the first `tokens` tokens (per-head tensors and h0 as they are)."""
    seq = ("x", "dt_raw", "Bm", "Cm", "z")
    return {k: (v[:, :tokens] if k in seq and np.size(v) else v) for k, v in inputs.items()}


def measure(tokens: int, dtype: str, params: dict, heads=NARROW, worst=True,
            inputs: dict | None = None) -> dict:
    """One row: the truth, B, and the budgets at `tokens`, on `inputs` (default: a fresh draw)."""
    from cases.model import Case
    from gpu_impls import backend, impls
    from oracle.numerics import Choices, Model, Numerics, Worst, adverse_store
    from oracle.ssd_chunked import chunked_kernel
    from runners.correctness import run_impl

    dims = _dims(tokens, heads)
    case = Case.make("ssd_chunked", dims, dtype, params=params)
    scan = Case.make("ssd_scan", dims, dtype, params={k: v for k, v in params.items()
                                                      if k not in ("chunk", "dots")})
    x = prefix(inputs, tokens) if inputs is not None else draw(tokens, dtype, params, heads)
    t0 = time.perf_counter()
    truth = scan.spec.oracle(x, scan)
    exact = case.spec.oracle(x, case)
    impl = impls()["torch:ssd_chunked"]
    numerics = Numerics().on("torch")
    bound = case.spec.bounds(x, exact, case, numerics)
    wide = {k: bound[k] + np.abs(exact[k] - truth[k]) for k in bound}
    got = run_impl(impl, backend("torch"), case, x)
    row = {"T": tokens, "max|y|": np.abs(truth["y"]).max(), "B_y": wide["y"].max(),
           "torch_y": budget(got["y"], truth["y"], wide["y"]),
           "max|S|": np.abs(truth["state"]).max(), "B_S": wide["state"].max(),
           "torch_S": budget(got["state"], truth["state"], wide["state"])}
    row["torch"] = max(row["torch_y"], row["torch_S"])
    row["oracle"] = max(budget(exact[k], truth[k], wide[k]) for k in ("y", "state"))
    if worst:  # all up, in each form (the kernel path's, the listing's): the larger
        for form in (0, 1):
            with np.errstate(all="ignore"):
                values = chunked_kernel(Worst(Model(False, numerics), Choices(form=form)), x,
                                        case)
            for k, col in (("y", "worst_y"), ("state", "worst_S")):
                out = adverse_store(values[k], case.spec.output_dtype(k, case))
                row[col] = max(row.get(col, 0.0), budget(out, truth[k], wide[k]))
    row["seconds"] = time.perf_counter() - t0
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)))
    ap.add_argument("--dtype", default="f32", choices=("f32", "f16", "bf16"))
    ap.add_argument("--dt", default="slow", choices=("mixed", "fast", "slow"))
    ap.add_argument("--initial-state", default="given", choices=("zero", "given", "large"))
    ap.add_argument("--chunk", type=int, default=64, choices=(64, 128, 256))
    ap.add_argument("--dots", default="f32", choices=("f32", "T"))
    ap.add_argument("--heads", default=",".join(map(str, NARROW)), help="H,P,G,N")
    ap.add_argument("--no-worst", action="store_true", help="skip the worst admissible kernel")
    args = ap.parse_args(argv)
    heads = tuple(int(v) for v in args.heads.split(","))
    params = {"dt": args.dt, "initial_state": args.initial_state, "chunk": args.chunk,
              "dots": args.dots}
    cols = ("T", "max|y|", "B_y", "torch_y", "worst_y", "max|S|", "B_S", "torch_S", "worst_S",
            "growth", "seconds")
    tokens = [int(v) for v in args.tokens.split(",")]
    inputs = draw(max(tokens), args.dtype, params, heads)
    print_growth(f"# ssd_chunked vs the recurrence: {args.dtype}, H,P,G,N = {heads}, {params}",
                 cols, (measure(t, args.dtype, params, heads, not args.no_worst, inputs)
                        for t in tokens))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
