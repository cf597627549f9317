"""MLX's own quantized matmul over M rows: `mx.quantized_matmul(x, w, scales, biases,
transpose=True)`, x [m, in], W [out, in] packed.

f32 only, as dequant_gemv's `mlx:quantized_matmul` (gpu_impls/mlx/gemv.py): on MLX CPU the
half-dtype outputs miss the f32-accumulation contract on the qmm gate cases too (measured budget
94x the bound for f16, 1150x for bf16; f32 uses at most 7% of it). `mlx:qmm_quantized_matmul_half`
runs them anyway, as a report-only speed baseline (a model plan's prefill at T = bf16).

Batch invariant on MLX's CPU (0.32.4), declared there only: its CPU kernel (`_qmm_t`) loops
over the M rows outermost and sums each (row, output) over K on its own, and the check found no
differing bit on 144 probed (shape, M, dtype, bits) cases, half dtypes included. On Metal and
CUDA, MLX sends small M to its qmv kernels and larger M to tiled qmm kernels that sum K in
another order, so it is not claimed there."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract
from gpu_impls.impl import Impl
from gpu_impls.mlx.gemv import HALF_PRODUCT
from gpu_impls.quant_layout import LAYOUT


def _quantized_matmul_rows(launch, inputs, outputs, case):
    import mlx.core as mx

    out = mx.quantized_matmul(inputs["x"], inputs["w"], inputs["scales"], inputs["biases"],
                              transpose=True, group_size=case.dims["group_size"],
                              bits=case.dims["bits"])
    return {"out": out}


register(Impl("qmm", "mlx", "qmm_quantized_matmul", _quantized_matmul_rows,
              Contract(invariants=LAYOUT, dtypes=("f32",)),
              doc="mx.quantized_matmul(x, w, scales, biases, transpose=True) over M rows",
              batch_invariant=("cpu",)))

register(Impl("qmm", "mlx", "qmm_quantized_matmul_half", _quantized_matmul_rows,
              Contract(invariants=LAYOUT, dtypes=("f16", "bf16")),
              doc="mx.quantized_matmul over M rows of f16/bf16 x: what an MLX user runs at the "
                  "speed target's dtype (a prefill's projections)",
              report_only=HALF_PRODUCT))
