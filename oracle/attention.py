"""Attention for decode (seeds: FFAI's `ffai_sdpa_decode*`, `sdpa_decode_2pass`, metaltile-std
`src/ffai/`; references: flash-attention's `tests/test_util.py::attention_ref`, openai/gpt-oss's
`torch/model.py` for the sinks): one query token per sequence against its KV cache, and the
combine of a split-KV decode's partial results.

`sdpa_decode`: q [B, Hq, D] in T; the cache k, v [B, Hkv, L, D] in T holding lengths[b] keys of
sequence b (i32 [B], 1 <= n_b <= L); optional learned sink logits [Hq] in f32 (GPT-OSS; param
`sinks`, the tensor is empty without it). Query head h reads kv head h // (Hq / Hkv). Per
sequence b and head h, over the visible keys t of V_b (below):

    s_t = scale · q_h·k_t                scale: param `scale`, f32; 0 means 1/sqrt(D)
    M   = max(max_t s_t, sink_h)         (sink_h only with `sinks`)
    p_t = exp(s_t − M),  l = Σ_t p_t + exp(sink_h − M)
    out = Σ_t p_t v_t / l                rounded to T once, at the store

V_b = {t < n_b : window = 0 or t >= n_b − window or t < sink_end}: the last `window` keys (the
current token included: GPT-OSS's 128-key window) and the first `sink_end` (StreamingLLM's
sink tokens), i.e. [0, sink_end) ∪ [window_start, n) with window_start = max(n − window, 0);
the union, so a kernel walking the two ranges clamps window_start to sink_end (no key twice).
Slots a sequence does not attend to hold finite stale data in every case (`cases/attention.py`):
what a kernel reads there is the op's business only through its weight, which must be 0.

`sdpa_decode_paged`: the same, with the cache in pages: k_pages, v_pages [num_pages, Hkv, P, D]
(FlashInfer's HND page layout; P = page_size 16/32/64) and page_table [B, max_pages] i32: key t
of sequence b is in page page_table[b, t // P], slot t % P. Entries past a sequence's pages are
0 (page 0 is the null page, holding stale data).

Param `probs`: where the probabilities enter P·V. "f32" (the FFAI decode kernels, MLX's fused
kernels): in f32. "T" (FlashAttention-2's tensor-core P·V, torch's CPU flash kernel): each p_t
rounded to T first, relative to the running max of its block, which the oracle cannot know:
the oracle stays the exact value above and the bound charges that rounding (below). FFAI's
two-pass decode is in the "T" class too: each block's unnormalised partial o_b = Σ_{t in b}
p_t v_t (p relative to the block's max) is stored in T, an error of at most u_T |o_b| + u_T
tiny_T per element; over the combine, Σ_b c_b (u_T |o_b| + u_T tiny_T) / L <= u_T Σ_t p_t |v_t|
/ l + u_T tiny_T (every nonempty block's l_b >= 1, so Σ_b c_b <= L): the per-weight relative
charge below covers the first term, one absolute u_T tiny_T on the output the second.

Param `splits`: the number of key splits of a split-KV kernel (0, the default: the kernel's own
choice). The result does not depend on it, so impls without splits ignore it; it lets a case
pin the count where a kernel's contract restricts it (FFAI's two-pass: a multiple of 32).

Tolerance (derived: the admissible kernel, `sdpa_kernel`, in `oracle/numerics.py`'s interval
arithmetic). Per sequence and head, over its n visible keys:

    s_t  = f32 dot(q, k_t) · scale       D products, the sum in the impl's declared order, the
           or dot(q · scale, k_t)        scale multiply (either form: torch scales the dot, MLX
                                         the query; an impl declaring the form "scaled_q"
                                         computes the second, its dot's order declared as
                                         the sum "score": cuda:kp_sdpa_decode)
    M    = max_t s_t                     exact (no rounding), the kernel's own max
    x_t  = s_t − M                       one rounding (two when the kernel rescales, below);
                                         its error e_t + e_t* + off against the exact argmax
                                         t* (`Val.minus_max`): t*'s own x is exact unless
                                         another score may overtake it (off > 0)
    p_t  = exp(x_t)                      the backend's exp ULPs
    l    = Σ p_t (+ the sink's),  acc = Σ p_t v_t,  out = acc / l     any order; the divide 2 ULP
           or out = Σ_t (p_t / l) v_t    (softmax first, then P·V: a divide per weight)

The bound this gives: an absolute score error e_t becomes a relative weight error
δ_t ≈ e_t + e_t* + |x_t| u + k_exp·2^-23 (the exponent's error is an absolute one, so a logit
range |s_t − M| of 100 costs 100 u in x_t itself), and the output moves by at most
Σ_t p_t δ_t |v_t| / l + |out| Σ_t p_t δ_t / l ≤ 2 max_t δ_t · Σ_t p_t |v_t| / l: relative to
Σ_t p_t |v_t| / l, not to |out| (which may cancel to 0). The score error itself is relative to
scale·Σ_d |q_d k_td| (the any-order sum: up to (D/2) u of it), so large logits (outliers, f16
overflow data) widen it in proportion; a dominant key (p = 1, the rest ~0) keeps the bound at
that key's |v| (x = 0 for it: no range amplification, and the others' weights e^(x ± δ)
stay negligible however large their score errors: f16_overflow data's logits of ~1e6, errors
~1, are bounded by the store's rounding).

Kernels that rescale (an online softmax: l and acc multiplied by e^(m_old − m_new) when the
running max rises; a split-KV combine): a term's weight becomes e^(x^0) · Π_j e^(x^j), the
exponents summing to x_t (their roundings, each at most u |x^j|, sum to at most u |x_t|: a
second rounding of x_t covers them), R + 1 exps and R multiplies. R per term is at most
ceil(n / softmax_block) + 1 for an impl declaring `Numerics(softmax_block=...)`, else n (one per
key). The model charges them as one factor 1 ± r_R, r_R = (1 + k_exp 2^-23)^(R+1) (1 + u)^R − 1
(k ULPs are at most k·2^-23 relative, at a power of 2). With `probs="T"` each weight carries one
more relative error, half an ULP of T (f16: plus 2^-25 absolute, its subnormal spacing), and
the output one absolute u_T tiny_T (a two-pass kernel's partials stored in T, above).

Measured (CPU, 2026-11): bf16 outputs use 0.3-0.45 of the bound (torch:sdpa, the split-KV
pair, MLX), the store's rounding dominating; f32 outputs 0.001-0.06 of it (a bound of ~1e-4 at
Llama's 128-wide heads over 256 keys against errors of ~4e-7): the any-order bound of a D-term
dot product ((D/2) u, `oracle/numerics.py`), which an impl declaring its order tightens.

NaN and inf (the `nonfinite` cases put them in attended slots only, `finite_unattended`): IEEE
propagation through the formula above. A NaN or +inf score makes the head's output NaN (exp(inf − inf)); an inf in
an attended v with a nonzero weight makes its column ±inf (or NaN with both signs). A weight
that underflows f32 (e^x below 2^-149, or below 2^-126 where the exp flushes: MLX) is 0 in the
kernel, so 0 · inf = NaN where the float64 oracle keeps its inf: an oracle ±inf may come out
NaN (`OpSpec.inf_may_be_nan`); NaN stays NaN and finite stays finite.
"""

from __future__ import annotations

import math

import numpy as np

from oracle.builders import kernel_view
from oracle.dtypes import eps as dtype_eps
from oracle.dtypes import round_to, spacing
from oracle.dtypes import tiny as dtype_tiny
from oracle.numerics import FUNCTION_ULPS, U, product_into
from oracle.spec import BatchDim, OpSpec, TensorSpec, register

HEAD_DIMS = (64, 96, 128, 256)  # the head sizes; the op itself takes any
PAGE_SIZES = (16, 32, 64)
PROBS = ("f32", "T")
# The kernel model's arrays per chunk of kv heads (float64 Val intervals, a few copies each):
# Hq·n·D elements beyond this are modelled one kv head at a time.
CHUNK_ELEMS = 1 << 21


# --- what a sequence attends to ------------------------------------------------------------------

def visible(n: int, window: int, sink_end: int) -> np.ndarray:
    """The attended key positions of a sequence of n keys, ascending (module docstring)."""
    if not window:
        return np.arange(n)
    start = max(n - window, 0)
    return np.concatenate([np.arange(min(sink_end, start)), np.arange(start, n)])


def attended(case, lengths) -> list[np.ndarray]:
    """`visible` of every sequence of the case, from its lengths."""
    p = case.params
    return [visible(int(n), p["window"], p["sink_end"]) for n in np.asarray(lengths)]


def scale_of(case) -> float:
    """The softmax scale as the kernel holds it: f32 of the param, 1/sqrt(D) when it is 0."""
    s = case.params["scale"] or 1.0 / math.sqrt(case.dims["head_dim"])
    return float(np.float32(s))


def _check_lengths(lengths, max_len: int, op: str) -> np.ndarray:
    n = np.asarray(lengths).astype(np.int64)
    if ((n < 1) | (n > max_len)).any():
        raise ValueError(f"{op}: lengths {n.tolist()} must lie in [1, {max_len}] (the cache "
                         "holds at least the current token)")
    return n


def gathered(inputs: dict, case, b: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, v) [Hkv, len(keys), D] of sequence b at key positions `keys`, float64, from either
    layout."""
    if "k" in inputs:
        k, v = inputs["k"][b], inputs["v"][b]
        return (np.asarray(k[:, keys]).astype(np.float64),
                np.asarray(v[:, keys]).astype(np.float64))
    page = case.dims["page_size"]
    table = np.asarray(inputs["page_table"][b]).astype(np.int64)
    pages, slots = table[keys // page], keys % page
    num_pages = inputs["k_pages"].shape[0]
    if ((pages < 0) | (pages >= num_pages)).any():
        raise ValueError(f"sdpa_decode_paged: sequence {b}'s page table names pages outside "
                         f"[0, {num_pages})")
    k = np.asarray(inputs["k_pages"][pages, :, slots]).astype(np.float64)  # [n, Hkv, D]
    v = np.asarray(inputs["v_pages"][pages, :, slots]).astype(np.float64)
    return k.transpose(1, 0, 2), v.transpose(1, 0, 2)


def _sinks(inputs: dict, case) -> np.ndarray | None:
    if not case.params["sinks"]:
        return None
    return np.asarray(inputs["sinks"]).astype(np.float64)


def cache_len(dims) -> int:
    """Keys the cache holds per sequence: max_len, or max_pages pages of page_size."""
    return dims["max_len"] if "max_len" in dims else dims["max_pages"] * dims["page_size"]


def _max_len(case) -> int:
    return cache_len(case.dims)


# --- the oracle ----------------------------------------------------------------------------------

def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, sink: np.ndarray | None,
           scale: float) -> np.ndarray:
    """Exact softmax attention of q [h, g, D] (g query heads per kv head) against k, v
    [h, n, D]; sink [h, g] or None. float64, [h, g, D]."""
    s = np.einsum("hgd,hnd->hgn", q, k) * scale
    logits = s if sink is None else np.concatenate([s, sink[..., None]], axis=-1)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return np.einsum("hgn,hnd->hgd", p[..., :k.shape[1]], v) / p.sum(axis=-1)[..., None]


def sdpa_decode(inputs: dict, case) -> dict:
    """Both layouts: see the module docstring."""
    d = case.dims
    hkv, g = d["kv_heads"], d["heads"] // d["kv_heads"]
    view = kernel_view({"q": inputs["q"]}, case)
    lengths = _check_lengths(inputs["lengths"], _max_len(case), case.op)
    sinks = _sinks(inputs, case)
    out = np.empty((d["batch"], d["heads"], d["head_dim"]))
    for b, keys in enumerate(attended(case, lengths)):
        k, v = gathered(inputs, case, b, keys)
        k, v = (kernel_view({"x": a}, case)["x"] for a in (k, v))
        q = view["q"][b].reshape(hkv, g, -1)
        sink = None if sinks is None else sinks.reshape(hkv, g)
        out[b] = attend(q, k, v, sink, scale_of(case)).reshape(d["heads"], -1)
    return {"out": out}


# --- the admissible kernel -----------------------------------------------------------------------

def rescale_error(rescales: int, exp_ulps: float) -> float:
    """r_R of the module docstring: R + 1 exps of k ULPs and R multiplies, relative."""
    if not rescales:
        return 0.0
    rho = exp_ulps * 2.0 ** -23
    return float(np.expm1((rescales + 1) * np.log1p(rho) + rescales * np.log1p(U)))


def attend_kernel(A, q, k, v, sink, scale: float, case):
    """The admissible kernel of `attend` in arithmetic A: q [h, g, D], k, v [h, n, D] (float64
    values as the kernel reads them), sink [h, g] or None; returns out [h, g, D] before the
    store. The model is the module docstring's."""
    h, g, dim = q.shape
    n = k.shape[1]
    qv, kv, sc = A.load(q).reshape(h, g, 1, dim), A.load(k).reshape(h, 1, n, dim), A.load(scale)
    if A.m.numerics.form == "scaled_q":  # q * scale rounded, then the dot (its declared order)
        s = A.sum(product_into(A, qv * sc, kv, "score"), site="score")
    else:
        s = A.either(A.sum(qv * kv) * sc, A.sum((qv * sc) * kv))  # [h, g, n]
    logits = s if sink is None else A.concat([s, A.load(sink[..., None])], axis=-1)
    x = logits.minus_max()
    numerics = A.m.numerics
    rescales = numerics.rescales(logits.shape[-1])
    if rescales:  # the parts of a rescaled exponent: their roundings add up to a second one
        x = x - A.load(0.0)
    p = x.exp()
    if rescales:
        exp_ulps = (numerics.ulps or FUNCTION_ULPS).get("exp", FUNCTION_ULPS["exp"])
        p = p * A.unit(rescale_error(rescales, exp_ulps))
    p_in_t = case.params["probs"] == "T" and case.dtype != "f32"
    if p_in_t:  # p rounded to T before P·V
        half = dtype_eps(case.dtype) / 2
        p = p * A.unit(half) + (A.unit(half * dtype_tiny(case.dtype)) - A.load(1.0))
    weights = p.at((Ellipsis, slice(0, n))).reshape(h, g, 1, n)
    vt = A.load(np.swapaxes(v, -1, -2)).reshape(h, 1, dim, n)
    total = A.keep(A.keep(A.sum(p)))  # [h, g, 1, 1]
    # acc / l at the end (flash kernels), or softmax first and then P·V (eager, MLX on CPU)
    out = A.either(A.sum(weights * vt) / A.keep(A.sum(p)), A.sum(weights / total * vt))
    if p_in_t:  # partials stored in T: their subnormal part, at most u_T tiny_T in all
        out = out + (A.unit(half * dtype_tiny(case.dtype)) - A.load(1.0))
    return out


def sdpa_kernel(A, inputs: dict, case) -> dict:
    """`attend_kernel` per sequence (over its attended keys) and chunk of kv heads."""
    d = case.dims
    hkv, g = d["kv_heads"], d["heads"] // d["kv_heads"]
    view = kernel_view({"q": inputs["q"]}, case)
    lengths = _check_lengths(inputs["lengths"], _max_len(case), case.op)
    sinks = _sinks(inputs, case)
    rows = []
    for b, keys in enumerate(attended(case, lengths)):
        k, v = gathered(inputs, case, b, keys)
        k, v = (kernel_view({"x": a}, case)["x"] for a in (k, v))
        q = view["q"][b].reshape(hkv, g, -1)
        sink = None if sinks is None else sinks.reshape(hkv, g)
        step = max(1, CHUNK_ELEMS // max(1, g * len(keys) * d["head_dim"]))
        parts = [attend_kernel(A, q[c:c + step], k[c:c + step], v[c:c + step],
                               None if sink is None else sink[c:c + step], scale_of(case), case)
                 for c in range(0, hkv, step)]
        out = parts[0] if len(parts) == 1 else A.concat(parts, axis=0)
        rows.append(out.reshape(1, d["heads"], d["head_dim"]))
    return {"out": rows[0] if len(rows) == 1 else A.concat(rows, axis=0)}


# --- the ops -------------------------------------------------------------------------------------

Q = lambda d: (d["batch"], d["heads"], d["head_dim"])  # noqa: E731
KV = lambda d: (d["batch"], d["kv_heads"], d["max_len"], d["head_dim"])  # noqa: E731
POOL = lambda d: (d["num_pages"], d["kv_heads"], d["page_size"], d["head_dim"])  # noqa: E731
TABLE = lambda d: (d["batch"], d["max_pages"])  # noqa: E731
LENGTHS = lambda d: (d["batch"],)  # noqa: E731
SINKS = lambda d, p: (d["heads"] if p["sinks"] else 0,)  # noqa: E731

PARAMS = {"scale": 0.0, "sinks": 0, "window": 0, "sink_end": 0, "probs": "f32", "ragged": 1,
          "splits": 0, "ftz": 0}
PARAM_VALUES = {"sinks": (0, 1), "probs": PROBS, "ragged": (0, 1)}


def keys_read(dims, params) -> int:
    """Keys a full sequence attends: all `cache_len` of them, or with a window at most the
    window and sink tokens (the work model's, and the split-KV kernels' split counts)."""
    n = cache_len(dims)
    return min(n, params["window"] + params["sink_end"]) if params["window"] else n


def kv_read(case) -> int:
    """Keys read per sequence in the work model (`keys_read`; a ragged case's shorter
    sequences read fewer: GB/s is a bound)."""
    return keys_read(case.dims, case.params)


def _bytes(case) -> int:
    d = case.dims
    t = 4 if case.dtype == "f32" else 2
    kv = 2 * d["batch"] * d["kv_heads"] * kv_read(case) * d["head_dim"] * t
    table = 4 * d["batch"] * d.get("max_pages", 0)
    return kv + 2 * d["batch"] * d["heads"] * d["head_dim"] * t + 4 * d["batch"] + table


def _flops(case) -> int:
    d = case.dims
    return 4 * d["batch"] * d["heads"] * kv_read(case) * d["head_dim"]


def counts_domain(case) -> None:
    """`window`, `sink_end` and `splits` count keys or splits: 0 (none, or the kernel's own
    choice) or more. A negative count has no meaning (torch's sliding-window mask and the
    oracle's `visible` read -3 differently, so a correct torch impl failed)."""
    zero_means = {"window": "no window", "sink_end": "no sink tokens",
                  "splits": "the kernel's own split count"}
    for name, meaning in zero_means.items():
        value = case.params.get(name, 0)
        if value < 0:
            raise ValueError(f"{case.op}: {name} = {value} must be 0 or more (0: {meaning})")


def decode_domain(case) -> None:
    counts_domain(case)
    if "num_pages" in case.dims:
        paged_pool_fits(case)


COMMON = dict(family="attention", outputs=(TensorSpec("out", Q),), oracle=sdpa_decode,
              tolerance=None, kernel=sdpa_kernel, bytes=_bytes, flops=_flops, params=PARAMS,
              param_values=PARAM_VALUES, doc=__doc__, chain_input="q", inf_may_be_nan=True,
              plant=lambda inputs, case: plant_scores(inputs, case), domain=decode_domain)

register(OpSpec(
    name="sdpa_decode", dims=("batch", "heads", "kv_heads", "head_dim", "max_len"),
    inputs=(TensorSpec("lengths", LENGTHS, role="i32", init="seq_lens", adversarial=False),
            TensorSpec("q", Q),
            TensorSpec("k", KV, init="kv_cache", adversarial=True),
            TensorSpec("v", KV, init="kv_cache", adversarial=True),
            TensorSpec("sinks", SINKS, role="f32", init="sink_logits", adversarial=False)),
    batch=BatchDim("batch", ("lengths", "q", "k", "v"), ("out",)), **COMMON))

def paged_pool_fits(case) -> None:
    """The pool holds every sequence at the full length (max_pages pages each) besides the null
    page 0: lengths are drawn up to max_pages * page_size."""
    d = case.dims
    if d["batch"] * d["max_pages"] > d["num_pages"] - 1:
        raise ValueError(f"sdpa_decode_paged: batch={d['batch']} sequences of up to "
                         f"max_pages={d['max_pages']} pages need a pool of "
                         f"{d['batch'] * d['max_pages'] + 1} pages (page 0 is the null page), "
                         f"num_pages={d['num_pages']}: raise num_pages")


register(OpSpec(
    name="sdpa_decode_paged",
    dims=("batch", "heads", "kv_heads", "head_dim", "page_size", "max_pages", "num_pages"),
    inputs=(TensorSpec("lengths", LENGTHS, role="i32", init="seq_lens", adversarial=False),
            TensorSpec("page_table", TABLE, role="i32", init="page_table", adversarial=False),
            TensorSpec("q", Q),
            TensorSpec("k_pages", POOL, init="kv_cache", adversarial=True),
            TensorSpec("v_pages", POOL, init="kv_cache", adversarial=True),
            TensorSpec("sinks", SINKS, role="f32", init="sink_logits", adversarial=False)),
    batch=BatchDim("batch", ("lengths", "page_table", "q"), ("out",)), **COMMON))


# --- attn_combine: the second pass of a split-KV decode ---------------------------------------

COMBINE_DOC = """`attn_combine`: the second pass of a split-KV decode (FlashAttention-2's), as its
own op so that a two-pass kernel's halves are checked apart.

Inputs per (b, h) row and split s: o [B, H, S, D] (role `partial`, f32 by default; FFAI's
two-pass stores it in T), the split's max logit m [B, H, S] and sum of exps l [B, H, S] (f32;
an empty split: m = −inf, l = 0, o = 0); optional sink logits [H] f32 (param `sinks`: the sink
enters once, here, never per split). Param `normalized`: o holds acc_s = Σ_t e^(s_t − m_s) v_t
(0: FFAI's `partial_o`) or acc_s / l_s (1: FlashAttention-2's `oaccum`, vLLM's merge).

    M   = max(max_s m_s, sink)          c_s = e^(m_s − M)
    L   = Σ_s c_s l_s (+ e^(sink − M))
    out = Σ_s c_s acc_s / L             [B, H, D], rounded to T at the store
    lse = M + ln L                      [B, H], f32

Kernel model (`combine_kernel`): the max exact; m_s − M one rounding, the exp its ULPs; c_s l_s
one rounding; the numerator's terms c_s·acc_s (normalized: (c_s l_s)·o_s) one; both sums over
the splits in the declared order; the divide 2 ULP; ln its ULPs (2) and the add one rounding.
So the bound follows the split maxima: a split far below M contributes c_s ≈ 0 and nothing
else; `out` is bounded relative to Σ_s c_s |acc_s| / L. A combine that drops the rescale (adds
acc_s as if every m_s were M) is off by the factors c_s themselves. An infinite acc_s whose c_s
underflows f32 gives 0 · inf = NaN: an oracle ±inf may come out NaN, as in `sdpa_decode`.
"""


def _combine_parts(inputs: dict, case):
    """(o, m, l, sinks or None) as float64 (the kernel's view)."""
    v = kernel_view({k: inputs[k] for k in ("o", "m", "l")}, case)
    return v["o"], v["m"], v["l"], _sinks(inputs, case)


def attn_combine(inputs: dict, case) -> dict:
    o, m, l, sinks = _combine_parts(inputs, case)
    top = m.max(axis=-1)
    if sinks is not None:
        top = np.maximum(top, sinks[None, :])
    empty = top == -np.inf  # every split empty, no sink: out 0, lse -inf
    safe = np.where(empty, 0.0, top)
    c = np.exp(m - safe[..., None])
    total = (c * l).sum(axis=-1)
    if sinks is not None:
        total = total + np.exp(sinks[None, :] - safe)
    acc = o * l[..., None] if case.params["normalized"] else o
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.einsum("bhs,bhsd->bhd", c, acc) / total[..., None]
        lse = safe + np.log(total)
    return {"out": np.where(empty[..., None], 0.0, out), "lse": np.where(empty, -np.inf, lse)}


def combine_kernel(A, inputs: dict, case) -> dict:
    o, m, l, sinks = _combine_parts(inputs, case)
    mv, lv = A.load(m), A.load(l)
    logits = mv if sinks is None else A.concat(
        [mv, A.load(np.broadcast_to(sinks[None, :, None], m.shape[:2] + (1,)))], axis=-1)
    top = A.keep(logits.max())
    c = logits.minus_max().exp()  # [B, H, S (+1)]
    splits = m.shape[-1]
    cs = c.at((Ellipsis, slice(0, splits)))
    w = cs * lv
    total = A.sum(w if sinks is None else A.concat([w, c.at((Ellipsis, slice(splits, None)))],
                                                  axis=-1))
    ot = A.load(np.swapaxes(o, -1, -2))  # [B, H, D, S]
    factor = w if case.params["normalized"] else cs
    b, h, dim = o.shape[0], o.shape[1], o.shape[-1]
    acc = A.sum(factor.reshape(b, h, 1, splits) * ot)
    return {"out": acc / A.keep(total),
            "lse": top.reshape(b, h) + total.log()}


P3 = lambda d: (d["batch"], d["heads"], d["splits"], d["head_dim"])  # noqa: E731
P2 = lambda d: (d["batch"], d["heads"], d["splits"])  # noqa: E731

register(OpSpec(
    name="attn_combine", family="attention", dims=("batch", "heads", "splits", "head_dim"),
    inputs=(TensorSpec("m", P2, role="f32", init="split_max", adversarial=False),
            TensorSpec("l", P2, role="f32", init="split_sum", adversarial=False),
            TensorSpec("o", P3, role="partial", init="partial_o", adversarial=True),
            TensorSpec("sinks", SINKS, role="f32", init="sink_logits", adversarial=False)),
    outputs=(TensorSpec("out", lambda d: (d["batch"], d["heads"], d["head_dim"])),
             TensorSpec("lse", lambda d: (d["batch"], d["heads"]), role="f32")),
    oracle=attn_combine, tolerance=None, kernel=combine_kernel, roles={"partial": "f32"},
    bytes=lambda case: case.spec.io_bytes(case),
    flops=lambda case: 3 * int(np.prod(P3(case.dims))),
    params={"normalized": 0, "sinks": 0, "ftz": 0},
    param_values={"normalized": (0, 1), "sinks": (0, 1)}, inf_may_be_nan=True,
    batch=BatchDim("batch", ("o", "m", "l"), ("out", "lse")), chain_input="o",  # pass 1's
    doc=COMBINE_DOC))


# --- planted structures ----------------------------------------------------------------------

DOMINANT_MARGIN = 30.0  # `clear_margin`: the planted key's score this far above the others


def _key_slot(inputs: dict, case, b: int, t: int) -> tuple[str, str, tuple]:
    """(k name, v name, index of key t of sequence b in them, all kv heads)."""
    if "k" in inputs:
        return "k", "v", (b, slice(None), t)
    page = case.dims["page_size"]
    return "k_pages", "v_pages", (int(inputs["page_table"][b, t // page]), slice(None),
                                  t % page)


def finite_unattended(inputs: dict, names: tuple, attended: np.ndarray) -> dict:
    """A `nonfinite` case's k and v with their NaN and inf kept only where a reader attends
    (`attended`: a boolean mask that broadcasts to each of them); every other slot's nonfinite
    entries become 0. A NaN or inf that a query does not attend is outside the contract (a
    masked kernel's P·V multiplies it by 0, a skipping one never reads it), so a case that put
    one there would test no rule."""
    out = dict(inputs)
    for name in names:
        a = np.array(inputs[name], copy=True)
        a[~attended & ~np.isfinite(a.astype(np.float64))] = 0
        out[name] = a
    return out


def plant_scores(inputs: dict, case) -> dict:
    """The decode cases' planted structures (`cases/distributions.py`), per sequence over its
    attended keys, in every kv head:

    * `near_tie`: the key a quarter into the sequence is turned toward the first query head of
      its group (its top score there), and the key three quarters in becomes its copy with
      element 0 moved one ULP of T: two top scores within an ULP of each other, in different
      halves (so in different splits of a split-KV kernel).
    * `clear_margin`: that first key is set along the query so its score is ~30 above the
      others': one dominant key (p = 1, the rest e^-30).
    * `equal_keys`: every attended key equals the first: all scores tie, uniform weights.
    * `nonfinite`: NaN and inf only in key slots their sequence attends (`finite_unattended`).
    Other distributions: unchanged."""
    if case.dist == "nonfinite":  # k, v: [B, Hkv, max_len, D], or pages [N, Hkv, P, D]
        names = ("k", "v") if "k" in inputs else ("k_pages", "v_pages")
        shape = np.shape(inputs[names[0]])
        read = np.zeros((shape[0], 1, shape[2], 1), dtype=bool)
        page = case.dims.get("page_size")
        for b, keys in enumerate(attended(case, inputs["lengths"])):
            if page is None:
                read[b, 0, keys] = True
            else:
                read[np.asarray(inputs["page_table"])[b, keys // page], 0, keys % page] = True
        return finite_unattended(inputs, names, read)
    if case.dist not in ("near_tie", "clear_margin", "equal_keys"):
        return inputs
    inputs = {k: np.array(v, copy=True) for k, v in inputs.items()}
    d = case.dims
    g = d["heads"] // d["kv_heads"]
    scale = scale_of(case)
    for b, keys in enumerate(attended(case, inputs["lengths"])):
        if len(keys) < 2:
            continue
        kname, _, first = _key_slot(inputs, case, b, int(keys[len(keys) // 4]))
        k = inputs[kname]
        key = k[first].astype(np.float64)  # [Hkv, D]
        q = np.asarray(inputs["q"][b]).astype(np.float64)[::g]  # each group's first head
        unit = q / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-30)
        if case.dist == "equal_keys":
            for t in keys:
                k[_key_slot(inputs, case, b, int(t))[2]] = k[first]
            continue
        if case.dist == "clear_margin":
            qn = np.linalg.norm(q, axis=-1, keepdims=True)
            key = unit * (DOMINANT_MARGIN + 3.0 * scale * qn) / np.maximum(scale * qn, 1e-30)
            k[first] = round_to(key, case.dtype)
            continue
        key = key + 3.0 * unit * np.sqrt(d["head_dim"])
        k[first] = round_to(key, case.dtype)
        tie = k[first].astype(np.float64)
        tie[:, 0] += spacing(tie[:, 0], case.dtype)
        k[_key_slot(inputs, case, b, int(keys[3 * len(keys) // 4]))[2]] = round_to(tie, case.dtype)
    return inputs


# --- sdpa_prefill_varlen: packed sequences, a cached prefix -------------------------------------

PREFILL_DOC = """`sdpa_prefill_varlen`: attention over packed sequences (flash-attention's
`tests/test_util.py::attention_ref` and varlen layout). Sequence b brings q_lens[b] new tokens
and attends k_lens[b] keys (its cached prefix of k_lens[b] − q_lens[b] keys, then the new ones;
q_len <= k_len): q [Σ q_len, Hq, D], k and v [Σ k_len, Hkv, D] in T, rows packed in sequence
order; cu_seqlens_q and cu_seqlens_k [B + 1] i32 the exclusive prefix sums (the kernel's row
offsets). The lengths are params (`q_lens`, `k_lens`: tuples, part of the id), so the packed
shapes are static.

Query i of sequence b (0-based among its new tokens) sits at key position i + k − q and attends
key j (0-based in its sequence) where, with off = k_len − q_len (bottom-right alignment, FA2
>= 2.1; torch's `is_causal` is top-left, a different mask once q_len < k_len):

    causal=1     j <= i + off                          (causal=0: every j < k_len)
    window=W>0   j >= i + off − W + 1                   (the last W positions, itself included)

and out = softmax(scale · q·kᵀ) v over them, rounded to T once; GQA and `scale` as in
`sdpa_decode`. Param `probs` as there. Tolerance: `sdpa_decode`'s kernel model, per query row
over its attended keys (`attend_kernel`).

NaN and inf: IEEE propagation over the attended keys, as in `sdpa_decode`; a NaN or inf in a
key or value that a query does not attend (a later token of its sequence, another sequence's)
is outside the contract: a masked kernel's P·V multiplies it by 0 (NaN), one that skips it
does not: a `nonfinite` case puts them only at keys every query of its sequence attends
(`plant_prefill`). So are rows whose every attended score is −inf (exp(−inf − (−inf)): NaN
here, 0 in kernels that guard it). The gate has no `nonfinite` prefill case.
"""


def varlen_spans(case) -> list[tuple[int, int, int, int]]:
    """(q offset, q_len, k offset, k_len) per sequence, checked."""
    q_lens, k_lens = case.params["q_lens"], case.params["k_lens"]
    if len(q_lens) != len(k_lens) or any(q > k for q, k in zip(q_lens, k_lens)) \
            or any(q < 1 for q in q_lens):
        raise ValueError(f"sdpa_prefill_varlen: q_lens {list(q_lens)}, k_lens {list(k_lens)}: "
                         "one of each per sequence, 1 <= q_len <= k_len")
    counts_domain(case)
    qo, ko = np.cumsum([0, *q_lens]), np.cumsum([0, *k_lens])
    return [(int(qo[b]), q, int(ko[b]), k) for b, (q, k) in enumerate(zip(q_lens, k_lens))]


def prefill_keys(i: int, q_len: int, k_len: int, params) -> np.ndarray:
    """The keys query i of a sequence attends (module docstring of the op)."""
    pos = i + k_len - q_len
    hi = pos + 1 if params["causal"] else k_len
    lo = max(pos - params["window"] + 1, 0) if params["window"] else 0
    return np.arange(lo, hi)


def _prefill_rows(inputs, case):
    """(q row [Hkv, g, D], k, v [Hkv, n, D] of its attended keys) per packed query row,
    float64 as the kernel reads them."""
    d = case.dims
    hkv, g = d["kv_heads"], d["heads"] // d["kv_heads"]
    view = kernel_view({k: inputs[k] for k in ("q", "k", "v")}, case)
    for qo, q_len, ko, k_len in varlen_spans(case):
        k = view["k"][ko:ko + k_len].transpose(1, 0, 2)  # [Hkv, k_len, D]
        v = view["v"][ko:ko + k_len].transpose(1, 0, 2)
        for i in range(q_len):
            keys = prefill_keys(i, q_len, k_len, case.params)
            yield view["q"][qo + i].reshape(hkv, g, -1), k[:, keys], v[:, keys]


def sdpa_prefill_varlen(inputs: dict, case) -> dict:
    rows = [attend(q, k, v, None, scale_of(case)).reshape(case.dims["heads"], -1)
            for q, k, v in _prefill_rows(inputs, case)]
    return {"out": np.stack(rows)}


def prefill_kernel(A, inputs: dict, case) -> dict:
    rows = [attend_kernel(A, q, k, v, None, scale_of(case), case)
            .reshape(1, case.dims["heads"], case.dims["head_dim"])
            for q, k, v in _prefill_rows(inputs, case)]
    return {"out": rows[0] if len(rows) == 1 else A.concat(rows, axis=0)}


def _cu_seqlens(which: str):
    def fill(shape, dtype, rng, case, drawn):
        return np.cumsum([0, *case.params[which]])
    fill.__name__ = f"cu_seqlens({which})"
    return fill


PQ = lambda d, p: (sum(p["q_lens"]), d["heads"], d["head_dim"])  # noqa: E731
PK = lambda d, p: (sum(p["k_lens"]), d["kv_heads"], d["head_dim"])  # noqa: E731
CU = lambda d, p: (len(p["q_lens"]) + 1,)  # noqa: E731


def plant_prefill(inputs: dict, case) -> dict:
    """`nonfinite`: a NaN or inf in k or v only at keys every query of the packed batch
    attends (the module docstring's contract; `finite_unattended`): with one sequence, the keys
    every one of its queries attends; with several, none (each sequence's keys are ones the
    others' queries do not attend; a kernel over the packed batch with a block-diagonal mask
    multiplies them by 0). q keeps its own: a query row reaches only its own output. Other
    distributions: unchanged."""
    if case.dist != "nonfinite":
        return inputs
    spans = varlen_spans(case)
    read = np.zeros((np.shape(inputs["k"])[0], 1, 1), dtype=bool)  # packed keys [Σ k_len, Hkv, D]
    for _, q_len, ko, k_len in spans if len(spans) == 1 else ():
        common = set(range(k_len))
        for i in range(q_len):
            common &= set(prefill_keys(i, q_len, k_len, case.params).tolist())
        read[[ko + j for j in sorted(common)]] = True
    return finite_unattended(inputs, ("k", "v"), read)


def _prefill_flops(case) -> int:
    p, d = case.params, case.dims
    pairs = sum(len(prefill_keys(i, q, k, p))
                for _, q, _, k in varlen_spans(case) for i in range(q))
    return 4 * pairs * d["heads"] * d["head_dim"]


register(OpSpec(
    name="sdpa_prefill_varlen", family="attention", domain=varlen_spans,
    dims=("heads", "kv_heads", "head_dim"),
    inputs=(TensorSpec("cu_seqlens_q", CU, role="i32", init=_cu_seqlens("q_lens"),
                       adversarial=False),
            TensorSpec("cu_seqlens_k", CU, role="i32", init=_cu_seqlens("k_lens"),
                       adversarial=False),
            TensorSpec("q", PQ), TensorSpec("k", PK), TensorSpec("v", PK)),
    outputs=(TensorSpec("out", PQ),),
    oracle=sdpa_prefill_varlen, tolerance=None, kernel=prefill_kernel,
    bytes=lambda case: case.spec.io_bytes(case), flops=_prefill_flops,
    params={"q_lens": (2,), "k_lens": (5,), "causal": 1, "window": 0, "scale": 0.0,
            "probs": "f32", "ftz": 0},
    param_values={"causal": (0, 1), "probs": PROBS}, inf_may_be_nan=True, chain_input="q",
    doc=PREFILL_DOC, plant=lambda inputs, case: plant_prefill(inputs, case)))
