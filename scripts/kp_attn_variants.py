"""Plugin (`kparity --plugin scripts/kp_attn_variants.py bench ...`): cuda:kp_sdpa_decode with
another geometry, for choosing it on a GPU (gpu_impls/cuda/kp_attention.py):

    cuda:kp_sdpa_decode_s{N}: N splits per (sequence, kv head) instead of `split_count`'s
    cuda:kp_sdpa_decode_e{8,16}: 8 or 16 elements of a key row per lane (its derived splits)
    cuda:kp_sdpa_decode_e{8,16}_s{N}: both
"""

from __future__ import annotations

from gpu_impls import impls, register
from gpu_impls.cuda.kp_attention import decode_impl

SPLITS = (8, 16, 30, 60, 120)
VARIANTS = [(f"kp_sdpa_decode_s{n}", n, 16) for n in SPLITS]
VARIANTS += [(f"kp_sdpa_decode_e{e}", None, e) for e in (8, 16)]
VARIANTS += [(f"kp_sdpa_decode_e8_s{n}", n, 8) for n in SPLITS]

register(*(decode_impl("sdpa_decode", name, splits, epl) for name, splits, epl in VARIANTS
           if f"cuda:{name}" not in impls()))
if "cuda:kp_sdpa_decode_2k" not in impls():
    register(decode_impl("sdpa_decode", "kp_sdpa_decode_2k", fused=False))
