"""MLX KV cache update (`oracle/kv_cache.py`): MLX arrays are values, so the updated caches
are returned whole; the slots of the written rows (padding's -1 dropped on the host, where a
step's slot mapping is built) scatter the rows by index assignment."""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.impl import Impl


def _update(launch, inputs, outputs, case):
    import mlx.core as mx

    slots = np.array(inputs["slots"])
    rows = mx.array(np.flatnonzero(slots >= 0).astype(np.int32))
    s = mx.array(slots[slots >= 0].astype(np.int32))
    out = {}
    for cache_name, new_name in (("k_cache", "k"), ("v_cache", "v")):
        cache, new = inputs[cache_name], inputs[new_name][rows]
        if case.params["layout"] == "paged":
            flat = cache.reshape(-1, *cache.shape[2:])
            flat[s] = new
            out[cache_name] = flat.reshape(cache.shape)
        else:
            max_len = cache.shape[2]
            cache[s // max_len, :, s % max_len] = new
            out[cache_name] = cache
    return out


register(Impl("kv_cache_update", "mlx", "kv_cache_update", _update,
              doc="index assignment on the flat slots (paged) or [b, :, pos] (contiguous)"))
