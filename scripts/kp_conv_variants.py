"""Plugin (`kparity --plugin scripts/kp_conv_variants.py bench ...`): cuda:kp_conv1d_causal with
another span or register budget, for choosing them on a GPU (gpu_impls/cuda/ssm.py, conv1d.cu):

    cuda:kp_conv1d_causal_sp{S}: S tokens per block instead of CONV_SPAN
    cuda:kp_conv1d_causal_a8m1[_sp{S}]: 8 tokens' loads issued together instead of 4 and no
        register cap (`__launch_bounds__(64, 1)`: 158 registers at bf16, W = 4, ptxas sm_90,
        12 warps an SM; the shipped kernel 120 and 16); a8m1_sp32 is the kernel before
        2026-12-07 (an `ab` against it: the change's gain)
    cuda:kp_conv1d_causal_a8: 8 loads ahead under the register cap (spills)
    cuda:kp_conv1d_causal_rcp / _fastexp: silu by a 1-ULP reciprocal and a product (within
        the op's bound), and also __expf at 16-bit T (not declared: --no-verify)
        (KP_CONV_FAST_SILU=1 / 2): is the prefill bound by silu's instructions?
Same kernel, same order of arithmetic (but the silu variants): only the launch shape and the
load batching differ.
"""

from __future__ import annotations

from gpu_impls import impls, register
from gpu_impls.cuda import ssm
from gpu_impls.cuda._module import variant

BASE = "cuda:kp_conv1d_causal"
SPANS = (4, 16, 32)
DEFINES = {"": (), "a8": ("KP_CONV_AHEAD=8",), "a8m1": ("KP_CONV_AHEAD=8", "KP_CONV_MIN_BLOCKS=1"),
           "rcp": ("KP_CONV_FAST_SILU=1",), "fastexp": ("KP_CONV_FAST_SILU=2",)}


def conv_variant(suffix: str, defines: tuple, span: int):
    return variant(BASE, f"kp_conv1d_causal_{suffix}", defines, geometry=ssm._conv_geometry,
                   span=span)


_variants = [(f"{d}_sp{s}".strip("_"), DEFINES[d], s) for d in ("", "a8m1") for s in SPANS]
_variants += [(d, DEFINES[d], ssm.CONV_SPAN) for d in ("a8", "a8m1", "rcp", "fastexp")]
register(*(conv_variant(*v) for v in _variants if f"{BASE}_{v[0]}" not in impls()))
