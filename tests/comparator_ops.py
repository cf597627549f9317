"""Test-only ops for the comparators (`oracle/comparators.py`), with torch CPU impls and the
mutants that must fail. Not registered at import: `registered()` adds the ops to the op registry
for a test and removes them after, so no other test ever sees them.

* `topk_route`: MoE top-k routing. logits [tokens, experts] in T -> `ids` [tokens, k] (i32,
  `TopKSet`) and `weights` [tokens, k] (T, `Gathered`: the probability of each chosen expert).
  The `near_tie` distribution plants, in every 4th row, the k-th and (k+1)-th logits one ULP of
  T apart.
* `argsort_rows`: x [rows, n] in T -> `order` [rows, n] (i32, `Exact`): the stable argsort.
"""

from __future__ import annotations

import contextlib

import numpy as np

from gpu_impls.impl import Impl
from oracle import spec as op_spec
from oracle.comparators import Exact, Gathered, TopKSet
from oracle.dtypes import round_to, spacing
from oracle.spec import OpSpec, TensorSpec

TIE = 0.375  # in [0.25, 0.5): one ULP of T there moves p by less than half an ULP of T of p
TIE_EVERY = 4  # rows 0, 4, 8... carry the planted near-tie
U32 = 2.0 ** -24  # f32 unit roundoff


def topk_route(inputs: dict, case) -> dict:
    """p = softmax(logits) over each token's experts; `ids` the k experts of largest p (in
    descending p, ties to the lower id), `weights` = p at `ids`. `probs` (p over every expert)
    is what `TopKSet` and `Gathered` read."""
    logits = inputs["logits"].astype(np.float64)
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p = z / z.sum(axis=-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :case.dims["k"]]
    return {"ids": ids.astype(np.float64), "weights": np.take_along_axis(p, ids, -1),
            "probs": p}


def route_bound(inputs: dict, exact: dict, case) -> dict:
    """A hand bound on every expert's p as the kernel stores it, twice this worst case: the f32
    kernel computes d = l - max (relative error u), exp(d) (|d| u + 2 u ULP error), a sum of n
    terms in any order ((n - 1) u), one division (u):

        |p32 - p| <= p (|d_i| + max_j |d_j| + n + 5) u,   u = 2^-24

    then stores p32 in T (half an ULP of T at the largest p32 can be). The selection is made on
    the stored p, so this bounds the scores of `ids` and the values of `weights` alike."""
    logits = inputs["logits"].astype(np.float64)
    d = np.abs(logits - logits.max(axis=-1, keepdims=True))
    p = exact["probs"]
    f32 = 2 * p * (d + d.max(axis=-1, keepdims=True) + logits.shape[-1] + 5) * U32
    b = f32 + 0.5 * spacing(p + f32, case.dtype)
    return {"ids": b, "weights": b}


def plant_ties(inputs: dict, case) -> dict:
    """`near_tie`: in rows 0, 4, 8... the row is shifted (softmax is shift-invariant) so that its
    k-th logit is TIE, its (k+1)-th one ULP of T below; the others are kept clear of the pair."""
    if case.dist != "near_tie":
        return inputs
    k, dtype = case.dims["k"], case.dtype
    step = float(spacing(np.array(TIE), dtype))
    logits = inputs["logits"].astype(np.float64)
    for r in range(0, len(logits), TIE_EVERY):
        order = np.argsort(-logits[r], kind="stable")
        row = logits[r] - logits[r, order[k - 1]] + TIE
        row[order[:k - 1]] = np.maximum(row[order[:k - 1]], TIE + step)
        row[order[k + 1:]] = np.minimum(row[order[k + 1:]], TIE - 2 * step)
        row[order[k - 1]], row[order[k]] = TIE, TIE - step
        logits[r] = row
    return {**inputs, "logits": round_to(logits, dtype)}


TOPK_ROUTE = OpSpec(
    name="topk_route", family="test_moe", dims=("tokens", "experts", "k"),
    inputs=(TensorSpec("logits", lambda d: (d["tokens"], d["experts"])),),
    outputs=(TensorSpec("ids", lambda d: (d["tokens"], d["k"]), role="i32",
                        comparator=TopKSet(scores="probs")),
             TensorSpec("weights", lambda d: (d["tokens"], d["k"]),
                        comparator=Gathered(ids="ids", values="probs"))),
    oracle=topk_route, tolerance=route_bound, plant=plant_ties,
    bytes=lambda case: 0, flops=lambda case: 0, doc=topk_route.__doc__)


def route_impl(name: str = "topk") -> Impl:
    """torch: p = softmax(logits) in f32, stored in T; torch.topk of the stored p."""

    def run(launch, inputs, outputs, case):
        import torch

        p = torch.softmax(inputs["logits"].float(), dim=-1).to(inputs["logits"].dtype)
        weights, ids = torch.topk(p, case.dims["k"], dim=-1)
        return {"ids": ids.to(torch.int32), "weights": weights}

    return Impl("topk_route", "torch", name, run)


def swapping_impl(name: str, rows) -> Impl:
    """torch: experts ranked by torch.topk of the logits (the order of p), but in each row of
    `rows(case)` the (k+1)-th expert takes the k-th's place; weights = the stored p of the
    experts it picked. At a near-tie row a legitimate choice, anywhere else a wrong one."""

    def run(launch, inputs, outputs, case):
        import torch

        k = case.dims["k"]
        p = torch.softmax(inputs["logits"].float(), dim=-1).to(inputs["logits"].dtype)
        ids = torch.topk(inputs["logits"], k + 1, dim=-1).indices
        for r in rows(case):
            ids[r, k - 1] = ids[r, k].item()
        ids = ids[:, :k].contiguous()
        return {"ids": ids.to(torch.int32), "weights": torch.gather(p, -1, ids)}

    return Impl("topk_route", "torch", name, run)


def argsort_rows(inputs: dict, case) -> dict:
    """The stable argsort of each row of x (ties in index order)."""
    return {"order": np.argsort(inputs["x"].astype(np.float64), axis=-1,
                                kind="stable").astype(np.float64)}


ARGSORT_ROWS = OpSpec(
    name="argsort_rows", family="test_moe", dims=("rows", "n"),
    inputs=(TensorSpec("x", lambda d: (d["rows"], d["n"])),),
    outputs=(TensorSpec("order", lambda d: (d["rows"], d["n"]), role="i32",
                        comparator=Exact()),),
    oracle=argsort_rows, tolerance=lambda inputs, exact, case: {"order": 0.0},
    bytes=lambda case: 0, flops=lambda case: 0)


def argsort_impl(name: str = "argsort", swap: tuple[int, int, int] | None = None) -> Impl:
    """torch.argsort(stable=True); `swap` = (row, i, j) exchanges two entries of one row."""

    def run(launch, inputs, outputs, case):
        import torch

        order = torch.argsort(inputs["x"], dim=-1, stable=True).to(torch.int32)
        if swap is not None:
            r, i, j = swap
            order[r, i], order[r, j] = order[r, j].item(), order[r, i].item()
        return {"order": order}

    return Impl("argsort_rows", "torch", name, run)


@contextlib.contextmanager
def registered(*specs: OpSpec):
    """The ops in the op registry for the duration of the block."""
    op_spec.registry()  # the real ops first: load_all must not find ours half-registered
    for spec in specs:
        op_spec.register(spec)
    try:
        yield
    finally:
        for spec in specs:
            op_spec._REGISTRY.pop(spec.name, None)
