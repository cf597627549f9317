"""MLX attention for decode (`oracle/attention.py`): `mx.fast.scaled_dot_product_attention`.

mlx:fast_sdpa casts q, k and v to f32 first: on a CPU, MLX 0.32 has no fused kernel and its
fallback computes q·scale, the scores and the probabilities in the input dtype (measured in bf16:
errors 0.013 of Σ p|v|, 5x those of torch's f32 softmax), a contract of its own (HF eager's),
not this op's. In f32 it is the op's: scores, softmax and P·V in f32, rounded to T once. Lengths
and the window are a boolean mask, sinks `mx.fast`'s own `sinks` argument. On Metal the fused
kernel (one simdgroup per 32 keys, each online per key, then a combine) rescales at most once
per 32 keys: `softmax_block=32` holds on both.

mlx:paged_fast_sdpa gathers the pages first (`mx.take`); mlx:attn_combine is the split-KV
combine in f32; mlx:fast_sdpa_varlen runs each packed sequence alone (mask "causal", which MLX
aligns bottom-right as the op does, or a boolean one for a window).
"""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl
from gpu_impls.torch.attention import EAGER_CONTRACT
from oracle.attention import scale_of
from oracle.numerics import Numerics

FUSED = Numerics(softmax_block=32)
CPU = ("cpu",)  # batch invariance verified on a CPU (tests/test_attention.py)


def attended_mask(lengths, max_len: int, params: dict):
    import mlx.core as mx

    t = mx.arange(max_len)[None, :]
    n = lengths.astype(mx.int32)[:, None]
    mask = t < n
    if params["window"]:
        mask = mask & ((t >= n - params["window"]) | (t < params["sink_end"]))
    return mask


def cache(inputs, case):
    """(k, v) [B, Hkv, L, D] of either layout (paged: gathered)."""
    import mlx.core as mx

    if "k" in inputs:
        return inputs["k"], inputs["v"]
    table = inputs["page_table"]
    b, pages = table.shape

    def gather(pool):
        g = mx.take(pool, table.reshape(-1), axis=0)  # [B·pages, Hkv, P, D]
        g = g.reshape(b, pages, pool.shape[1], pool.shape[2], pool.shape[3])
        return g.transpose(0, 2, 1, 3, 4).reshape(b, pool.shape[1], pages * pool.shape[2],
                                                  pool.shape[3])
    return gather(inputs["k_pages"]), gather(inputs["v_pages"])


def _fast_sdpa(launch, inputs, outputs, case):
    import mlx.core as mx

    k, v = cache(inputs, case)
    q = inputs["q"]
    mask = attended_mask(inputs["lengths"], k.shape[2], case.params)[:, None, None, :]
    sinks = inputs["sinks"].astype(mx.float32) if case.params["sinks"] else None
    out = mx.fast.scaled_dot_product_attention(
        q.astype(mx.float32)[:, :, None], k.astype(mx.float32), v.astype(mx.float32),
        scale=scale_of(case), mask=mask, sinks=sinks)
    return {"out": out[:, :, 0].astype(q.dtype)}


def _combine(launch, inputs, outputs, case):
    import mlx.core as mx

    o, m, l = (inputs[k].astype(mx.float32) for k in ("o", "m", "l"))
    top = m.max(axis=-1)
    if case.params["sinks"]:
        top = mx.maximum(top, inputs["sinks"][None, :])
    safe = mx.where(mx.isinf(top) & (top < 0), 0.0, top)
    c = mx.exp(m - safe[..., None])
    w = c * l
    total = w.sum(axis=-1)
    if case.params["sinks"]:
        total = total + mx.exp(inputs["sinks"][None, :] - safe)
    acc = ((w if case.params["normalized"] else c)[..., None] * o).sum(axis=-2)
    out = (acc / total[..., None]).astype(_out_dtype(case))
    return {"out": out, "lse": safe + mx.log(total)}


def _out_dtype(case):
    import mlx.core as mx

    return {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}[case.dtype]


def _fast_sdpa_varlen(launch, inputs, outputs, case):
    """mx.fast sdpa per sequence in f32: mask "causal" (MLX's is bottom-right aligned) where
    there is no window, a boolean mask otherwise."""
    import mlx.core as mx

    from oracle.attention import varlen_spans

    q, k, v = (inputs[n].astype(mx.float32) for n in ("q", "k", "v"))
    rows = []
    for qo, q_len, ko, k_len in varlen_spans(case):
        mask = None
        if case.params["window"]:
            i = mx.arange(q_len)[:, None] + (k_len - q_len)
            j = mx.arange(k_len)[None, :]
            mask = (j > i - case.params["window"]) & ((j <= i) if case.params["causal"]
                                                       else True)
        elif case.params["causal"]:
            mask = "causal"
        out = mx.fast.scaled_dot_product_attention(
            q[qo:qo + q_len].transpose(1, 0, 2)[None], k[ko:ko + k_len].transpose(1, 0, 2)[None],
            v[ko:ko + k_len].transpose(1, 0, 2)[None], scale=scale_of(case), mask=mask)
        rows.append(out[0].transpose(1, 0, 2))
    return {"out": mx.concatenate(rows, axis=0).astype(inputs["q"].dtype)}


register(
    Impl("sdpa_decode", "mlx", "fast_sdpa", _fast_sdpa, EAGER_CONTRACT, numerics=FUSED,
         batch_invariant=CPU, doc="mx.fast.scaled_dot_product_attention in f32 (mask, sinks)"),
    Impl("sdpa_decode_paged", "mlx", "paged_fast_sdpa", _fast_sdpa, EAGER_CONTRACT,
         numerics=FUSED, batch_invariant=CPU,
         doc="pages gathered (mx.take), then mx.fast sdpa in f32"),
    Impl("attn_combine", "mlx", "attn_combine", _combine, batch_invariant=CPU,
         doc="split-KV combine in f32"),
    Impl("sdpa_prefill_varlen", "mlx", "fast_sdpa_varlen", _fast_sdpa_varlen, EAGER_CONTRACT,
         numerics=FUSED, doc="mx.fast sdpa per sequence in f32, causal bottom-right"),
)
