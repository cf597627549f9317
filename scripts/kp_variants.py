"""Plugin (`kparity --plugin scripts/kp_variants.py ...`): kp impls with another small-tensor
geometry, for A/B-ing a geometry change before adopting it (same kernels, other (ITEMS, TPR)).

    cuda:kp_rms_norm_t2, cuda:kp_rms_norm_per_head_t2: 2 vectors per thread below SMALL_WORK
"""

from __future__ import annotations

import dataclasses
from functools import partial

from gpu_impls import impls, register
from gpu_impls.cuda import kp_norms as kp


def variant(impl_id: str, geometry, small_target: int):
    impl = impls()[impl_id]
    contract = dataclasses.replace(impl.contract, geometry=partial(geometry,
                                                                   small_target=small_target))
    return dataclasses.replace(impl, name=f"{impl.name}_t{small_target}", contract=contract,
                               doc=f"{impl.doc} [small-tensor target {small_target}]")


register(variant("cuda:kp_rms_norm", kp._row_geometry, 2),
         variant("cuda:kp_rms_norm_per_head", kp._per_head_geometry, 2))
