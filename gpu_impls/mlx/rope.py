"""MLX RoPE through `mx.fast.rope` (`oracle/rope.py`).

`mx.fast.rope(x, dims, traditional=, base=, scale=, offset=, freqs=)` rotates the first `dims`
of the last axis (partial rotary) with the rotate-half pairing, or the interleaved one with
`traditional=True`; `offset` may be a vector of one position per batch entry, so each token is
its own batch entry here (q as [tokens, heads, 1, D]) and the positions are the offsets. Scaled
tables go in through `freqs` (their reciprocals: MLX takes 1 / inv_freq); it has no attention
factor: mlx-lm's YarnRoPE multiplies x by it first.

`mlx:fast_rope` is what mlx-lm runs: `nn.RoPE`'s `base=theta` for a plain table (MLX computes
exp(-i ln(theta) / (R/2)) in f32 with its fast exp: up to 18 ULPs off where |ln inv| ~ 11,
1.45 (1 + |ln inv|) at most: within the default 2 (1 + |ln inv|), tests/test_rope.py),
Llama3RoPE's and YarnRoPE's `freqs` built in MLX
f32 ops, the attention factor applied to x in T, x in T. On the CPU, MLX evaluates the op
through its fallback, which casts cos and sin to T and multiplies in T: compute="T". (MLX's Metal
and CUDA kernels compute in f32 and round once, which passes "T" too.)

`mlx:fast_rope_f32` upcasts q and k to f32, passes every table as `freqs` (computed in float64,
rounded to f32: the default 2 ULPs), applies the attention factor in f32 and rounds to T once
(compute="f32").
"""

from __future__ import annotations

import math

import numpy as np

from gpu_impls import register
from gpu_impls.impl import Impl
from gpu_impls.torch.rope import rope_contract
from oracle.rope import attention_factor, inv_freq, rotary_dim, yarn_range


def mlx_lm_freqs(case, mx):
    """mlx-lm's Llama3RoPE / YarnRoPE `_freqs` (1 / inv_freq), in MLX f32 ops."""
    p, dims = case.params, rotary_dim(case)
    freqs = p["theta"] ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    factor = p["factor"]
    if p["scaling"] == "llama3":
        low, high, orig = p["low_freq_factor"], p["high_freq_factor"], p["original_max_position"]
        wavelens = 2 * math.pi * freqs
        freqs = mx.where(wavelens > orig / low, freqs * factor, freqs)
        medium = (wavelens > orig / high) & (wavelens < orig / low)
        smooth = (orig / wavelens - low) / (high - low)
        return mx.where(medium, freqs / ((1 - smooth) / factor + smooth), freqs)
    low, high = yarn_range(case)
    ramp = mx.clip((mx.arange(dims // 2, dtype=mx.float32) - low)
                   / ((high + 0.001 if high == low else high) - low), 0, 1)
    mask = 1.0 - ramp
    inter = factor * freqs
    return (inter * freqs) / (inter * mask + freqs * (1 - mask))


def _per_token(x, positions, case, mx, **table):
    """mx.fast.rope over [tokens, heads, 1, D], token t at offset positions[t]."""
    t, h, d = x.shape
    out = mx.fast.rope(x.reshape(t, h, 1, d), rotary_dim(case),
                       traditional=case.params["pairing"] == "gptj", scale=1.0,
                       offset=positions, **table)
    return out.reshape(t, h, d)


def _scaled_head(x, m: float, case):
    """x with its rotated prefix times m (the attention factor), in x's dtype."""
    import mlx.core as mx

    r = rotary_dim(case)
    return mx.concatenate([x[..., :r] * m, x[..., r:]], axis=-1) if m != 1.0 else x


def _fast_rope(launch, inputs, outputs, case):
    import mlx.core as mx

    if case.params["scaling"] == "none":
        table = {"base": case.params["theta"]}
    else:
        table = {"base": None, "freqs": mlx_lm_freqs(case, mx)}
    m = attention_factor(case)
    return {name: _per_token(_scaled_head(inputs[x], m, case), inputs["positions"], case, mx,
                             **table)
            for name, x in (("q_out", "q"), ("k_out", "k"))}


def _fast_rope_f32(launch, inputs, outputs, case):
    import mlx.core as mx

    freqs = mx.array((1.0 / inv_freq(case)).astype(np.float32))
    m = attention_factor(case)
    out = {}
    for name, x in (("q_out", "q"), ("k_out", "k")):
        x32 = _scaled_head(inputs[x].astype(mx.float32), m, case)
        out[name] = _per_token(x32, inputs["positions"], case, mx, base=None,
                               freqs=freqs).astype(inputs[x].dtype)
    return out


register(
    Impl("rope", "mlx", "fast_rope", _fast_rope,
         rope_contract("T", "mlx:fast_rope_f32 (x upcast to f32)"),
         doc="mx.fast.rope as mlx-lm calls it: base= or mlx-lm's freqs, x in T"),
    Impl("rope", "mlx", "fast_rope_f32", _fast_rope_f32,
         rope_contract("f32", "mlx:fast_rope (x in T); an f32 impl's T cases add only a "
                              "looser bound"),
         doc="mx.fast.rope on q, k upcast to f32, float64 table as freqs, rounded to T once"),
)
