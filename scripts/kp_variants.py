"""Plugin (`kparity --plugin scripts/kp_variants.py ...`): kp impls with another small-tensor
geometry, for A/B-ing a geometry change before adopting it (same kernels, other launch shape).

    cuda:kp_rms_norm_t2, cuda:kp_rms_norm_per_head_t2: 2 vectors per thread below SMALL_WORK
    cuda:kp_rms_norm{,_per_head}_b{32,128,256}: at least that many threads per block (short
        rows: more rows per block, fewer blocks), instead of MIN_BLOCK = 64
    cuda:kp_qgemv_r2, cuda:kp_qgemv_r8: 2 or 8 rows per block instead of KP_ROWS = 4
    cuda:kp_qgemv_r{4,8}w{1,2,4}: that many rows per block and warps splitting K
    cuda:kp_qgemv_mma_s{s}: that many stages of the weight pipeline, for each s in
        gemv.MMA_STAGE_CHOICES; _p{1,2,4,8}: that many K parts (warps per 16 rows) and _t{1,2,4,8}
        that many 16-row tiles per block instead of the launcher's choice; _diag_load_only: its
        copies and x staging without the math (wrong results: `bench --no-verify`); _late: the
        next kernel let in after the main loop instead of at the start (as before 2026-11-24);
        _subtract: always
        the subtraction path (codes as (BASE + q) - BASE), as before the fast path
    cuda:kp_rms_norm_nopdl, cuda:kp_rms_norm_per_head_nopdl, cuda:kp_qgemv_nopdl,
        cuda:kp_qgemv_mma_nopdl: the same kernels launched ordinarily instead of as
        programmatic dependent launches
    cuda:kp_qgemv_diag_load_only: kp_qgemv's loads with almost none of its math (wrong results:
        time it with `bench --no-verify`), the memory-only time of its access pattern;
        _diag_codes_x: also without the scale and bias loads (served from L1), _diag_codes: also
        without the x loads; _diag_math_no_groups: the full math without the scale/bias loads
"""

from __future__ import annotations

import dataclasses

from gpu_impls import register
from gpu_impls.cuda import _module, gemv
from gpu_impls.cuda._module import MAKERS, mutant
from gpu_impls.cuda import kp_norms as kp


def variant(impl_id: str, geometry, suffix: str, **knobs):
    """`impl_id` named with `suffix`, its geometry called with `knobs`."""
    return _module.variant(impl_id, f"{impl_id.split(':')[1]}_{suffix}", geometry=geometry,
                           **knobs)


for _impl, _geometry in (("cuda:kp_rms_norm", kp._row_geometry),
                         ("cuda:kp_rms_norm_per_head", kp._per_head_geometry)):
    register(variant(_impl, _geometry, "t2", small_target=2),
             *(variant(_impl, _geometry, f"b{b}", min_block=b) for b in (32, 128, 256)))
register(*(variant("cuda:kp_qgemv", gemv._kp_geometry, f"r{r}", rows=r) for r in (2, 8)),
         *(variant("cuda:kp_qgemv", gemv._kp_geometry, f"r{r}w{w}", rows=r, warps=w)
           for r in (4, 8) for w in (1, 2, 4)))
register(*(variant("cuda:kp_qgemv_mma", gemv.mma_geometry, f"s{s}", stages=s)
           for s in gemv.MMA_STAGE_CHOICES),
         *(variant("cuda:kp_qgemv_mma", gemv.mma_geometry, f"p{p}", parts=p) for p in (1, 2, 4, 8)),
         *(variant("cuda:kp_qgemv_mma", gemv.mma_geometry, f"t{t}", tiles=t) for t in (1, 2, 4, 8)))
register(mutant("cuda:kp_qgemv_mma", "kp_qgemv_mma_diag_load_only", "KPARITY_DIAG_LOAD_ONLY"),
         mutant("cuda:kp_qgemv_mma", "kp_qgemv_mma_late", "KPARITY_DIAG_LATE_DEPENDENTS"),
         mutant("cuda:kp_qgemv_mma", "kp_qgemv_mma_subtract", "KPARITY_DIAG_SUBTRACT"))
register(mutant("cuda:kp_qgemv", "kp_qgemv_diag_load_only", "KPARITY_DIAG_LOAD_ONLY"))
for _suffix, _defines in (
        ("diag_codes_x", ("KPARITY_DIAG_LOAD_ONLY", "KPARITY_DIAG_NO_GROUP_LOADS")),
        ("diag_codes", ("KPARITY_DIAG_LOAD_ONLY", "KPARITY_DIAG_NO_GROUP_LOADS",
                        "KPARITY_DIAG_NO_X_LOADS")),
        ("diag_math_no_groups", ("KPARITY_DIAG_NO_GROUP_LOADS",))):
    register(_module.variant("cuda:kp_qgemv", f"kp_qgemv_{_suffix}", _defines,
                             doc=f"timing diagnostic: kp_qgemv with {' '.join(_defines)}"))

register(variant("cuda:kp_rms_norm", kp._row_geometry, "t4", small_target=4))

for _name in ("kp_rms_norm", "kp_rms_norm_per_head", "kp_qgemv", "kp_qgemv_mma"):
    _impl, _make = MAKERS[f"cuda:{_name}"]
    register(dataclasses.replace(_impl, name=f"{_name}_nopdl", run=_make(pdl=False),
                                 doc=f"cuda:{_name} launched without PDL"))
