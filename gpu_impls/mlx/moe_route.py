"""MLX MoE router and dispatch (`oracle/moe_route.py`) in `mx` ops, as mlx-lm writes them: the
router's softmax / sigmoid + bias in f32 and `mx.argpartition` for the top-k (mlx-lm's
SwitchGLU routing), NaN scores at -inf first (the contract: NaN never wins); the dispatch a
stable `mx.argsort` of the flat ids (MLX's sort is stable) with counts from a one-hot sum; the
permute `mx.take`; the unpermute a gather and a weighted f32 sum over k, stored once."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl


def _scores(mx, logits, bias, case):
    l = logits.astype(mx.float32)
    if case.params["scoring"] != "sigmoid_bias":
        p = mx.softmax(l, axis=-1, precise=True)
        return p, p
    s = mx.sigmoid(l)
    sel = s + bias.astype(mx.float32)
    groups = case.dims["groups"]
    if groups > 1:
        t, e = sel.shape
        g = mx.sort(sel.reshape(t, groups, e // groups), axis=-1)[..., -min(2, e // groups):]
        gscore = g.sum(-1)
        drop = mx.argpartition(-gscore, case.params["topk_group"] - 1, axis=-1)
        drop = drop[:, case.params["topk_group"]:]
        mask = mx.zeros((t, groups), dtype=mx.bool_)
        mask = mx.put_along_axis(mask, drop, mx.array(True), axis=-1)
        sel = mx.where(mx.repeat(mask, e // groups, axis=1), -mx.inf, sel)
    return sel, s


def _router(launch, inputs, outputs, case):
    import mlx.core as mx

    k = case.dims["top_k"]
    sel, w = _scores(mx, inputs["logits"], inputs["correction_bias"], case)
    sel = mx.where(mx.isnan(sel), -mx.inf, sel)
    ids = mx.argpartition(-sel, k - 1, axis=-1)[:, :k]
    weights = mx.take_along_axis(w, ids, axis=-1)
    if case.params["norm_topk_prob"]:
        eps = 1e-20 if case.params["scoring"] == "sigmoid_bias" else 0.0
        weights = weights / (weights.sum(-1, keepdims=True) + eps)
    weights = weights * float(case.params["routed_scaling_factor"])
    return {"ids": ids.astype(mx.int32), "weights": weights}


def _dispatch(launch, inputs, outputs, case):
    import mlx.core as mx

    e = inputs["ids"].reshape(-1)
    n_exp = case.dims["experts"]
    counts = (e[:, None] == mx.arange(n_exp)[None, :]).astype(mx.int32).sum(0)
    offsets = mx.concatenate([mx.zeros((1,), dtype=mx.int32), mx.cumsum(counts)])
    perm = mx.argsort(e)
    inv = mx.argsort(perm)
    return {"counts": counts, "offsets": offsets.astype(mx.int32),
            "perm": perm.astype(mx.int32), "inv_perm": inv.astype(mx.int32)}


def _permute(launch, inputs, outputs, case):
    import mlx.core as mx

    rows = inputs["perm"] // case.dims["top_k"]
    return {"x_sorted": mx.take(inputs["x"], rows, axis=0)}


def _unpermute(launch, inputs, outputs, case):
    import mlx.core as mx

    t, k = case.dims["tokens"], case.dims["top_k"]
    y = inputs["y_sorted"]
    rows = mx.take(y, inputs["inv_perm"], axis=0).astype(mx.float32).reshape(t, k, -1)
    out = (rows * inputs["weights"].astype(mx.float32)[:, :, None]).sum(axis=1)
    return {"out": out.astype(y.dtype)}


def _scatter_add(launch, inputs, outputs, case):
    """Weighted rows in f32, `.at[].add` into an f32 buffer at their tokens, one cast."""
    import mlx.core as mx

    t, k = case.dims["tokens"], case.dims["top_k"]
    y, perm = inputs["y_sorted"], inputs["perm"]
    src = y.astype(mx.float32) * mx.take(inputs["weights"].astype(mx.float32).reshape(-1),
                                         perm)[:, None]
    out = mx.zeros((t, y.shape[-1]), dtype=mx.float32).at[perm // k].add(src)
    return {"out": out.astype(y.dtype)}


register(Impl("moe_router", "mlx", "moe_router", _router,
              doc="softmax / sigmoid + bias in f32, argpartition top-k, renormalise, scale"))
register(Impl("moe_dispatch", "mlx", "moe_dispatch", _dispatch,
              doc="one-hot counts, cumsum, stable argsort of the flat ids and its inverse"))
register(Impl("moe_permute", "mlx", "moe_permute", _permute, doc="mx.take of the sorted rows"))
register(Impl("moe_unpermute", "mlx", "moe_unpermute", _unpermute,
              doc="gather each token's k rows, weight in f32, sum over k, store once"))
register(Impl("moe_scatter_add", "mlx", "moe_scatter_add", _scatter_add,
              doc="weighted rows in f32, .at[].add at their tokens, one cast"))
