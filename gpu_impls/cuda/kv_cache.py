"""CUDA `kv_cache_update` (`kernels/kv_cache_update.cu`): the new k and v rows copied into the
caches at their slots, in place (the caches are the outputs, aliasing the inputs), contiguous
`[B, H, max_len, D]` and paged `[pages, page_size, H, D]` layouts; a padding row (slot -1) is
skipped. Exact: raw storage bits, no arithmetic. One thread per element of k (and v), 256-thread
blocks over rows * H * D elements; any slot outside the cache writes nothing."""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract
from gpu_impls.cuda._module import cuda_impl, kernel, per_element_launch

KERNELS = [("kv_cache_update.cu", "kv_cache_update")]


def _geometry(dims, params):
    rows = sum(params["new_lens"]) + params["pad"]
    count = rows * dims["heads"] * dims["head_dim"]
    n_slots = len(params["cache_lens"]) * dims["max_len"]  # B * max_len in both layouts
    derived = {"count": count, "n_slots": n_slots}
    return derived, per_element_launch(count, derived)


# No invariant: every layout, page size and padding; a 1-D grid of 256-thread blocks holds any
# rows * H * D a buffer can.
CONTRACT = Contract(geometry=_geometry)


def _make(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, e = case.dims, launch.extra
        args = (inputs["k"], inputs["v"], inputs["slots"], outputs["k_cache"],
                outputs["v_cache"], np.int64(e["count"]), np.int32(d["heads"]),
                np.int32(d["head_dim"]), np.int32(d["max_len"]),
                np.int32(case.params["layout"] == "paged"), np.int64(e["n_slots"]))
        kernel(*KERNELS[0], case.dtype, defines)(launch.grid, launch.block, args)
    return run


register(cuda_impl("kv_cache_update", "kv_cache_update", CONTRACT, _make,
                   "in-place copy of the new rows to their slots (contiguous or paged), "
                   "padding rows (slot -1) skipped; one thread per element"))
