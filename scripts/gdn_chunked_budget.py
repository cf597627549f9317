"""The chunked GDN bound against the ground truth, per T (issue 29): how much of B the composition
and torch's chunked form use, and how B grows with T.

For each T, a `gdn_chunked` case (small heads on CPU: Hk 1, Hv 2, K 16, V 8 by default), its
inputs drawn as the gate draws them; the float64 recurrence (`oracle/gdn_math.py`) is the truth;
B = `oracle.gdn_chunked.truth_bound` (the derived bound on |chunked − truth|, before the store).
Printed per T and output: max |truth|, max B, the budget max(|x − truth| / B) of the composition
(the oracle, T roundings included) and of torch:chunk_gated_delta_rule (f32 throughout), and the
growth of max B relative to the first T. A budget above 1 is a bound that does not hold; one
far below 1 at every T is a bound too loose to catch anything (a vacuous one).

    python scripts/gdn_chunked_budget.py                      # T = 1 ... 16384, bf16, near_one
    python scripts/gdn_chunked_budget.py --dtype f32 --decay mixed --tokens 64,4096
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root

from scripts.budget_growth import DEFAULT_TOKENS, budget, print_growth  # noqa: E402


def measure(tokens: int, dtype: str, params: dict, heads=(1, 2, 16, 8), torch_impl=True) -> dict:
    """One row: the truth, B, and the budgets at `tokens`."""
    from cases.model import Case, make_inputs
    from oracle import gdn_math
    from oracle.gdn import scale_of
    from oracle.gdn_chunked_math import compose
    from oracle.gdn_chunked_truth_bound import truth_bound

    hk, hv, dk, dv = heads
    case = Case.make("gdn_chunked", {"batch": 1, "tokens": tokens, "heads_k": hk, "heads_v": hv,
                                     "dim_k": dk, "dim_v": dv}, dtype, params=params)
    x = make_inputs(case)
    f = {k: np.asarray(v).astype(np.float64) for k, v in x.items()}
    t0 = time.perf_counter()
    comp = compose(x, case)
    o_true, s_true = gdn_math.recurrent(f["q"], f["k"], f["v"], f["g"], f["beta"], f["h0"],
                                        scale_of(case), l2=case.params["l2norm"],
                                        eps=gdn_math.L2NORM_EPS)
    b = truth_bound(x, case, comp)
    row = {"T": tokens, "max|o|": np.abs(o_true).max(), "B_o": b["o"].max(),
           "comp_o": budget(comp["o_exact"], o_true, b["o"]),
           "max|S|": np.abs(s_true).max(), "B_S": b["state"].max(),
           "comp_S": budget(comp["state_exact"], s_true, b["state"])}
    if torch_impl:
        import torch

        from gpu_impls.torch.gdn_chunked import chunk_gated_delta_rule

        tx = {k: torch.from_numpy(np.asarray(v).astype(np.float32)) for k, v in f.items()}
        t_dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
        q, k, v = (tx[n].to(t_dtype) for n in ("q", "k", "v"))
        o, s = chunk_gated_delta_rule(q, k, v, tx["g"], tx["beta"], tx["h0"],
                                      case.params["chunk"], scale_of(case),
                                      case.params["l2norm"])
        row["torch_o"] = budget(o.double().numpy(), o_true, b["o"])
        row["torch_S"] = budget(s.double().numpy(), s_true, b["state"])
    row["seconds"] = time.perf_counter() - t0
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)))
    ap.add_argument("--dtype", default="bf16", choices=("f32", "f16", "bf16"))
    ap.add_argument("--decay", default="near_one", choices=("mixed", "near_one", "near_zero"))
    ap.add_argument("--beta", default="uniform", choices=("uniform", "near_zero", "near_one"))
    ap.add_argument("--chunk", type=int, default=64, choices=(16, 32, 64))
    ap.add_argument("--heads", default="1,2,16,8", help="Hk,Hv,K,V")
    ap.add_argument("--no-torch", action="store_true", help="the composition only")
    args = ap.parse_args(argv)
    heads = tuple(int(x) for x in args.heads.split(","))
    params = {"decay": args.decay, "beta": args.beta, "chunk": args.chunk}
    cols = ("T", "max|o|", "B_o", "comp_o", "torch_o", "max|S|", "B_S", "comp_S", "torch_S",
            "growth", "seconds")
    print_growth(f"# gdn_chunked vs the recurrence: {args.dtype}, Hk,Hv,K,V = {heads}, {params}",
                 cols, (measure(int(t), args.dtype, params, heads, not args.no_torch)
                        for t in args.tokens.split(",")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
