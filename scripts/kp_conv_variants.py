"""Plugin (`kparity --plugin scripts/kp_conv_variants.py bench ...`): cuda:kp_conv1d_causal with
another span or register budget, for choosing them on a GPU (gpu_impls/cuda/ssm.py, conv1d.cu):

    cuda:kp_conv1d_causal_sp{S}: S tokens per block instead of CONV_SPAN (more blocks)
    cuda:kp_conv1d_causal_a4[m8]: 4 tokens' loads issued together instead of 8 (fewer
        registers: 126 against 158 at bf16, W = 4, ptxas sm_90), m8: `__launch_bounds__(64, 8)`
        (120 registers, no spills): 16 warps an SM instead of 12
    cuda:kp_conv1d_causal_a4m8_sp{S}: both
Same kernel, same order of arithmetic: only the launch shape and the load batching differ.
"""

from __future__ import annotations

import dataclasses
from functools import partial

from gpu_impls import impls, register
from gpu_impls.cuda import ssm
from gpu_impls.cuda._module import MAKERS

BASE = "cuda:kp_conv1d_causal"
SPANS = (4, 8, 16)
DEFINES = {"": (), "a4": ("KP_CONV_AHEAD=4",), "a4m8": ("KP_CONV_AHEAD=4", "KP_CONV_MIN_BLOCKS=8")}


def conv_variant(suffix: str, defines: tuple, span: int):
    impl, make = MAKERS[BASE]
    contract = dataclasses.replace(impl.contract,
                                   geometry=partial(ssm._conv_geometry, span=span))
    return dataclasses.replace(impl, name=f"{impl.name}_{suffix}", run=make(defines),
                               contract=contract,
                               doc=f"{impl.doc} [span {span}, -D {' '.join(defines) or '-'}]")


_variants = [(f"{d}_sp{s}".strip("_"), DEFINES[d], s) for d in ("", "a4m8") for s in SPANS]
_variants += [("a4", DEFINES["a4"], ssm.CONV_SPAN), ("a4m8", DEFINES["a4m8"], ssm.CONV_SPAN)]
register(*(conv_variant(*v) for v in _variants if f"{BASE}_{v[0]}" not in impls()))
