"""PyTorch attention for decode (`oracle/attention.py`): what a user calls, and kparity's split-KV
reference.

| impl                     | what                                                          |
|--------------------------|---------------------------------------------------------------|
| torch:sdpa               | `F.scaled_dot_product_attention(enable_gqa=True)` in T, a      |
|                          | boolean mask for lengths and window; no sinks (SDPA has none)  |
| torch:eager_sinks        | GPT-OSS's reference `sdpa`: f32 scores, the sink as an extra   |
|                          | softmax column dropped after, P·V in f32                       |
| torch:sdpa_split_kv      | two launches: per split of each sequence's attended keys the  |
|                          | max, sum of exps and unnormalized P·V in f32; then            |
|                          | `attn_combine`'s function (the sink enters there, once)       |
| torch:paged_sdpa         | the pages gathered into a contiguous cache, then torch:sdpa    |
| torch:paged_split_kv     | the pages gathered, then the split-KV pair                     |
| torch:attn_combine       | the combine alone                                              |
| torch:sdpa_varlen        | prefill: F.sdpa per packed sequence, its bottom-right causal   |
|                          | (and window) mask explicit (`is_causal` is top-left)           |
| torch:eager_packed       | prefill: f32 softmax over the whole packed batch, one          |
|                          | block-diagonal mask                                            |
| torch:flex_attention,    | flex_attention with a block mask (lengths, window, prefill's   |
| paged_flex_attention,    | sequences), sinks as an extra key column; compiled, CUDA only  |
| flex_attention_varlen    | (`FLEX_DOC`)                                                   |

torch's CPU flash kernel (and FlashAttention-2 on a GPU) rounds P to T before the P·V product
(measured: a two-key case whose output cancels to 0 errs by 3e-3 in bf16, where f32 P gives
1e-7): torch:sdpa runs the cases with param probs="T" (the bound charges that rounding).

Numerics declared (`oracle.numerics.Numerics.softmax_block`): torch's flash kernels rescale
once per block of keys (512 on a CPU, 64 or 128 on CUDA, plus one split combine): 64. The eager
softmax computes the max first on a CPU; 32 covers a GPU softmax that would go online per warp.
The split-KV pair rescales once, in its combine.

The split-KV pair's contract is that of kparity's CUDA split-KV decode kernel, of which it is the
CPU reference (instantiated head dims 64/96/128/256, pages of 16/32/64 keys), so its violating
cases run in CPU CI. Its split count: one split per 64 keys of max_len, 1 to 64 (`split_count`);
`split_kv_impl(op, name, splits)` builds it at a fixed count (the split-invariance test).
"""

from __future__ import annotations

import math

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch
from gpu_impls.impl import Impl
from oracle.attention import HEAD_DIMS, PAGE_SIZES, cache_len, scale_of
from oracle.numerics import Numerics

FLASH = Numerics(softmax_block=64)
EAGER = Numerics(softmax_block=32)
ONE_COMBINE = Numerics(softmax_block=1 << 30)  # ceil(n / block) + 1 = 2 >= the one combine
MAX_SPLITS = 64
# Batch invariance verified on a CPU (tests/test_attention.py); on a GPU torch's SDPA picks its
# split count from the batch. The split-KV pair runs each sequence alone on every device.
CPU = ("cpu",)
KEYS_PER_SPLIT = 64  # the split count's target: one split per this many keys, up to 64


# --- pieces ----------------------------------------------------------------------------------

def attended_mask(lengths, max_len: int, params: dict):
    """Boolean [B, L] on lengths' device: key t of sequence b is attended (`oracle.attention.
    visible`)."""
    import torch

    t = torch.arange(max_len, device=lengths.device)[None, :]
    n = lengths.long()[:, None]
    mask = t < n
    if params["window"]:
        mask &= (t >= n - params["window"]) | (t < params["sink_end"])
    return mask


def gather_pages(pool, table):
    """[num_pages, Hkv, P, D] pages, [B, max_pages] table -> [B, Hkv, max_pages·P, D]."""
    b, pages = table.shape
    g = pool[table.long()]  # [B, max_pages, Hkv, P, D]
    return g.permute(0, 2, 1, 3, 4).reshape(b, pool.shape[1], pages * pool.shape[2],
                                            pool.shape[3])


def cache(inputs, case):
    """(k, v) [B, Hkv, L, D] of either layout (paged: gathered)."""
    if "k" in inputs:
        return inputs["k"], inputs["v"]
    table = inputs["page_table"]
    return gather_pages(inputs["k_pages"], table), gather_pages(inputs["v_pages"], table)


def _all_full(case) -> bool:
    """The case says every sequence is full and there is no window: no mask needed."""
    return not case.params["ragged"] and not case.params["window"]


def sdpa_fn(q, k, v, mask, scale: float):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask, scale=scale,
                                          enable_gqa=True)[:, :, 0]


def _sdpa(launch, inputs, outputs, case):
    k, v = cache(inputs, case)
    mask = None if _all_full(case) else attended_mask(
        inputs["lengths"], k.shape[2], case.params)[:, None, None, :]
    return {"out": sdpa_fn(inputs["q"], k, v, mask, scale_of(case))}


def eager_sinks_fn(q, k, v, mask, sinks, scale: float):
    """openai/gpt-oss `torch/model.py::sdpa`'s formulation, over a cache with a mask."""
    import torch

    g = q.shape[1] // k.shape[1]
    k32 = k.float().repeat_interleave(g, dim=1)
    v32 = v.float().repeat_interleave(g, dim=1)
    s = torch.einsum("bhd,bhtd->bht", q.float(), k32) * scale
    s = s.masked_fill(~mask[:, None, :], float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float()[None, :, None].expand(s.shape[0], -1, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :k.shape[2]]
    return torch.einsum("bht,bhtd->bhd", p, v32).to(q.dtype)


def _eager_sinks(launch, inputs, outputs, case):
    k, v = cache(inputs, case)
    mask = attended_mask(inputs["lengths"], k.shape[2], case.params)
    sinks = inputs["sinks"] if case.params["sinks"] else None
    return {"out": eager_sinks_fn(inputs["q"], k, v, mask, sinks, scale_of(case))}


# --- the split-KV pair ----------------------------------------------------------------------

def combine_fn(o, m, l, sinks, normalized: bool, out_dtype):
    """`attn_combine`: o [B, H, S, D], m, l [B, H, S] (f32), sinks [H] or None -> (out in
    out_dtype, lse f32)."""
    import torch

    o, m, l = o.float(), m.float(), l.float()
    top = m.max(dim=-1).values
    if sinks is not None:
        top = torch.maximum(top, sinks.float()[None, :])
    empty = torch.isinf(top) & (top < 0)  # every split empty, no sink: out 0, lse -inf
    safe = torch.where(empty, torch.zeros_like(top), top)
    c = torch.exp(m - safe[..., None])
    w = c * l
    total = w.sum(dim=-1)
    if sinks is not None:
        total = total + torch.exp(sinks.float()[None, :] - safe)
    acc = ((w if normalized else c)[..., None] * o).sum(dim=-2)
    out = torch.where(empty[..., None], 0.0, acc / total[..., None])  # not 0 / 0 = NaN
    return out.to(out_dtype), safe + torch.log(total)


def split_partials(q, k, v, mask, splits: int, scale: float):
    """Pass 1: each sequence's attended keys (mask [B, L]) in `splits` contiguous runs of
    ceil(n / splits); per run the max m, sum of exps l and unnormalized P·V o, in f32. A run
    past a short sequence's keys is empty (m = -inf, l = 0, o = 0)."""
    import torch

    b, hkv, length, dim = k.shape
    g = q.shape[1] // hkv
    hq = q.shape[1]
    o = torch.zeros(b, hq, splits, dim, device=q.device)
    m = torch.full((b, hq, splits), float("-inf"), device=q.device)
    l = torch.zeros(b, hq, splits, device=q.device)
    for i in range(b):
        keys = mask[i].nonzero()[:, 0]
        n = keys.numel()
        per = -(-n // splits)
        k32 = k[i, :, keys].float().repeat_interleave(g, dim=0)  # [Hq, n, D]
        v32 = v[i, :, keys].float().repeat_interleave(g, dim=0)
        s = torch.einsum("hd,htd->ht", q[i].float(), k32) * scale  # [Hq, n]
        for j in range(splits):
            lo, hi = j * per, min((j + 1) * per, n)
            if lo >= hi:
                continue
            m[i, :, j] = s[:, lo:hi].max(dim=-1).values
            p = torch.exp(s[:, lo:hi] - m[i, :, j, None])
            l[i, :, j] = p.sum(dim=-1)
            o[i, :, j] = torch.einsum("ht,htd->hd", p, v32[:, lo:hi])
    return o, m, l


def split_count(dims: dict) -> int:
    """One split per KEYS_PER_SPLIT keys of the longest sequence, 1 to MAX_SPLITS."""
    return max(1, min(MAX_SPLITS, -(-cache_len(dims) // KEYS_PER_SPLIT)))


def split_kv_run(splits: int | None = None):
    """The pair's run function at a fixed split count (None: `split_count` of the case)."""
    def run(launch, inputs, outputs, case):
        k, v = cache(inputs, case)
        mask = attended_mask(inputs["lengths"], k.shape[2], case.params)
        count = splits or launch["split"].extra["splits"]
        o, m, l = split_partials(inputs["q"], k, v, mask, count, scale_of(case))
        sinks = inputs["sinks"] if case.params["sinks"] else None
        return {"out": combine_fn(o, m, l, sinks, False, inputs["q"].dtype)[0]}
    return run


def _split_geometry(dims, params):
    splits = split_count(dims)
    return {"splits": splits}, Launch(grid=(dims["batch"] * dims["kv_heads"], splits, 1),
                                      block=(128, 1, 1), extra={"splits": splits})


def _combine_geometry(dims, params):
    return {}, Launch(grid=(dims["batch"] * dims["heads"], 1, 1), block=(64, 1, 1))


GQA = Invariant(
    name="heads % kv_heads == 0", holds=lambda ns: ns["heads"] % ns["kv_heads"] == 0,
    why="query head h reads kv head h // (heads / kv_heads): the groups must be whole",
    fix=lambda ns: f"kv_heads a divisor of heads={ns['heads']}, e.g. "
                   f"{math.gcd(ns['heads'], ns['kv_heads'])}",
    violation={"heads": 12, "kv_heads": 8}, shows=("heads", "kv_heads"))
HEAD_DIM = Invariant(
    name=f"head_dim in {HEAD_DIMS}", holds=lambda ns: ns["head_dim"] in HEAD_DIMS,
    why="the kernel is instantiated for these head sizes only",
    fix=lambda ns: "head_dim = " + str(min(HEAD_DIMS, key=lambda h: abs(h - ns["head_dim"]))),
    violation={"head_dim": 80}, shows=("head_dim",))
PAGE = Invariant(
    name=f"page_size in {PAGE_SIZES}", holds=lambda ns: ns["page_size"] in PAGE_SIZES,
    why="a warp loads one page's keys per step: the kernel is instantiated for these sizes",
    fix=lambda ns: "page_size = " + str(min(PAGE_SIZES,
                                            key=lambda p: abs(p - ns["page_size"]))),
    violation={"page_size": 8, "max_pages": 40}, shows=("page_size",))


def split_kv_launches(paged: bool) -> dict:
    return {"split": Contract(invariants=(GQA, HEAD_DIM) + ((PAGE,) if paged else ()),
                              geometry=_split_geometry),
            "combine": Contract(invariants=(), geometry=_combine_geometry)}


SDPA_CONTRACT = Contract(invariants=(
    GQA,
    Invariant(name="sinks == 0", holds=lambda ns: not ns["sinks"],
              why="F.scaled_dot_product_attention has no learned sink logits",
              fix=lambda ns: "torch:eager_sinks or torch:sdpa_split_kv for sinks=1",
              violation={"sinks": 1}, shows=("sinks",)),
    Invariant(name="probs == 'T'", holds=lambda ns: ns["probs"] == "T",
              why="torch's flash kernels round P to T before P·V (a no-op in f32)",
              fix=lambda ns: "probs='T' (or torch:eager_sinks, f32 throughout)",
              violation={"probs": "f32"}, shows=("probs", "dtype"))))
EAGER_CONTRACT = Contract(invariants=(GQA,))
SINKS_CONTRACT = Contract(invariants=(GQA, Invariant(
    name="sinks == 1", holds=lambda ns: ns["sinks"] == 1,
    why="GPT-OSS's formulation, kept for the sink cases (torch:sdpa and the split-KV pair "
        "cover the rest)", fix=lambda ns: "torch:sdpa or torch:sdpa_split_kv for sinks=0",
    violation={"sinks": 0}, shows=("sinks",))))


def _combine(launch, inputs, outputs, case):
    sinks = inputs["sinks"] if case.params["sinks"] else None
    out, lse = combine_fn(inputs["o"], inputs["m"], inputs["l"], sinks,
                          bool(case.params["normalized"]), outputs["out"].dtype)
    return {"out": out, "lse": lse}


def split_kv_impl(op: str, name: str, splits: int | None = None) -> Impl:
    """The split-KV pair for `op` (contiguous or paged) at a fixed split count, or the one
    `split_count` derives (None)."""
    paged = op.endswith("_paged")
    return Impl(op, "torch", name, split_kv_run(splits), numerics=ONE_COMBINE,
                launches=split_kv_launches(paged), batch_invariant=True,
                doc=f"split-KV pair: f32 partials over {splits or 'ceil(L/64)'} splits, then "
                    "attn_combine")


register(
    # not batch invariant on a CPU: with more than one torch thread, rows 0 and 2 of a f32
    # batch of 3 (32 / 8 heads, 256 keys) differ in bits from each row alone (torch 2.13; one
    # thread, as under pytest -n 2 on 2 cores, matched and hid it)
    Impl("sdpa_decode", "torch", "sdpa", _sdpa, SDPA_CONTRACT, numerics=FLASH,
         doc="F.scaled_dot_product_attention(enable_gqa=True), boolean mask"),
    Impl("sdpa_decode", "torch", "eager_sinks", _eager_sinks, SINKS_CONTRACT, numerics=EAGER,
         batch_invariant=CPU,
         doc="GPT-OSS reference sdpa: f32, the sink as a dropped softmax column"),
    split_kv_impl("sdpa_decode", "sdpa_split_kv"),
    Impl("sdpa_decode_paged", "torch", "paged_sdpa", _sdpa, SDPA_CONTRACT, numerics=FLASH,
         batch_invariant=CPU, doc="pages gathered, then F.scaled_dot_product_attention"),
    split_kv_impl("sdpa_decode_paged", "paged_split_kv"),
    Impl("attn_combine", "torch", "attn_combine", _combine, batch_invariant=CPU,
         doc="split-KV combine: max rescale, f32"),
)


# --- sdpa_prefill_varlen -------------------------------------------------------------------

def prefill_mask(q_len: int, k_len: int, params: dict, device=None):
    """Boolean [q_len, k_len]: query i attends key j (`oracle.attention.prefill_keys`)."""
    import torch

    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    mask = j <= i if params["causal"] else torch.ones(q_len, k_len, dtype=torch.bool,
                                                      device=device)
    if params["window"]:
        mask = mask & (j > i - params["window"])
    return mask


def segments(case):
    """(q offset, q_len, k offset, k_len) per sequence, from the case's lengths."""
    from oracle.attention import varlen_spans

    return varlen_spans(case)


def _sdpa_varlen(launch, inputs, outputs, case):
    """One F.scaled_dot_product_attention per sequence, its mask bottom-right aligned."""
    import torch
    import torch.nn.functional as F

    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    out = torch.empty_like(q)
    for qo, q_len, ko, k_len in segments(case):
        mask = prefill_mask(q_len, k_len, case.params, q.device)
        out[qo:qo + q_len] = F.scaled_dot_product_attention(
            q[qo:qo + q_len].transpose(0, 1)[None], k[ko:ko + k_len].transpose(0, 1)[None],
            v[ko:ko + k_len].transpose(0, 1)[None], attn_mask=mask, scale=scale_of(case),
            enable_gqa=True)[0].transpose(0, 1)
    return {"out": out}


def packed_mask(case, device=None, causal_top_left: bool = False):
    """Boolean [Σ q_len, Σ k_len]: block diagonal over the sequences, each block its
    `prefill_mask` (or, for the mutant, torch's top-left `is_causal`)."""
    import torch

    segs = segments(case)
    mask = torch.zeros(sum(s[1] for s in segs), sum(s[3] for s in segs), dtype=torch.bool,
                       device=device)
    for qo, q_len, ko, k_len in segs:
        block = prefill_mask(q_len, k_len, case.params, device)
        if causal_top_left:
            block = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()
        mask[qo:qo + q_len, ko:ko + k_len] = block
    return mask


def eager_packed(q, k, v, mask, scale: float):
    """f32 scores over the whole packed batch, a block-diagonal mask, softmax, P·V: one call."""
    import torch

    g = q.shape[1] // k.shape[1]
    k32 = k.float().repeat_interleave(g, dim=1)
    v32 = v.float().repeat_interleave(g, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k32) * scale
    p = torch.softmax(s.masked_fill(~mask[None], float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", p, v32).to(q.dtype)


def _eager_packed(launch, inputs, outputs, case):
    mask = packed_mask(case, inputs["q"].device)
    return {"out": eager_packed(inputs["q"], inputs["k"], inputs["v"], mask, scale_of(case))}


register(
    Impl("sdpa_prefill_varlen", "torch", "sdpa_varlen", _sdpa_varlen,
         Contract(invariants=(GQA, SDPA_CONTRACT.invariants[2])), numerics=FLASH,
         doc="F.scaled_dot_product_attention per sequence, bottom-right causal mask"),
    Impl("sdpa_prefill_varlen", "torch", "eager_packed", _eager_packed, EAGER_CONTRACT,
         numerics=EAGER, doc="f32 softmax over the packed batch, block-diagonal mask"),
)


# --- flex_attention ------------------------------------------------------------------------

FLEX_DOC = """`torch.nn.attention.flex_attention.flex_attention` (torch:flex_attention, for the
decode ops and prefill): lengths, window, sink_end and prefill's sequences and bottom-right
causal mask as a `BlockMask` built from a `mask_mod` (`create_block_mask`, once per call); GQA by
`enable_gqa=True`.

Learned sinks: flex has no sink column, so the impl appends one: a zero key and value at slot L
of the cache, attended by every query, whose score `score_mod` replaces by sink_h. The sink's
e^(sink_h - M) then enters l inside the kernel's softmax and its zero value adds nothing to P·V:
the contract's formula, with the output rounded to T once. (Folding the sink in afterwards from
the LSE, out · l / (l + e^(sink - M)), would multiply flex's output already rounded to T and
round it again: two roundings to T, which the contract does not admit.) The cost: the cache is
copied once with the extra slot on sink cases.

Where it runs: on CUDA only (`requires`), through `torch.compile(flex_attention)` (the Triton
flash kernel, or its split-KV decoding twin when q_len < 128), static shapes, compiled once per
case shape and mask (seconds each: the GPU gate samples `gate_cases_max` cases). Eager flex
works on a CPU (torch 2.13): torch's reference path (`math_attention`: f32 scores, an f32
softmax over the whole row, P normalized and rounded to T, then P @ V in T), after a one-time
warning that it is unfused (silenced here). But it still traces each call through dynamo
(backend "eager"): 0.1-0.2 s per new shape (measured), so the CPU fuzz test alone added 41 s
for the three impls (5 s for the one without a failing draw); tests/test_attention.py runs
the eager path (the same masks and score_mod) on one small case per op instead. On a CPU it
shares torch's bf16 subnormal gap (issue 27: a subnormal v reads as 0 in the bf16 P @ V;
torch:sdpa fails the same 'tiny' case).

Numerics (`FLEX`): both paths round P to T before P·V (the Triton kernel's `p.to(V.dtype)`, the
eager path's `.to(query.dtype)`), so the contract requires probs='T' as torch:sdpa's does. The
Triton kernel is an online softmax with one rescale per block of BLOCK_N keys plus, decoding,
one split combine: BLOCK_N is 16 at the smallest in torch 2.13's default configs for these head
dims (A100 and sm_120 f32 head_dim 256; decoding 64, 16 on sm_110 and in the autotune space), so
softmax_block=16 (the eager path does not rescale at all). It works in base 2: the scaled
score times 1/ln2 in f32 and exp2; that multiply's rounding (u |s_t|, and the constant's, a
common u relative on x_t) sits inside the any-order dot product's charge, at least
u·scale·Σ|q_d k_td| per score, as in FlashAttention's folded scale·log2(e) (torch:sdpa).
f32 cases: the kernel's dots run in IEEE f32 under torch's default float32 matmul precision
("highest"); with TF32 allowed they would not, and would fail the f32 bound.
"""

FLEX = Numerics(softmax_block=16)
FLEX_GATE_CASES = 9  # one compile per case shape: as the norms' compiled twins
_FLEX_STATE = {}


def _flex_on_cuda() -> tuple[bool, str]:
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return False, ("torch:flex_attention runs compiled on CUDA only (no GPU here): eager, "
                       "it retraces each new shape (0.1-0.2 s on a CPU)")
    if importlib.util.find_spec("triton") is None:
        return False, "torch.compile(flex_attention) needs triton (not installed)"
    return True, ""


def _flex_fn(device_type: str):
    """flex_attention compiled for CUDA (once per process: dynamo recompiles per shape), or the
    eager function elsewhere."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    if device_type != "cuda":
        return flex_attention
    if "compiled" not in _FLEX_STATE:
        torch._dynamo.config.cache_size_limit = 1024  # one entry per case shape and mask
        _FLEX_STATE["compiled"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX_STATE["compiled"]


def flex_call(q, k, v, mask_mod, score_mod, scale: float):
    """flex_attention of q [B, Hq, Lq, D] over k, v [B, Hkv, Lk, D] with the block mask of
    `mask_mod` (over every batch entry, shared by the heads) and `score_mod` (or None)."""
    import warnings

    from torch.nn.attention.flex_attention import create_block_mask

    b, _, lq, _ = q.shape
    block_mask = create_block_mask(mask_mod, b, None, lq, k.shape[2], device=q.device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return _flex_fn(q.device.type)(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                       scale=scale, enable_gqa=True)


def decode_mask_mod(lengths, params: dict):
    """mask_mod of `attended_mask`: key kv_idx of sequence b is attended."""
    window, sink_end = params["window"], params["sink_end"]

    def mask_mod(b, h, q_idx, kv_idx):
        n = lengths[b]
        seen = kv_idx < n
        if window:
            seen = seen & ((kv_idx >= n - window) | (kv_idx < sink_end))
        return seen
    return mask_mod


def with_sink_slot(mask_mod, slot: int):
    """`mask_mod` that also attends key `slot` (the appended sink column)."""
    def mask(b, h, q_idx, kv_idx):
        return mask_mod(b, h, q_idx, kv_idx) | (kv_idx == slot)
    return mask


def sink_score_mod(sinks, slot: int):
    """score_mod: the score of key `slot` is query head h's sink logit, in f32 (flex traces
    score_mod with `score` in the query's dtype: a `.to(score.dtype)` here would round the sink
    to T; measured, bf16: 1 % off on a sink-dominated head)."""
    import torch

    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.where(kv_idx == slot, sinks[h], score)
    return score_mod


def flex_decode_fn(q, k, v, lengths, sinks, params: dict, scale: float):
    """q [B, Hq, D] against k, v [B, Hkv, L, D]; sinks [Hq] f32 or None -> [B, Hq, D]."""
    import torch

    mask_mod, score_mod = decode_mask_mod(lengths, params), None
    if sinks is not None:  # the sink column: a zero key and value at slot L
        slot = k.shape[2]
        zero = k.new_zeros(k.shape[0], k.shape[1], 1, k.shape[3])
        k, v = torch.cat([k, zero], dim=2), torch.cat([v, zero], dim=2)
        mask_mod, score_mod = with_sink_slot(mask_mod, slot), sink_score_mod(sinks, slot)
    return flex_call(q[:, :, None], k, v, mask_mod, score_mod, scale)[:, :, 0]


def _flex_decode(launch, inputs, outputs, case):
    k, v = cache(inputs, case)
    sinks = inputs["sinks"] if case.params["sinks"] else None
    return {"out": flex_decode_fn(inputs["q"], k, v, inputs["lengths"], sinks, case.params,
                                  scale_of(case))}


def varlen_mask_mod(case, device):
    """mask_mod over the packed batch: query row qi and key row kj are of one sequence and kj
    is among the keys qi attends (`oracle.attention.prefill_keys`: bottom-right causal, window),
    from per-row sequence ids and positions (what cu_seqlens gives)."""
    import torch

    segs = segments(case)
    seq_q = torch.cat([torch.full((q_len,), s) for s, (_, q_len, _, _) in enumerate(segs)])
    seq_k = torch.cat([torch.full((k_len,), s) for s, (_, _, _, k_len) in enumerate(segs)])
    # a query's key position (i + k_len - q_len) and a key's position in its sequence
    pos_q = torch.cat([torch.arange(q_len) + k_len - q_len for _, q_len, _, k_len in segs])
    pos_k = torch.cat([torch.arange(k_len) for _, _, _, k_len in segs])
    seq_q, seq_k, pos_q, pos_k = (t.to(device) for t in (seq_q, seq_k, pos_q, pos_k))
    causal, window = case.params["causal"], case.params["window"]

    def mask_mod(b, h, q_idx, kv_idx):
        i, j = pos_q[q_idx], pos_k[kv_idx]
        seen = seq_q[q_idx] == seq_k[kv_idx]
        if causal:
            seen = seen & (j <= i)
        if window:
            seen = seen & (j > i - window)
        return seen
    return mask_mod


def _flex_varlen(launch, inputs, outputs, case):
    """The packed batch as one flex call ([1, H, Σ len, D]) with the block-diagonal mask."""
    q, k, v = (inputs[n].transpose(0, 1)[None] for n in ("q", "k", "v"))
    mask_mod = varlen_mask_mod(case, q.device)
    return {"out": flex_call(q, k, v, mask_mod, None, scale_of(case))[0].transpose(0, 1)}


FLEX_CONTRACT = Contract(invariants=(GQA, SDPA_CONTRACT.invariants[2]))
FLEX_PREFILL_CONTRACT = Contract(invariants=(*FLEX_CONTRACT.invariants, Invariant(
    name="head_dim <= 128", holds=lambda ns: ns["head_dim"] <= 128,
    why="torch 2.11's compiled flex_attention (the prefill template) finds no kernel config at "
        "head_dim 256 (NoValidChoicesError, measured on an H100, Qwen3-Next's 16/2 x 256); "
        "its decode kernel runs it",
    fix=lambda ns: "head_dim <= 128, or torch:sdpa_varlen", violation={"head_dim": 256},
    shows=("head_dim",))))

FLEX_KW = dict(numerics=FLEX, requires=_flex_on_cuda, gate_cases_max=FLEX_GATE_CASES)

register(
    Impl("sdpa_decode", "torch", "flex_attention", _flex_decode, FLEX_CONTRACT,
         doc="torch.compile(flex_attention), block mask, sinks as a key column", **FLEX_KW),
    Impl("sdpa_decode_paged", "torch", "paged_flex_attention", _flex_decode, FLEX_CONTRACT,
         doc="pages gathered, then torch:flex_attention", **FLEX_KW),
    Impl("sdpa_prefill_varlen", "torch", "flex_attention_varlen", _flex_varlen,
         FLEX_PREFILL_CONTRACT,
         doc="torch.compile(flex_attention) over the packed batch, block mask from cu_seqlens",
         **FLEX_KW),
)
