"""KV cache update, `kv_cache_update` (the seed: metaltile-std `src/ffai/kv_cache.rs`, tol 0): a
step's new k and v rows written into the cache at their slots; every other element of the cache
keeps its bits.
Exact: a copy (`Exact()` comparator, tolerance 0).

    k, v [tokens + pad, Hkv, D] in T     the sequences' new rows, packed (vLLM's varlen
                                         layout), then `pad` padding rows
    slots [tokens + pad] i32             each row's slot; -1 for a padding row, which is
                                         skipped (vLLM's slot_mapping: a CUDA graph's padding)

Layouts (param `layout`):

    contiguous  k_cache, v_cache [B, Hkv, max_len, D] (HF's StaticCache, MLX's KVCache):
                slot = b · max_len + position
    paged       [pages, page_size, Hkv, D], pages = B · max_len / page_size (vLLM's
                reshape_and_cache_flash): slot = page · page_size + offset, each sequence's
                logical pages a random permutation of the pool (drawn with the case's inputs)

Sequence b (B = len(cache_lens)) holds cache_lens[b] rows and appends new_lens[b] of them, at
positions cache_lens[b] .. cache_lens[b] + new_lens[b] - 1. The caches are the outputs,
aliasing the inputs (`TensorSpec.aliases`): the runner poisons only the written slots and flags
any other element that changes (`outside_region`): a write one slot off, or a padding row's -1
taken as the last slot, is caught there even when the value written happens to match.
"""

from __future__ import annotations

import numpy as np

from oracle.comparators import Exact
from oracle.dtypes import storage_dtype
from oracle.spec import OpSpec, TensorSpec, register


def sequences(case) -> list[tuple[int, int]]:
    """(cache length, new length) per sequence, checked to fit max_len (and whole pages)."""
    p, max_len = case.params, case.dims["max_len"]
    cache_lens, new_lens = p["cache_lens"], p["new_lens"]
    if len(cache_lens) != len(new_lens):
        raise ValueError(f"kv_cache_update: {len(cache_lens)} cache_lens but {len(new_lens)} "
                         "new_lens: one of each per sequence")
    for b, (c, n) in enumerate(zip(cache_lens, new_lens)):
        if c + n > max_len:
            raise ValueError(f"kv_cache_update: sequence {b} holds {c} rows and appends {n}: "
                             f"more than max_len={max_len}")
    if p["layout"] == "paged" and max_len % p["page_size"]:
        raise ValueError(f"kv_cache_update: max_len={max_len} is not a whole number of pages "
                         f"of page_size={p['page_size']}")
    return list(zip(cache_lens, new_lens))


def cache_shape(d, p) -> tuple[int, ...]:
    b = len(p["cache_lens"])
    if p["layout"] == "paged":
        return (b * d["max_len"] // p["page_size"], p["page_size"], d["heads"], d["head_dim"])
    return (b, d["heads"], d["max_len"], d["head_dim"])


NEW = lambda d, p: (sum(p["new_lens"]) + p["pad"], d["heads"], d["head_dim"])  # noqa: E731
SLOTS = lambda d, p: (sum(p["new_lens"]) + p["pad"],)  # noqa: E731


def slot_index(slots: np.ndarray, case) -> tuple[np.ndarray, tuple]:
    """(the rows that are written: slot >= 0, the cache index of their [Hkv, D] blocks)."""
    slots = np.asarray(slots).astype(np.int64)
    valid = slots >= 0
    s = slots[valid]
    if case.params["layout"] == "paged":
        size = case.params["page_size"]
        return valid, (s // size, s % size)
    max_len = case.dims["max_len"]
    return valid, (s // max_len, slice(None), s % max_len)


def written(case, inputs) -> np.ndarray:
    """The cache elements the update writes: every slot's [Hkv, D] block."""
    sequences(case)
    mask = np.zeros(cache_shape(case.dims, case.params), dtype=bool)
    mask[slot_index(inputs["slots"], case)[1]] = True
    return mask


def kv_cache_update(inputs: dict, case) -> dict:
    valid, index = slot_index(inputs["slots"], case)
    out = {}
    for cache, new in (("k_cache", "k"), ("v_cache", "v")):
        updated = np.asarray(inputs[cache]).astype(np.float64)
        updated[index] = np.asarray(inputs[new]).astype(np.float64)[valid]
        out[cache] = updated
    return out


def _bytes(case) -> int:
    """The new rows read and written into the cache (k and v), and the slots."""
    rows = int(np.prod(NEW(case.dims, case.params)))
    itemsize = storage_dtype(case.dtype).itemsize
    return 2 * 2 * rows * itemsize + 4 * SLOTS(case.dims, case.params)[0]


def _cache(name: str) -> TensorSpec:
    return TensorSpec(name, cache_shape, aliases=name, writes=written, comparator=Exact())


register(OpSpec(
    name="kv_cache_update", family="kv_cache", dims=("heads", "head_dim", "max_len"),
    domain=sequences,
    inputs=(TensorSpec("k_cache", cache_shape), TensorSpec("v_cache", cache_shape),
            TensorSpec("k", NEW), TensorSpec("v", NEW),
            TensorSpec("slots", SLOTS, role="i32", init="kv_slots", adversarial=False)),
    outputs=(_cache("k_cache"), _cache("v_cache")),
    oracle=kv_cache_update,
    tolerance=lambda inputs, exact, case: {"k_cache": 0.0, "v_cache": 0.0},
    bytes=_bytes, flops=lambda case: 0,
    params={"layout": "contiguous", "page_size": 16, "cache_lens": (0,), "new_lens": (1,),
            "pad": 0},
    param_values={"layout": ("contiguous", "paged")},
    doc=__doc__, chain_input="k"))
