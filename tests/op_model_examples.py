"""Test-only examples of issue 24's op model (item 4), loaded as a plugin
(`kparity --plugin tests/op_model_examples.py check --op kv_append`), never registered by
default. Each registers an op (or pipeline), its gate cases, a correct torch impl and mutants.

| op / impl                          | what it shows                                              |
|------------------------------------|------------------------------------------------------------|
| kv_append                          | an output aliasing an input (a KV cache updated in place at |
|                                    | per-sequence positions); per-sequence lengths in params    |
|                                    | that shapes read                                           |
| torch:kv_append, mlx:kv_append     | correct (in place on torch; a fresh array on MLX)          |
| torch:mutant_kv_append_one_past    | writes one slot past each sequence's new rows (a `<=` loop  |
|                                    | over flat memory): `outside_region`, or `oob_write` when    |
|                                    | the slot lies past the cache's end                         |
| row_sum                            | out = T(sum_i x_i) per row                                 |
| torch:row_sum_split                | two launches: split (partial sums of 256-element chunks)    |
|                                    | and combine (one warp: at most 32 partial sums), each with  |
|                                    | its own contract                                           |
| scale_cols                         | out = T(x · s), s an f32 vector over columns               |
| torch:scale_cols                   | correct                                                    |
| torch:mutant_scale_cols_s_in_T     | rounds s to T before the multiply (wrong for f16 / bf16)    |
| torch:mutant_rms_norm_round_early  | rms_norm rounding x·inv to T before the weight while       |
|                                    | claiming one rounding                                      |
| norm_scale (pipeline)              | rms_norm -> scale_cols                                     |
| torch:norm_scale_staged            | the stages' torch impls: passes                            |
| torch:norm_scale_bad_norm          | stage norm is the mutant: named as the failing stage       |
| torch:norm_scale_bad_scale         | stage scale is the mutant: named as the failing stage      |
| torch:norm_scale_fused             | one fused impl (the stored intermediate rounded to T)      |
| torch:mutant_norm_scale_unrounded  | fused, skipping the intermediate store's rounding: the     |
|                                    | end-to-end bound catches it (f16 / bf16)                   |
"""

from __future__ import annotations

import math

import numpy as np

from cases.model import Case
from cases.registry import gate_cases
from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch, rounding_once
from gpu_impls.impl import Impl
from gpu_impls.staged import staged
from oracle.pipeline import Pipeline, Stage, register_pipeline
from oracle.spec import OpSpec, TensorSpec, register as register_op

DTYPES = ("f32", "f16", "bf16")


# --- kv_append: an aliased output, per-sequence lengths -----------------------------------------
#
# cache [seqs, max_len, d] T holds cache_lens[s] rows of sequence s; new [sum(new_lens), d] T
# packs every sequence's new rows (vLLM's varlen layout). The op appends sequence s's rows at
# slots [cache_lens[s], cache_lens[s] + new_lens[s]), each scaled by the f32 param `scale` (a
# K-scale) and rounded to T once: cache[s, c_s + i] = T(new[o_s + i] · scale), o_s the sum of
# the earlier new_lens. Every other element of the cache is left as it was.

def _seqs(params) -> list[tuple[int, int, int]]:
    """(cache length, new length, offset into `new`) per sequence."""
    cache_lens, new_lens = params["cache_lens"], params["new_lens"]
    if len(cache_lens) != len(new_lens):
        raise ValueError(f"kv_append: {len(cache_lens)} cache_lens but {len(new_lens)} new_lens")
    offsets = np.concatenate([[0], np.cumsum(new_lens)]).astype(int)
    return [(c, n, int(o)) for c, n, o in zip(cache_lens, new_lens, offsets)]


CACHE = lambda d, p: (len(p["cache_lens"]), d["max_len"], d["d"])  # noqa: E731
NEW = lambda d, p: (sum(p["new_lens"]), d["d"])  # noqa: E731


def appended(case, inputs) -> np.ndarray:
    """The slots the append writes: [c_s, c_s + n_s) of each sequence s (all of d)."""
    max_len = case.dims["max_len"]
    mask = np.zeros(CACHE(case.dims, case.params), dtype=bool)
    for s, (c, n, _) in enumerate(_seqs(case.params)):
        if c + n > max_len:
            raise ValueError(f"kv_append: sequence {s} holds {c} rows and appends {n}: more "
                             f"than max_len={max_len}")
        mask[s, c:c + n] = True
    return mask


def _placed(inputs, case) -> tuple[np.ndarray, np.ndarray]:
    """(the cache with each new row in its slot, the factor per element: scale in the written
    slots, 1 elsewhere), float64."""
    src = np.asarray(inputs["cache"]).astype(np.float64)
    factor = np.ones_like(src)
    new = np.asarray(inputs["new"]).astype(np.float64)
    for s, (c, n, o) in enumerate(_seqs(case.params)):
        src[s, c:c + n] = new[o:o + n]
        factor[s, c:c + n] = float(np.float32(case.params["scale"]))
    return src, factor


def kv_append(inputs, case) -> dict:
    src, factor = _placed(inputs, case)
    return {"cache": src * factor}


def kv_append_kernel(A, inputs, case) -> dict:
    """One f32 multiply per written element, then the store (outside the written slots the
    runner holds the cache to its input bits, whatever this charges there)."""
    src, factor = _placed(inputs, case)
    return {"cache": A.load(src) * A.load(factor)}


register_op(OpSpec(
    name="kv_append", family="test", dims=("max_len", "d"),
    inputs=(TensorSpec("cache", CACHE), TensorSpec("new", NEW)),
    outputs=(TensorSpec("cache", CACHE, aliases="cache", writes=appended),),
    oracle=kv_append, tolerance=None, kernel=kv_append_kernel,
    bytes=lambda case: 2 * sum(case.params["new_lens"]) * case.dims["d"] * 4,
    flops=lambda case: sum(case.params["new_lens"]) * case.dims["d"],
    params={"cache_lens": (0,), "new_lens": (1,), "scale": 0.3}, doc=__doc__))

KV_LENS = (  # (cache_lens, new_lens, max_len): ragged, an empty append, a sequence filled up
    ((2, 5, 0), (3, 1, 4), 8),
    ((0,), (16,), 16),
    ((7, 0, 3, 15), (1, 0, 6, 1), 16),
    ((1, 4), (2, 4), 8),
)


@gate_cases("kv_append")
def kv_append_cases():
    return [Case.make("kv_append", {"max_len": max_len, "d": d}, dtype, dist,
                      params={"cache_lens": cache_lens, "new_lens": new_lens},
                      label="preset:ragged")
            for cache_lens, new_lens, max_len in KV_LENS for d in (4, 64)
            for dtype in DTYPES for dist in ("normal", "tiny", "nonfinite")]


FITS = Invariant(
    name="cache_lens + new_lens <= max_len",
    holds=lambda ns: len(ns["cache_lens"]) == len(ns["new_lens"]) and all(
        c + n <= ns["max_len"] for c, n in zip(ns["cache_lens"], ns["new_lens"])),
    why="each sequence's new rows must fit its cache: a longer append writes past it",
    fix=lambda ns: f"max_len >= {max(c + n for c, n in zip(ns['cache_lens'], ns['new_lens']))}",
    violation={"cache_lens": (6,), "new_lens": (3,), "max_len": 8},
    shows=("cache_lens", "new_lens", "max_len"))
KV_CONTRACT = Contract(invariants=(FITS,))


def _scaled_rows(inputs, case):
    scale = float(np.float32(case.params["scale"]))
    return inputs["new"].float() * scale


def torch_kv_append(launch, inputs, outputs, case):
    """Each sequence's rows copied into its slots of the cache itself (outputs["cache"] is
    inputs["cache"])."""
    cache = outputs["cache"]
    rows = _scaled_rows(inputs, case).to(cache.dtype)
    for s, (c, n, o) in enumerate(_seqs(case.params)):
        cache[s, c:c + n] = rows[o:o + n]


def torch_kv_append_one_past(launch, inputs, outputs, case):
    """As a kernel over flat memory whose loop runs `i <= n`: it writes slot c + n too (with
    the next packed row, the last one past the end), into the next sequence's slots, or past
    the cache's end, which device memory (here: the storage around the view) allows."""
    cache = outputs["cache"]
    max_len, d = case.dims["max_len"], case.dims["d"]
    rows = _scaled_rows(inputs, case).to(cache.dtype)
    flat = cache.as_strided((cache.numel() + d,), (1,), cache.storage_offset())
    for s, (c, n, o) in enumerate(_seqs(case.params)):
        if n == 0:
            continue
        for i in range(n + 1):
            start = (s * max_len + c + i) * d
            flat[start:start + d] = rows[min(o + i, rows.shape[0] - 1)]


def mlx_kv_append(launch, inputs, outputs, case):
    """MLX arrays are values: the updated cache is returned whole."""
    import mlx.core as mx

    cache = inputs["cache"]
    scale = float(np.float32(case.params["scale"]))
    rows = (inputs["new"].astype(mx.float32) * scale).astype(cache.dtype)
    for s, (c, n, o) in enumerate(_seqs(case.params)):
        if n:
            cache[s, c:c + n] = rows[o:o + n]
    return {"cache": cache}


register(
    Impl("kv_append", "torch", "kv_append", torch_kv_append, KV_CONTRACT, doc="test-only"),
    Impl("kv_append", "torch", "mutant_kv_append_one_past", torch_kv_append_one_past,
         KV_CONTRACT, doc="test-only: writes one slot past each sequence's new rows"),
    Impl("kv_append", "mlx", "kv_append", mlx_kv_append, KV_CONTRACT, doc="test-only"))


# --- row_sum: one op, an impl with two launches ----------------------------------------------

def row_sum(inputs, case) -> dict:
    return {"out": np.asarray(inputs["x"]).astype(np.float64).sum(axis=-1)}


def row_sum_kernel(A, inputs, case) -> dict:
    return {"out": A.sum(A.load(inputs["x"]))}


register_op(OpSpec(
    name="row_sum", family="test", dims=("rows", "n"),
    inputs=(TensorSpec("x", lambda d: (d["rows"], d["n"])),),
    outputs=(TensorSpec("out", lambda d: (d["rows"],)),),
    oracle=row_sum, tolerance=None, kernel=row_sum_kernel,
    bytes=lambda case: 4 * case.dims["rows"] * (case.dims["n"] + 1),
    flops=lambda case: case.dims["rows"] * case.dims["n"], doc="out = T(sum_i x_i), per row"))


@gate_cases("row_sum")
def row_sum_cases():
    return [Case.make("row_sum", {"rows": 3, "n": n}, dtype, dist, label="preset:rows")
            for n in (8, 256, 264, 1024, 8192) for dtype in DTYPES
            for dist in ("normal", "outlier_rows", "nonfinite")]


CHUNK = 256  # elements per split block


def split_geometry(dims, params):
    parts = math.ceil(dims["n"] / CHUNK)
    return {"parts": parts}, Launch(grid=(dims["rows"], parts, 1), block=(CHUNK // 8, 1, 1))


def combine_geometry(dims, params):
    # `parts` is the split's: an earlier launch's derived names reach the later ones
    return {"lanes": 32}, Launch(grid=(dims["rows"], 1, 1), block=(32, 1, 1),
                                 extra={"parts": params["parts"]})


SPLIT = Contract(
    invariants=(Invariant(
        name="n % 8 == 0", holds=lambda ns: ns["n"] % 8 == 0,
        why="each split thread loads 8 elements (one 16-byte vector of f16/bf16)",
        fix=lambda ns: f"n = {ns['n'] // 8 * 8} or {ns['n'] // 8 * 8 + 8}",
        violation={"n": 1001}, shows=("n",)),),
    geometry=split_geometry)
COMBINE = Contract(
    invariants=(Invariant(
        name="parts <= lanes", holds=lambda ns: ns["parts"] <= ns["lanes"],
        why="the combine sums the partial sums in one warp, one lane each",
        fix=lambda ns: f"n <= {ns['lanes'] * CHUNK}", violation={"n": 33 * CHUNK},
        shows=("n", "parts", "lanes")),),
    geometry=combine_geometry)


def torch_row_sum_split(launch, inputs, outputs, case):
    """launch["split"]: f32 partial sums of 256-element chunks; launch["combine"]: their sum."""
    import torch.nn.functional as F

    x = inputs["x"].float()
    parts = launch["split"].grid[1]
    chunks = F.pad(x, (0, parts * CHUNK - x.shape[-1])).view(x.shape[0], parts, CHUNK)
    partial = chunks.sum(-1)
    assert partial.shape[-1] <= launch["combine"].block[0]  # what the combine's warp holds
    outputs["out"].copy_(partial.sum(-1).to(outputs["out"].dtype))


register(Impl("row_sum", "torch", "row_sum_split", torch_row_sum_split,
              launches={"split": SPLIT, "combine": COMBINE}, doc="test-only: two launches"))


# --- scale_cols and the pipeline norm_scale ----------------------------------------------------

ROWS = lambda d: (d["rows"], d["n"])  # noqa: E731


def scale_cols(inputs, case) -> dict:
    return {"out": np.asarray(inputs["x"]).astype(np.float64)
            * np.asarray(inputs["s"]).astype(np.float64)}


def scale_cols_kernel(A, inputs, case) -> dict:
    """One f32 multiply, then the store. `A.load` takes an interval as it is: a pipeline hands
    this stage its predecessor's stored output that way."""
    return {"out": A.load(inputs["x"]) * A.load(inputs["s"])}


register_op(OpSpec(
    name="scale_cols", family="test", dims=("rows", "n"),
    inputs=(TensorSpec("x", ROWS), TensorSpec("s", lambda d: (d["n"],), role="f32",
                                              init="weight")),
    outputs=(TensorSpec("out", ROWS),), oracle=scale_cols, tolerance=None,
    kernel=scale_cols_kernel, bytes=lambda case: 0, flops=lambda case: 0,
    doc="out = T(x · s), s f32 per column"))

NORM_SCALE = Pipeline(
    name="norm_scale", family="test",
    stages=(Stage("norm", "rms_norm"), Stage("scale", "scale_cols", wires={"x": "norm.out"})),
    doc="rms_norm, stored in T, then scaled per column: out = T(T(rms_norm(x, w)) · s)")
register_pipeline(NORM_SCALE)


@gate_cases("norm_scale")
def norm_scale_cases():
    return [Case.make("norm_scale", {"rows": 4, "n": n}, dtype, dist, label="preset:small")
            for n in (64, 1024) for dtype in DTYPES
            for dist in ("normal", "outlier_rows", "tiny", "zero_rows", "nonfinite")]


def torch_scale_cols(launch, inputs, outputs, case):
    return {"out": (inputs["x"].float() * inputs["s"]).to(inputs["x"].dtype)}


def torch_scale_cols_s_in_t(launch, inputs, outputs, case):
    x = inputs["x"]
    return {"out": (x.float() * inputs["s"].to(x.dtype).float()).to(x.dtype)}


def torch_rms_norm_round_early(launch, inputs, outputs, case):
    import torch

    x = inputs["x"].float()
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                              + float(np.float32(case.params["eps"])))).to(inputs["x"].dtype)
    return {"out": (normed.float() * inputs["w"].float()).to(inputs["x"].dtype)}


def _norm_scale(inputs, case, rounded: bool):
    import torch

    x = inputs["x"].float()
    eps = float(np.float32(case.params["eps"]))
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * inputs["w"].float()
    if rounded:  # the pipeline's stored intermediate
        normed = normed.to(inputs["x"].dtype).float()
    return {"out": (normed * inputs["s"]).to(inputs["x"].dtype)}


ONCE = Contract(invariants=rounding_once("a non-mutant impl")
                + (Invariant("weight_offset == 0", lambda ns: ns["weight_offset"] == 0,
                             "the test impls add no weight offset", lambda ns: "weight_offset=0",
                             {"weight_offset": 1}, ("weight_offset",)),))

register(
    Impl("scale_cols", "torch", "scale_cols", torch_scale_cols, doc="test-only"),
    Impl("scale_cols", "torch", "mutant_scale_cols_s_in_T", torch_scale_cols_s_in_t,
         doc="test-only: s rounded to T before the multiply"),
    Impl("rms_norm", "torch", "mutant_rms_norm_round_early", torch_rms_norm_round_early, ONCE,
         doc="test-only: T(x·inv) before the weight, claiming one rounding"),
    staged("norm_scale", "torch", "norm_scale_staged",
           {"norm": "torch:rms_norm", "scale": "torch:scale_cols"}),
    staged("norm_scale", "torch", "norm_scale_bad_norm",
           {"norm": "torch:mutant_rms_norm_round_early", "scale": "torch:scale_cols"}),
    staged("norm_scale", "torch", "norm_scale_bad_scale",
           {"norm": "torch:rms_norm", "scale": "torch:mutant_scale_cols_s_in_T"}),
    Impl("norm_scale", "torch", "norm_scale_fused",
         lambda launch, inputs, outputs, case: _norm_scale(inputs, case, rounded=True), ONCE,
         doc="test-only: the pipeline in one function"),
    Impl("norm_scale", "torch", "mutant_norm_scale_unrounded",
         lambda launch, inputs, outputs, case: _norm_scale(inputs, case, rounded=False), ONCE,
         doc="test-only: fused, without the intermediate's rounding to T"))
