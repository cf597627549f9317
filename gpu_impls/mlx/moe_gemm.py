"""MLX's MoE matmuls over rows sorted by expert: `mx.gather_mm` (dense) and `mx.gather_qmm`
(affine int4 g64, transpose=True) with `rhs_indices` the expert of each row, expanded on the
device from the offsets (no host read), `sorted_indices=True` (the rows are sorted by expert).
`moe_experts` composes them: up, the activation in f32, rounded to T (the declared rounding
point), down.

f32 only for the gated impls, measured on MLX 0.32.4 CPU: `gather_qmm` at f16/bf16 uses up to
595x the bound on the gate cases (it rounds inside the half-precision product, as
`mlx:quantized_matmul`, gpu_impls/mlx/gemv.py), and `gather_mm` at f16/bf16 does not run on the
CPU at all ("[GatherMM::eval] Currently only supports float32"). The half dtypes are registered
as report-only speed baselines (MLX on Metal/CUDA)."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract, param_is
from gpu_impls.impl import Impl
from gpu_impls.mlx.gemv import HALF_PRODUCT
from oracle.moe_gemm import BITS, GROUP


def row_experts(offsets, rows: int):
    """The expert of each sorted row [rows] u32, from offsets [E+1] on the device: the number
    of segment ends at or before the row (offsets[1:] <= i)."""
    import mlx.core as mx

    i = mx.arange(rows)[:, None]
    return (offsets[None, 1:] <= i).astype(mx.uint32).sum(axis=1).astype(mx.uint32)


def _matmul(x, inputs, case, idx):
    """x [M, K] against each row's expert: [M, N] in x's dtype."""
    import mlx.core as mx

    x3 = x[:, None, :]
    if case.params.get("weights", "dense") == "dense":
        w = inputs["w"]
        return mx.gather_mm(x3, w.swapaxes(-1, -2), rhs_indices=idx, sorted_indices=True)[:, 0]
    return mx.gather_qmm(x3, inputs["w_q"], inputs["scales"], inputs["biases"],
                         rhs_indices=idx, transpose=True, group_size=GROUP, bits=BITS,
                         sorted_indices=True)[:, 0]


def _grouped(launch, inputs, outputs, case):
    idx = row_experts(inputs["offsets"], case.dims["rows"])
    return {"y": _matmul(inputs["x"], inputs, case, idx)}


def _experts(launch, inputs, outputs, case):
    import mlx.core as mx
    import mlx.nn as nn

    x, inter = inputs["x"], case.dims["inter"]
    idx = row_experts(inputs["offsets"], case.dims["rows"])
    h = mx.gather_mm(x[:, None, :], inputs["w_up"].swapaxes(-1, -2), rhs_indices=idx,
                     sorted_indices=True)[:, 0].astype(mx.float32)
    if case.params["act"] == "relu2":
        a = mx.square(nn.relu(h))
    else:
        a = nn.silu(h[:, :inter]) * h[:, inter:]
    a = a.astype(x.dtype)  # the declared rounding point
    y = mx.gather_mm(a[:, None, :], inputs["w_down"].swapaxes(-1, -2), rhs_indices=idx,
                     sorted_indices=True)[:, 0]
    return {"y": y}


def _gather_mm_half_runs() -> tuple[bool, str]:
    """mx.gather_mm takes f16/bf16 on an MLX GPU only: its CPU kernel is f32-only."""
    import mlx.core as mx

    if mx.default_device().type == mx.cpu:
        return False, ("mx.gather_mm on MLX's CPU takes float32 only ([GatherMM::eval] "
                       "Currently only supports float32): needs an MLX GPU (Metal, CUDA)")
    return True, ""


def _weights(value, other):
    return param_is("weights", value, f"mlx:grouped_gather_{'qmm' if value == 'dense' else 'mm'}",
                    other=other)


GATHER_MM_HALF = ("mx.gather_mm at f16/bf16: not run on MLX's CPU (f32 only there), its "
                  "rounding inside the half product unmeasured: a speed baseline only")
F32 = ("f32",)
HALF = ("f16", "bf16")
DENSE = (_weights("dense", "affine4"),)
AFFINE4 = (_weights("affine4", "dense"),)

register(Impl("moe_grouped_gemm", "mlx", "grouped_gather_mm", _grouped,
              Contract(invariants=DENSE, dtypes=F32),
              doc="mx.gather_mm(x[:, None], W^T, rhs_indices=row experts, sorted_indices=True)"),
         Impl("moe_grouped_gemm", "mlx", "grouped_gather_qmm", _grouped,
              Contract(invariants=AFFINE4, dtypes=F32),
              doc="mx.gather_qmm(x[:, None], w_q, scales, biases, rhs_indices=row experts, "
                  "transpose=True, group 64, bits 4, sorted_indices=True)"),
         Impl("moe_grouped_gemm", "mlx", "grouped_gather_mm_half", _grouped,
              Contract(invariants=DENSE, dtypes=HALF),
              doc="mx.gather_mm at f16/bf16: a speed baseline", report_only=GATHER_MM_HALF,
              requires=_gather_mm_half_runs),
         Impl("moe_grouped_gemm", "mlx", "grouped_gather_qmm_half", _grouped,
              Contract(invariants=AFFINE4, dtypes=HALF),
              doc="mx.gather_qmm at f16/bf16: a speed baseline", report_only=HALF_PRODUCT),
         Impl("moe_experts", "mlx", "experts_gather_mm", _experts, Contract(dtypes=F32),
              doc="gather_mm up, act in f32 rounded to T, gather_mm down"),
         Impl("moe_experts", "mlx", "experts_gather_mm_half", _experts,
              Contract(dtypes=HALF), doc="the same at f16/bf16: a speed baseline",
              report_only=GATHER_MM_HALF, requires=_gather_mm_half_runs))
