"""Attention cases (`oracle/attention.py`): decode against a contiguous or paged KV cache at the
models' head shapes (`cases/configs.py`), the adversarial score distributions, and the split-KV
combine.

Gate cases stay small (CI runs every one on torch and MLX CPU): three sequences of 256, 1 and 17
keys at each model's heads (the lengths `seq_lens` draws), the adversarial distributions at
8/2 heads × 64, head_dim 96 and 256 edges, page sizes 16/32/64 with lengths on and beside page
boundaries, and one 4096-key sequence (Gemma-3's single KV head). Bench cases are the models'
decode shapes at 4096, 32768 and 131072 keys, batch 1, 8, 32 and 64 (a batch of 64 up to 4096 keys,
8 up to 32768: the float64 inputs must fit a host), every sequence full.
"""

from __future__ import annotations

from itertools import product

import numpy as np

from cases.configs import config
from cases.distributions import values as distribution_values
from cases.inits import init
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.attention import attended, cache_len
from oracle.dtypes import FLOAT_DTYPES

# (preset, model, params): the decode attention of each model; GPT-OSS's sliding-window layers
# with their learned sinks and 128-key window (openai/gpt-oss `torch/model.py`, HF
# `modeling_gpt_oss.py`: even layers attend keys i-128 < j <= i).
GPT_OSS_SWA = {"sinks": 1, "window": 128}
PRESETS = (("llama-3.1-8b", {}), ("llama-3.2-1b", {}), ("qwen3-0.6b", {}), ("gemma-3-1b", {}),
           ("gpt-oss-20b", GPT_OSS_SWA), ("qwen3-next-80b-a3b", {}))
GATE_LEN, GATE_BATCH = 256, 3  # lengths 256, 1, 17 (`seq_lens`)
HALF = ("f16", "bf16")
# The adversarial distributions, at small heads (the bound's behaviour is per (sequence, head)).
ADVERSARIAL = ("outlier_rows", "f16_overflow", "tiny", "zero_rows", "constant_rows",
               "nonfinite", "near_tie", "clear_margin", "equal_keys")
SMALL = {"batch": GATE_BATCH, "heads": 8, "kv_heads": 2, "head_dim": 64, "max_len": 64}
SMALL_SWA = {"sinks": 1, "window": 16}
BENCH_SHAPES = ((1, 4096), (1, 32768), (1, 131072), (8, 4096), (8, 32768), (32, 4096),
                (64, 4096))


def heads(model: str) -> dict:
    m = config(model)
    return {"heads": m.heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim}


# --- inits ---------------------------------------------------------------------------------------

@init("seq_lens")
def seq_lens(shape, dtype, rng, case, drawn):
    """Per-sequence lengths: every sequence full (param ragged=0), else max_len, 1, 17, then
    (paged) a page and one past it, then uniform in [1, max_len]."""
    n = cache_len(case.dims)
    if not case.params["ragged"]:
        return np.full(shape, n)
    page = case.dims.get("page_size", 0)
    pattern = [n, 1, 17] + ([page + 1, page, page - 1] if page else [n - 1])
    out = rng.integers(1, n + 1, shape)
    out[:min(len(pattern), shape[0])] = pattern[:shape[0]]
    return np.clip(out, 1, n)


@init("page_table")
def page_table(shape, dtype, rng, case, drawn):
    """Each sequence's pages: distinct pages of the pool in random order (page 0, the null page,
    never used); entries past a sequence's last page 0."""
    page, num_pages = case.dims["page_size"], case.dims["num_pages"]
    need = -(-np.asarray(drawn["lengths"]).astype(np.int64) // page)
    if need.sum() > num_pages - 1:
        raise ValueError(f"sdpa_decode_paged: the sequences need {int(need.sum())} pages, the "
                         f"pool holds {num_pages - 1} besides the null page: raise num_pages")
    pool = rng.permutation(np.arange(1, num_pages))
    table, at = np.zeros(shape), 0
    for b, count in enumerate(need):
        table[b, :count] = pool[at:at + count]
        at += count
    return table


def attended_mask(case, drawn) -> np.ndarray:
    """Which slots of the cache (contiguous [B, L]; paged [num_pages, page_size]) some sequence
    attends to."""
    keys = attended(case, drawn["lengths"])
    if "page_table" not in drawn:
        mask = np.zeros((case.dims["batch"], case.dims["max_len"]), dtype=bool)
        for b, t in enumerate(keys):
            mask[b, t] = True
        return mask
    page = case.dims["page_size"]
    mask = np.zeros((case.dims["num_pages"], page), dtype=bool)
    table = np.asarray(drawn["page_table"]).astype(np.int64)
    for b, t in enumerate(keys):
        mask[table[b, t // page], t % page] = True
    return mask


@init("kv_cache", adversarial=True)
def kv_cache(shape, dtype, rng, case, drawn, dist):
    """The case's distribution in the attended slots; finite N(0, 1) stale data in the rest (a
    masked kernel may read them, with weight 0: NaN there would test what the op leaves open)."""
    x = distribution_values(dist, shape, dtype, rng)
    # [B, Hkv, L, D] against [B, L], or [pages, Hkv, P, D] against [pages, P]
    stale = ~np.broadcast_to(attended_mask(case, drawn)[:, None, :, None], shape)
    x[stale] = rng.standard_normal(int(stale.sum()))
    return x


@init("sink_logits")
def sink_logits(shape, dtype, rng, case, drawn):
    """Learned sink logits ~ N(1, 2^2): from a negligible sink to one that takes most weight."""
    return 1.0 + 2.0 * rng.standard_normal(shape)


@init("split_max")
def split_max(shape, dtype, rng, case, drawn):
    """Each split's max logit, N(0, 4^2); the last split of every third row empty (-inf: a
    sequence shorter than the splits), and one split of every fifth row 100 below its row's
    max (its rescale factor underflows f32)."""
    m = 4.0 * rng.standard_normal(shape)
    rows = m.reshape(-1, shape[-1])
    if shape[-1] > 1:
        rows[::3, -1] = -np.inf
        rows[1::5, 0] = rows[1::5, 1:].max(axis=-1) - 100.0
    return m


@init("split_sum")
def split_sum(shape, dtype, rng, case, drawn):
    """Each split's sum of exps: U(1, 64) (at least the max term's 1); 0 for an empty split."""
    return np.where(np.isneginf(drawn["m"].astype(np.float64)), 0.0,
                    rng.uniform(1.0, 64.0, shape))


@init("partial_o", adversarial=True)
def partial_o(shape, dtype, rng, case, drawn, dist):
    """A split's output: the distribution's values (as a v); times l where the partials are not
    normalized (FFAI's accumulators); 0 for an empty split."""
    o = distribution_values(dist, shape, dtype, rng)
    l = np.asarray(drawn["l"]).astype(np.float64)[..., None]
    if not case.params["normalized"]:
        with np.errstate(invalid="ignore"):  # inf * 0 of an empty split: masked out below
            o = o * l
    return np.where(l > 0, o, 0.0)


# --- sdpa_decode -----------------------------------------------------------------------------

def _decode(dims: dict, dtype: str, dist: str = "normal", label: str = "", **params) -> Case:
    return Case.make("sdpa_decode", dims, dtype, dist, params=params, label=label)


@gate_cases("sdpa_decode")
def sdpa_decode_cases() -> list[Case]:
    dims = {"batch": GATE_BATCH, "max_len": GATE_LEN}
    # f32 and bf16 at every model, f16 at the two 64-wide ones (f16 again at small heads below)
    presets = [_decode({**dims, **heads(m)}, dtype, label=f"preset:{m}", **params)
               for (m, params), dtype in product(PRESETS, FLOAT_DTYPES)
               if dtype != "f16" or config(m).head_dim == 64]
    # P rounded to T before P·V (torch's CPU flash kernel, FA2; FFAI's two-pass partials; a
    # no-op in f32): every model in bf16 (GPT-OSS's sinks and window included: the two-pass
    # kernel runs only these), one in each dtype
    probs_t = [_decode({**dims, **heads(m)}, dtype, label=f"preset:{m}-probs-T", probs="T",
                       **params) for (m, params), dtype in product(PRESETS, FLOAT_DTYPES)
               if dtype == "bf16" or m == "llama-3.1-8b"]
    adversarial = [_decode(SMALL, dtype, dist, label=f"dist:{dist}")
                   for dist, dtype in product(ADVERSARIAL, FLOAT_DTYPES)]
    adversarial += [_decode(SMALL, dtype, dist, label=f"dist:{dist}-sinks-window", **SMALL_SWA)
                    for dist, dtype in product(("outlier_rows", "near_tie", "clear_margin"),
                                               FLOAT_DTYPES)]
    # probs="T" (the two-pass kernel's partials in T), 256 keys (4 per split of 64): the near
    # tie across splits, nonfinite values through a combine, f16 partials in the subnormal range
    adversarial += [_decode({**SMALL, "max_len": GATE_LEN}, dtype, dist,
                            label=f"dist:{dist}-probs-T", probs="T", **params)
                    for dist, dtype, params in (("outlier_rows", "bf16", SMALL_SWA),
                                                ("nonfinite", "bf16", {}),
                                                ("near_tie", "bf16", {}), ("tiny", "f16", {}))]
    edges = [_decode({"batch": 2, "heads": 8, "kv_heads": 2, "head_dim": d, "max_len": 33},
                     dtype, label=f"edge:head_dim-{d}") for d, dtype in product((96, 256),
                                                                               FLOAT_DTYPES)]
    edges += [_decode({**dims, **heads("llama-3.2-1b")}, dtype, label="edge:sink-tokens-window",
                      window=64, sink_end=4) for dtype in FLOAT_DTYPES]
    # 4096 keys: eight of torch's 512-key CPU flash blocks (probs="T": torch:sdpa runs it too)
    long = [_decode({"batch": 1, "max_len": 4096, **heads("gemma-3-1b")}, "bf16",
                    label="preset:gemma-3-1b-4096", ragged=0, probs="T")]
    return presets + probs_t + adversarial + edges + long


@bench_cases("sdpa_decode")
def sdpa_decode_bench() -> list[Case]:
    """probs="T": the looser contract, so torch's SDPA (P in T) and f32-P kernels both run."""
    return [_decode({"batch": b, "max_len": n, **heads(m)}, "bf16", ragged=0, probs="T",
                    label=f"bench:{m}-b{b}-{n}", **params)
            for (m, params), (b, n) in product(PRESETS, BENCH_SHAPES)]


# --- sdpa_decode_paged -----------------------------------------------------------------------

# (preset, page size): every page size, at lengths 300, 1, 17, P + 1, P, P - 1
PAGED = (("llama-3.1-8b", 16), ("gpt-oss-20b", 32), ("gemma-3-1b", 64), ("qwen3-0.6b", 16))
PAGED_BATCH, PAGED_LEN = 6, 320


def _paged_dims(model_heads: dict, page: int, batch: int = PAGED_BATCH,
                max_len: int = PAGED_LEN) -> dict:
    pages = max_len // page
    return {"batch": batch, "page_size": page, "max_pages": pages,
            "num_pages": batch * pages + 5, **model_heads}


@gate_cases("sdpa_decode_paged")
def sdpa_decode_paged_cases() -> list[Case]:
    # the layout is what the paged cases add: bf16 at every page size, f32 and f16 once
    presets = [Case.make("sdpa_decode_paged", _paged_dims(heads(m), page), dtype,
                         params=dict(PRESETS)[m], label=f"preset:{m}-page{page}")
               for (m, page), dtype in product(PAGED, FLOAT_DTYPES)
               if dtype == "bf16" or m == "gpt-oss-20b"]
    probs_t = [Case.make("sdpa_decode_paged", _paged_dims(heads(m), page), dtype,
                         params={"probs": "T"}, label=f"preset:{m}-page{page}-probs-T")
               for (m, page), dtype in product(PAGED, ("bf16",)) if m != "gpt-oss-20b"]
    small = {k: v for k, v in SMALL.items() if k != "max_len" and k != "batch"}
    adversarial = [Case.make("sdpa_decode_paged", _paged_dims(small, 16, max_len=64), "bf16",
                             dist, label=f"dist:{dist}")
                   for dist in ("outlier_rows", "nonfinite", "near_tie", "equal_keys")]
    return presets + probs_t + adversarial


@bench_cases("sdpa_decode_paged")
def sdpa_decode_paged_bench() -> list[Case]:
    return [Case.make("sdpa_decode_paged", _paged_dims(heads(m), 16, b, n), "bf16",
                      params={"ragged": 0, "probs": "T", **params},
                      label=f"bench:{m}-b{b}-{n}-page16")
            for (m, params), (b, n) in product(PRESETS[:2], BENCH_SHAPES[:2])]


# --- attn_combine ----------------------------------------------------------------------------

def _combine(dims: dict, dtype: str, dist: str = "normal", label: str = "", dtypes=None,
             **params) -> Case:
    return Case.make("attn_combine", dims, dtype, dist, params=params, label=label,
                     dtypes=dtypes)


@gate_cases("attn_combine")
def attn_combine_cases() -> list[Case]:
    base = {"batch": 3, "heads": 8, "head_dim": 128}
    splits = [_combine({**base, "splits": s}, dtype, label=f"preset:splits-{s}", normalized=n)
              for s, n, dtype in product((1, 5, 64), (0, 1), FLOAT_DTYPES)]
    sinks = [_combine({**base, "splits": 5}, dtype, label="preset:sinks", sinks=1)
             for dtype in FLOAT_DTYPES]
    dists = [_combine({**base, "splits": 5, "head_dim": 64}, "bf16", dist, label=f"dist:{dist}")
             for dist in ("outlier_rows", "tiny", "nonfinite")]
    # FFAI's pass 2 (cuda:sdpa_decode_2pass_pass2): partials in T, a multiple of 32 splits
    partial_t = [_combine({**base, "splits": 32}, dtype, label="preset:ffai-partials-in-T",
                          dtypes={"partial": dtype}) for dtype in HALF]
    partial_t += [_combine({**base, "splits": 64}, dtype, label="preset:ffai-partials-in-T-sinks",
                           sinks=1, dtypes={"partial": dtype}) for dtype in HALF]
    partial_t += [_combine({**base, "splits": 32, "head_dim": 64}, "bf16", "nonfinite",
                           label="dist:nonfinite-ffai-partials-in-T", dtypes={"partial": "bf16"})]
    return splits + sinks + dists + partial_t


@bench_cases("attn_combine")
def attn_combine_bench() -> list[Case]:
    return [_combine({"batch": b, "heads": 32, "splits": s, "head_dim": 128}, "bf16",
                     label=f"bench:b{b}-splits{s}") for b, s in ((1, 64), (8, 32), (64, 8))]




# --- sdpa_prefill_varlen -----------------------------------------------------------------------

# (q_lens, k_lens): a 12-key cached prefix, a single new token against 40 keys (decode-like), a
# fresh prompt (q = k); GPT-OSS's: 6 new tokens after 134 cached, so its 128-key window bites.
# Small: the kernel model runs per query row.
PREFILL_LENS = ((4, 1, 13), (16, 40, 13))
PREFILL_SWA_LENS = ((6, 3), (140, 20))
PREFILL_PRESETS = (("llama-3.1-8b", {}), ("qwen3-next-80b-a3b", {}),
                   ("gemma-3-1b", {"causal": 0}), ("gpt-oss-20b", {"window": 128}))


def _prefill(model_heads: dict, dtype: str, lens, dist: str = "normal", label: str = "",
             **params) -> Case:
    return Case.make("sdpa_prefill_varlen", model_heads, dtype, dist,
                     params={"q_lens": lens[0], "k_lens": lens[1], **params}, label=label)


@gate_cases("sdpa_prefill_varlen")
def sdpa_prefill_varlen_cases() -> list[Case]:
    def lens(params):
        return PREFILL_SWA_LENS if params.get("window") else PREFILL_LENS
    presets = [_prefill(heads(m), dtype, lens(params), label=f"preset:{m}", **params)
               for (m, params), dtype in product(PREFILL_PRESETS, FLOAT_DTYPES)
               if dtype != "f16" or m == "llama-3.1-8b"]
    probs_t = [_prefill(heads(m), "bf16", lens(params), label=f"preset:{m}-probs-T",
                        probs="T", **params) for m, params in PREFILL_PRESETS]
    small = {k: SMALL[k] for k in ("heads", "kv_heads", "head_dim")}
    # no `nonfinite`: one NaN or inf in every row reaches nearly every query, through keys it
    # does not attend too (a masked P·V multiplies them by 0: NaN), which the op leaves open
    adversarial = [_prefill(small, "bf16", PREFILL_LENS, dist, label=f"dist:{dist}")
                   for dist in ("outlier_rows", "tiny", "constant_rows", "zero_rows")]
    return presets + probs_t + adversarial


@bench_cases("sdpa_prefill_varlen")
def sdpa_prefill_varlen_bench() -> list[Case]:
    """Chunked prefill: 4 sequences of 512 new tokens after 3584 cached (4096 keys)."""
    return [_prefill(heads(m), "bf16", ((512,) * 4, (4096,) * 4), label=f"bench:{m}-chunk512",
                     probs="T", **params) for m, params in PREFILL_PRESETS]
