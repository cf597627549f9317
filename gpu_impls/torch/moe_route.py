"""PyTorch MoE router and dispatch (`oracle/moe_route.py`), as users write them: the HF router
(softmax or sigmoid + correction bias in f32, `torch.topk`, renormalise, scale), the dispatch
as a stable `argsort` of the flat expert ids with `bincount`, the permute an `index_select`, the
unpermute a gather of each token's k rows and a weighted sum over k in f32, stored once.

Two departures from the HF text, both the op's contract: NaN scores are set to -inf before
`topk` (torch.topk ranks NaN first; the contract says NaN never wins), and topk's order at exact
ties is left as torch gives it (the comparator accepts either expert there and flags it)."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl


def _nan_last(torch, scores):
    """NaN as -inf, so that `topk` (which ranks NaN first) never picks it: the group stage's
    scores too (a group's inf + -inf is NaN), or a NaN group wins the groups (found by the
    nightly fuzz: expert 1 of a NaN group picked over the oracle's 23)."""
    return torch.nan_to_num(scores, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))


def router_scores(torch, logits, bias, case):
    """(selection scores, weight scores) in f32 [T, E], dropped groups at -inf."""
    l = logits.float()
    if case.params["scoring"] != "sigmoid_bias":
        p = torch.softmax(l, dim=-1)
        return p, p
    s = torch.sigmoid(l)
    sel = _nan_last(torch, s + bias.float())
    groups = case.dims["groups"]
    if groups > 1:
        t, e = sel.shape
        g = sel.view(t, groups, e // groups)
        gscore = _nan_last(torch, g.topk(min(2, e // groups), dim=-1).values.sum(-1))
        keep = gscore.topk(case.params["topk_group"], dim=-1).indices
        mask = torch.zeros_like(gscore, dtype=torch.bool).scatter_(1, keep, True)
        sel = sel.masked_fill(~mask.repeat_interleave(e // groups, dim=1), float("-inf"))
    return sel, s


def _router(launch, inputs, outputs, case):
    import torch

    sel, w = router_scores(torch, inputs["logits"], inputs["correction_bias"], case)
    sel = _nan_last(torch, sel)  # softmax's NaN too
    ids = torch.topk(sel, case.dims["top_k"], dim=-1).indices
    weights = w.gather(1, ids)
    if case.params["norm_topk_prob"]:
        eps = 1e-20 if case.params["scoring"] == "sigmoid_bias" else 0.0
        weights = weights / (weights.sum(-1, keepdim=True) + eps)
    weights = weights * float(case.params["routed_scaling_factor"])
    return {"ids": ids.to(torch.int32), "weights": weights}


def _dispatch(launch, inputs, outputs, case):
    import torch

    e = inputs["ids"].reshape(-1).long()
    counts = torch.bincount(e, minlength=case.dims["experts"])
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    perm = torch.argsort(e, stable=True)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return {name: v.to(torch.int32) for name, v in
            (("counts", counts), ("offsets", offsets), ("perm", perm), ("inv_perm", inv))}


def _permute(launch, inputs, outputs, case):
    rows = inputs["perm"].long() // case.dims["top_k"]
    return {"x_sorted": inputs["x"].index_select(0, rows)}


def _unpermute(launch, inputs, outputs, case):
    t, k = case.dims["tokens"], case.dims["top_k"]
    y = inputs["y_sorted"]
    rows = y.index_select(0, inputs["inv_perm"].long()).float().view(t, k, -1)
    out = (rows * inputs["weights"].float().unsqueeze(-1)).sum(dim=1)
    return {"out": out.to(y.dtype)}


def _scatter_add(launch, inputs, outputs, case):
    """HF's combine (`modeling_nemotron_h.py`'s MoE): each sorted row's weighted
    product in f32, `index_add_` into an f32 buffer at its token, one cast. On a CPU index_add_
    adds the rows in index order: the op's declared order (oracle/moe_route.py), the same bits
    on every run."""
    import torch

    t, k = case.dims["tokens"], case.dims["top_k"]
    y, perm = inputs["y_sorted"], inputs["perm"].long()
    src = y.float() * inputs["weights"].float().reshape(-1)[perm].unsqueeze(-1)
    out = torch.zeros(t, y.shape[-1], dtype=torch.float32, device=y.device)
    out.index_add_(0, perm // k, src)
    return {"out": out.to(y.dtype)}


register(Impl("moe_router", "torch", "moe_router", _router,
              doc="HF router: softmax / sigmoid + bias in f32, torch.topk, renormalise, scale"))
register(Impl("moe_dispatch", "torch", "moe_dispatch", _dispatch,
              host_sync="torch.bincount on CUDA reads the ids' max back to size its output",
              doc="bincount, cumsum, stable argsort of the flat ids and its inverse"))
register(Impl("moe_permute", "torch", "moe_permute", _permute,
              doc="index_select of each sorted slot's token row"))
register(Impl("moe_unpermute", "torch", "moe_unpermute", _unpermute,
              doc="gather each token's k rows, weight in f32, sum over k, store once"))
register(Impl("moe_scatter_add", "torch", "moe_scatter_add", _scatter_add,
              doc="weighted rows in f32, index_add_ at their tokens in sorted order, one cast"))
