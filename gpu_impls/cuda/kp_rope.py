"""RoPE on CUDA, kparity's own kernel (`kernels/kp_rope.cu`): q and k rotated together in one
launch, each token at its own position, every variant of the `rope` op (`oracle/rope.py`):
neox and gptj pairing, plain theta, llama3 and YaRN tables, partial rotary (the tail copied),
the YaRN attention factor.

    inv_i  float64 in the kernel (exp2 of -(2i/R) log2(theta), then llama3's bands or YaRN's
           ramp), rounded to f32 once
    angle  f32(p · inv_i);  c, s = sincosf(angle) · m (the accurate sincosf)
    out    x1 c - x2 s, x2 c + x1 s in f32, one rounding to T at the store

Numerics (declared, `Impl.numerics`): the table is a float64 value rounded to f32 once, half an
ULP (the float64 exp2's error, ~2^-50 relative, is far inside the declared 0.5 (1 + |ln inv|)
ULPs: |ln inv| >= ln(theta) 2/R > 0.01 for every entry but the exact theta^0 = 1); sin and cos
keep the default 2 ULPs (CUDA's sinf/cosf: 2 ULPs of the result over the whole range, and CuPy
compiles with -ftz=true only, not --use_fast_math, so sincosf is not the __sinf intrinsic). The
kernel computes in f32 with one rounding at the store, which is within both `compute`
contracts ("f32", and HF's "T", whose roundings are each optional): it takes both, so that it
A/Bs against torch:rope_hf and its torch.compile twin on the same cases.

Geometry, derived from the dims (`_geometry`): 128-thread blocks; a head is R/2 pair items and
D - R tail items; HPB = max(1, 128 // (D - R/2)) heads per block (Llama-3.1-8B, D = 128: 2 heads,
one item per thread), grid = (ceil((Hq + Hkv) / HPB), min(tokens, 65535)), the kernel striding
over tokens past 65535. Each block builds its token's (cos, sin) table in shared memory once
for all its heads (R/2 sincosf per block and token, not per element).

Contract: R <= 512 (the shared table: 256 pairs; Qwen3-Next's 256 heads rotate 64) and
positions < 2^24 (exact in f32, as every RoPE impl). Launched as a programmatic dependent
launch (the table is computed before `griddepcontrol.wait`; common.cuh).
"""

from __future__ import annotations

import math

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch
from gpu_impls.cuda._module import cuda_impl, kernel, launch as cuda_launch
from gpu_impls.torch.rope import POLAR_NUMERICS, POSITIONS_F32
from oracle.rope import attention_factor, yarn_range

SOURCE = "kp_rope.cu"
KERNELS = [(SOURCE, "kp_rope")]
BLOCK = 128          # KP_ROPE_BLOCK in the .cu
MAX_ROTARY = 512     # 2 * KP_ROPE_MAX_HALF: the shared table's pairs
GRID_Y_MAX = 65535   # CUDA's gridDim.y limit: the kernel strides over further tokens
SCALING = {"none": 0, "llama3": 1, "yarn": 2}
# The table is rounded once from float64 (torch:rope_polar's declaration): half an ULP.
NUMERICS = POLAR_NUMERICS


def _geometry(dims, params):
    d, heads = dims["head_dim"], dims["heads_q"] + dims["heads_kv"]
    r = params["rotary_dim"] or d
    tokens = len(params["positions"])
    per_head = max(1, d - r // 2)  # R/2 pairs, then D - R tail elements
    hpb = max(1, BLOCK // per_head)
    chunks = max(1, -(-heads // hpb))
    derived = {"rotary": r, "heads_per_block": hpb, "chunks": chunks, "tokens": tokens}
    return derived, Launch(grid=(chunks, max(1, min(tokens, GRID_Y_MAX)), 1),
                           block=(BLOCK, 1, 1), extra=derived)


ROTARY_FITS = Invariant(
    name=f"rotary_dim <= {MAX_ROTARY}", holds=lambda ns: ns["rotary"] <= MAX_ROTARY,
    why=f"each block holds its token's cos and sin for the R/2 pairs in shared memory, "
        f"{MAX_ROTARY // 2} entries at most",
    fix=lambda ns: f"rotary_dim <= {MAX_ROTARY} (a partial rotary of head_dim="
                   f"{ns['head_dim']}), or torch:rope_polar",
    violation={"head_dim": MAX_ROTARY + 2, "rotary_dim": 0},
    shows=("head_dim", "rotary_dim", "rotary"))
CONTRACT = Contract(invariants=(ROTARY_FITS, POSITIONS_F32), geometry=_geometry)


def _table_args(case) -> tuple:
    """The float64 constants of the table (log2 theta, llama3's, YaRN's range) and m as f32."""
    p = case.params
    low, span = 0.0, 1.0
    if p["scaling"] == "yarn":
        low, high = yarn_range(case)
        span = (high + 0.001 if high == low else high) - low  # oracle/rope.py's ramp
    return (np.int32(SCALING[p["scaling"]]), np.float64(math.log2(p["theta"])),
            np.float64(p["factor"]), np.float64(p["low_freq_factor"]),
            np.float64(p["high_freq_factor"]), np.float64(p["original_max_position"]),
            np.float64(low), np.float64(span), np.float32(attention_factor(case)))


def _make(defines: tuple = (), pdl: bool = True):
    def run(launch, inputs, outputs, case):
        d, e = case.dims, launch.extra
        args = (inputs["q"], inputs["k"], inputs["positions"], outputs["q_out"],
                outputs["k_out"], np.int32(e["tokens"]), np.int32(d["heads_q"]),
                np.int32(d["heads_kv"]), np.int32(d["head_dim"]), np.int32(e["rotary"]),
                np.int32(e["heads_per_block"]), np.int32(case.params["pairing"] == "gptj"),
                *_table_args(case))
        cuda_launch(kernel(SOURCE, "kp_rope", case.dtype, defines), launch.grid, launch.block,
                    args, pdl=pdl)
    return run


register(cuda_impl(
    "kp_rope", "rope", CONTRACT, _make,
    "kparity RoPE: q and k in one launch, per-token positions, neox/gptj, plain/llama3/YaRN, "
    "partial rotary; float64 table rounded to f32, sincosf, f32 math, one rounding",
    numerics=NUMERICS))
