"""MLX's own quantized GEMV: `mx.quantized_matmul` (transpose=True: W [out, in] packed, x [in]),
and for the expert-indexed GEMV `mx.gather_qmm` (MLX's MoE matmul: `rhs_indices` picks the
expert's slab of the stacked weights on the device).

f32 only, for now: on MLX CPU (0.32.4) f16/bf16 outputs differ from the f32-accumulation contract
by up to ~12 ULP of bf16 (0.0059 at |out| ~ 0.07, 1536 inputs), and none of dequantize-in-T,
products-in-T or sequential-T accumulation reproduces them; until its rounding points are
identified and written into the oracle as a convention, the half dtypes are outside its contract.
"""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract
from gpu_impls.impl import Impl
from gpu_impls.quant_layout import EXPERT_IN_RANGE, LAYOUT


def _quantized_matmul(launch, inputs, outputs, case):
    import mlx.core as mx

    out = mx.quantized_matmul(inputs["x"][None, :], inputs["w"], inputs["scales"],
                              inputs["biases"], transpose=True,
                              group_size=case.dims["group_size"], bits=case.dims["bits"])
    return {"out": out[0]}


# Why MLX's half-precision quantized matmul is a speed baseline, not a gated impl (module doc).
HALF_PRODUCT = ("MLX rounds inside the half-precision product by rules not yet identified "
                "(gpu_impls/mlx/gemv.py): not the f32-accumulation contract, a speed baseline "
                "only")

register(Impl("dequant_gemv", "mlx", "quantized_matmul", _quantized_matmul,
              Contract(invariants=LAYOUT, dtypes=("f32",)),
              doc="mx.quantized_matmul(x, w, scales, biases)"),
         Impl("dequant_gemv", "mlx", "quantized_matmul_half", _quantized_matmul,
              Contract(invariants=LAYOUT, dtypes=("f16", "bf16")),
              doc="mx.quantized_matmul(x, w, scales, biases) on f16/bf16 x: what an MLX user "
                  "runs at the speed target's dtype (MLX on CUDA, Metal)",
              report_only=HALF_PRODUCT))


def _gather_qmm(launch, inputs, outputs, case):
    import mlx.core as mx

    out = mx.gather_qmm(inputs["x"][None, :], inputs["w"], inputs["scales"], inputs["biases"],
                        rhs_indices=inputs["expert_index"], transpose=True,
                        group_size=case.dims["group_size"], bits=case.dims["bits"])
    return {"out": out.reshape(-1)}


register(Impl("dequant_gemv_expert_indexed", "mlx", "gather_qmm", _gather_qmm,
              Contract(invariants=(*LAYOUT, EXPERT_IN_RANGE), dtypes=("f32",)),
              doc="mx.gather_qmm(x, w, scales, biases, rhs_indices=expert_index) (f32: as "
                  "quantized_matmul)"))
