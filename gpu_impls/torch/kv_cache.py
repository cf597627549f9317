"""PyTorch KV cache updates (`oracle/kv_cache.py`), in place in the cache the runner hands over.

`torch:kv_cache_update`: the padding rows (slot -1) dropped, then advanced indexing for the
contiguous cache (`cache[b, :, pos] = rows`) and `index_copy_` over the flattened slots for the
paged one (vLLM's native fallback). `torch:static_cache_index_copy`: HF's StaticCache.update,
`cache.index_copy_(2, cache_position, new)`: one position list shared by the batch, so it takes
only contiguous caches whose sequences all hold and append the same numbers of rows, unpadded.
"""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, param_is
from gpu_impls.impl import Impl

PAIRS = (("k_cache", "k"), ("v_cache", "v"))


def _update(launch, inputs, outputs, case):
    slots = inputs["slots"].long()
    valid = slots >= 0
    s = slots[valid]
    for cache_name, new_name in PAIRS:
        cache, rows = outputs[cache_name], inputs[new_name][valid]
        if case.params["layout"] == "paged":
            cache.view(-1, *cache.shape[2:]).index_copy_(0, s, rows)
        else:
            max_len = cache.shape[2]
            cache[s // max_len, :, s % max_len] = rows


def _static_index_copy(launch, inputs, outputs, case):
    import torch

    b, c, n = len(case.params["cache_lens"]), case.params["cache_lens"][0], \
        case.params["new_lens"][0]
    position = torch.arange(c, c + n, device=inputs["k"].device)
    for cache_name, new_name in PAIRS:
        new = inputs[new_name]
        outputs[cache_name].index_copy_(2, position,
                                        new.view(b, n, *new.shape[1:]).transpose(1, 2))


EQUAL_LENGTHS = Invariant(
    name="equal cache_lens and new_lens",
    holds=lambda ns: len(set(ns["cache_lens"])) == 1 and len(set(ns["new_lens"])) == 1,
    why="StaticCache writes one cache_position list for the whole batch",
    fix=lambda ns: "torch:kv_cache_update for ragged batches",
    violation={"cache_lens": (0, 1), "new_lens": (1, 1)}, shows=("cache_lens", "new_lens"))
UNPADDED = Invariant(
    name="pad == 0", holds=lambda ns: ns["pad"] == 0,
    why="index_copy_ has no skip for a padding row's slot -1",
    fix=lambda ns: "pad = 0, or torch:kv_cache_update", violation={"pad": 1}, shows=("pad",))

register(
    Impl("kv_cache_update", "torch", "kv_cache_update", _update,
         doc="advanced indexing (contiguous) / index_copy_ on the flat slots (paged), in place"),
    Impl("kv_cache_update", "torch", "static_cache_index_copy", _static_index_copy,
         Contract(invariants=(param_is("layout", "contiguous", "torch:kv_cache_update",
                                       other="paged"), EQUAL_LENGTHS, UNPADDED)),
         doc="HF StaticCache.update: cache.index_copy_(2, cache_position, new), in place"),
)
