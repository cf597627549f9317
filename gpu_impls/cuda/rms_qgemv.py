"""Fused RMSNorm + quantized GEMV on CUDA: the seed's three kernels ported with their geometry
(`kernels/ffai_rms_norm_qgemv.cu`; metaltile-std `src/ffai/rms_norm_qgemv.rs`; math in
`oracle/rms_qgemv.py`):

    out[r] = sum_d (q[r,d] * s[r, d // G] + b[r, d // G]) * x_d * nw_d * rsqrt(mean(x^2) + eps)

f32 inside (the normalised activation never rounded to T), one rounding at the store. Every block
recomputes inv over the whole x (phase 1), then its rows' dot products (phase 2).

Impls and their dispatch contracts (checked before any launch; every rule has a violating case):

* `cuda:ffai_rms_norm_qgemv` (int4 scalar): one block of TPG = 128 threads per row (the seed's
  tests and bench; a multiple of 32 by construction), pack-strided, dequantize then dot.
  Contract: the MLX layout (`quant_layout.LAYOUT`; G >= 32 keeps a word inside one group), and
  bits == 4 (the seed unpacks 8 nibbles per word).
* `cuda:ffai_rms_norm_qgemv_fast` (int4) and `cuda:ffai_rms_norm_qgemv_int8_fast` (int8): 8 rows
  per block of 64 threads, 512 codes per warp step, one scale and bias per lane step, algebraic
  split (int4 also masks without shifting). Contract: the layout, bits == 4 resp. 8,
  group_size == 64, in % 512 == 0, out % 8 == 0: the rules of `cuda:dequant_gemv_int4_fast`
  (`cuda/gemv.py`), each fix naming this op's fallback.
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch
from gpu_impls.cuda._module import cuda_impl, kernel
from gpu_impls.cuda.gemv import (FAST_BLOCK_K, FAST_ROWS, equals_invariant, fast_geometry,
                                 multiple_invariant)
from gpu_impls.quant_layout import LAYOUT

SOURCE = "ffai_rms_norm_qgemv.cu"
SCALAR_TPG = 128  # threads per row block: the seed's tests and bench
KERNELS = [
    (SOURCE, "ffai_rms_norm_qgemv"),
    (SOURCE, "ffai_rms_norm_qgemv_fast"),
    (SOURCE, "ffai_rms_norm_qgemv_int8_fast"),
]

# The fallbacks each rule's fix names: an impl of this op without that rule.
INT4_FALLBACK = "cuda:ffai_rms_norm_qgemv (int4, any MLX layout)"
ANY_FALLBACK = "torch:norm_dequant_linear (any MLX layout)"
INT8_FAST_FALLBACK = "cuda:ffai_rms_norm_qgemv_int8_fast (int8: g64, in % 512, out % 8)"


def _scalar_geometry(dims, params):
    return {"tpg": SCALAR_TPG}, Launch(grid=(dims["out"], 1, 1), block=(SCALAR_TPG, 1, 1))


def _fast_rules(fallback: str) -> tuple[Invariant, ...]:
    return (
        equals_invariant("group_size", 64, "a lane's 16 codes take one scale and bias, located "
                         "as k0 / 64", 32, fallback),
        multiple_invariant("in", FAST_BLOCK_K, "a warp steps over 512 codes with no bounds "
                           "check: a partial step reads past the row and past x", 576, fallback),
        multiple_invariant("out", FAST_ROWS, "a block writes 8 rows with no bounds check: a "
                           "partial block writes past the output", 12, fallback))


NIBBLES = "the kernel unpacks 8 nibbles per word: other widths misread every code"
SCALAR = Contract(invariants=(*LAYOUT, equals_invariant("bits", 4, NIBBLES, 8, INT8_FAST_FALLBACK)),
                  geometry=_scalar_geometry)
FAST = Contract(invariants=(*LAYOUT, equals_invariant("bits", 4, NIBBLES, 8, INT8_FAST_FALLBACK),
                            *_fast_rules(INT4_FALLBACK)),
                geometry=fast_geometry)
INT8_FAST = Contract(
    invariants=(*LAYOUT,
                equals_invariant("bits", 8, "the kernel extracts 4 bytes per word: other "
                                 "widths misread every code", 4, INT4_FALLBACK),
                *_fast_rules(ANY_FALLBACK)),
    geometry=fast_geometry)


def _launcher(name: str):
    def make(defines: tuple = ()):
        def run(launch, inputs, outputs, case):
            d = case.dims
            k = kernel(SOURCE, name, case.dtype, defines)
            k(launch.grid, launch.block,
              (inputs["x"], inputs["norm_weight"], inputs["w"], inputs["scales"],
               inputs["biases"], outputs["out"], np.float32(case.params["eps"]),
               np.int32(d["in"]), np.int32(d["group_size"])))
        return run
    return make


register(
    cuda_impl("ffai_rms_norm_qgemv", "rms_norm_qgemv", SCALAR, _launcher("ffai_rms_norm_qgemv"),
              "seed ffai_rms_norm_qgemv: int4, one 128-thread block per row, inv over x, then "
              "pack-strided dequantize-then-dot on x * nw * inv in f32"),
    cuda_impl("ffai_rms_norm_qgemv_fast", "rms_norm_qgemv", FAST,
              _launcher("ffai_rms_norm_qgemv_fast"),
              "seed ffai_rms_norm_qgemv_fast: int4, 8 rows per 64-thread block, algebraic split, "
              "mask without shift; g64, in % 512, out % 8"),
    cuda_impl("ffai_rms_norm_qgemv_int8_fast", "rms_norm_qgemv", INT8_FAST,
              _launcher("ffai_rms_norm_qgemv_int8_fast"),
              "seed ffai_rms_norm_qgemv_int8_fast: int8, 8 rows per 64-thread block, algebraic "
              "split, bytes by shift and mask; g64, in % 512, out % 8"),
)
