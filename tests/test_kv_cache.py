"""kv_cache_update (`oracle/kv_cache.py`): the aliased caches catch writes outside the slots.

A padding row (slot -1, a CUDA graph's filler) taken as an index writes the cache's last slot
in torch (`cache.view(-1, H, D)[slots] = rows` wraps -1): the runner must flag it as an
`outside_region` write even though every real slot is right."""

from __future__ import annotations

import gpu_impls
from cases.generate import Work
from cases.model import Case
from gpu_impls.impl import Impl
from runners.correctness import check


def _unfiltered(launch, inputs, outputs, case):
    slots = inputs["slots"].long()
    for cache, new in (("k_cache", "k"), ("v_cache", "v")):
        outputs[cache].view(-1, *outputs[cache].shape[2:])[slots] = inputs[new]


def _case(pad: int) -> Case:
    return Case.make("kv_cache_update", {"heads": 2, "head_dim": 8, "max_len": 32}, "bf16",
                     params={"layout": "paged", "page_size": 16, "cache_lens": (3, 20),
                             "new_lens": (1, 1), "pad": pad})


def test_a_padding_row_written_to_the_last_slot_is_outside_the_region():
    impl = Impl("kv_cache_update", "torch", "test_unfiltered_slots", _unfiltered)
    torch = gpu_impls.backend("torch")
    assert check(Work(impl, _case(0), "valid"), torch)["status"] == "pass"
    row = check(Work(impl, _case(2), "valid"), torch)
    assert row["status"] == "fail" and "outside_region" in row["flags"], row["message"]
    assert check(Work(gpu_impls.impls()["torch:kv_cache_update"], _case(2), "valid"),
                 torch)["status"] == "pass"


def test_cuda_kv_cache_update_geometry_covers_the_rows_and_bounds_the_slots():
    """cuda:kv_cache_update's launch, from the dims alone: one thread per element of k (rows x
    H x D, padding rows included), and n_slots, the kernel's bound on a slot, is the caches'
    slot count in both layouts (pages x page_size = B x max_len), for every gate case."""
    import numpy as np

    from cases.kv_cache import kv_cache_update_cases
    from oracle.kv_cache import NEW, cache_shape

    impl = gpu_impls.impls()["cuda:kv_cache_update"]
    for case in kv_cache_update_cases():
        launch = impl.contract.check(impl.id, case)
        d, p = case.dims, case.params
        count = int(np.prod(NEW(d, p)))
        assert launch.extra["count"] == count and launch.grid[0] * launch.block[0] >= count
        assert launch.extra["n_slots"] * d["heads"] * d["head_dim"] == \
            int(np.prod(cache_shape(d, p))), case.short()
