"""Plugin (`kparity --plugin scripts/kp_attn_variants.py bench ...`): cuda:kp_sdpa_decode with
another geometry, for choosing it on a GPU (gpu_impls/cuda/kp_attention.py):

    cuda:kp_sdpa_decode_s{N}: N splits per (sequence, kv head) instead of `split_count`'s
    cuda:kp_sdpa_decode_e{8,16}: 8 or 16 elements of a key row per lane (its derived splits)
    cuda:kp_sdpa_decode_e{8,16}_s{N}: both
"""

from __future__ import annotations

from gpu_impls import impls, register
from gpu_impls.cuda._module import variant
from gpu_impls.cuda.kp_attention import decode_impl

SPLITS = (8, 16, 30, 60, 120)
VARIANTS = [(f"kp_sdpa_decode_s{n}", n, 16, 4) for n in SPLITS]
VARIANTS += [(f"kp_sdpa_decode_e{e}", None, e, 4) for e in (8, 16)]
VARIANTS += [(f"kp_sdpa_decode_e8_s{n}", n, 8, 4) for n in SPLITS]

VARIANTS += [(f"kp_sdpa_decode_w8{s}", n, 16, 8) for s, n in (("", None), ("_s8", 8), ("_s16", 16),
                                                                   ("_s30", 30))]
VARIANTS += [(f"kp_sdpa_decode_e8_w8{s}", n, 8, 8) for s, n in (("", None), ("_s16", 16),
                                                                      ("_s30", 30))]
VARIANTS += [("kp_sdpa_decode_e8_w16", None, 8, 16)]
register(*(decode_impl("sdpa_decode", v[0], v[1], v[2], warps=v[3])
           for v in VARIANTS if f"cuda:{v[0]}" not in impls()))
if "cuda:kp_sdpa_decode_solo" not in impls():
    # the same code compiled as a module of its own (a define equal to the default) instead of
    # in its batch of listed instances: does the batch build change the kernel's speed?
    register(variant("cuda:kp_sdpa_decode", "kp_sdpa_decode_solo", ("KP_U=2",)))
# kp_attn_combine's loops unrolled by 8 with l staged in shared memory (KP_COMBINE_UNROLL in
# kp_sdpa_decode.cu: the same operations in the same order, more loads in flight)
for _base, _name in (("cuda:kp_sdpa_decode", "kp_sdpa_decode_cu8"),
                     ("cuda:kp_sdpa_decode_s16", "kp_sdpa_decode_s16_cu8"),
                     ("cuda:kp_attn_combine", "kp_attn_combine_u8")):
    if f"cuda:{_name}" not in impls():
        register(variant(_base, _name, ("KP_COMBINE_UNROLL=8",)))
