"""MLX's own path for the fused op: `mx.fast.rms_norm` then `mx.quantized_matmul` (what an MLX
model runs for input_layernorm -> q/gate/up projection; MLX fuses nothing across the two).

f32 only. On MLX CPU (0.32.4) the half dtypes leave this op's contract on two counts, measured
on the normal gate cases (errors relative to the output RMS, worst case):
  * `mx.fast.rms_norm` returns the normalised activation rounded to T, with x * inv rounded to T
    before the weight (`gpu_impls/mlx/norms.py`); the seed keeps it in f32. Fed to an f32
    `quantized_matmul` (scales cast to f32), it matches the oracle of that other convention,
    W_hat @ T(T(x * inv) * nw), to 9.4e-5 (f16) and 2.7e-6 (bf16): the rounding is identified.
  * `mx.quantized_matmul` in f16/bf16 then adds errors of up to 3.0e-2 (f16) and 2.2e-1 (bf16)
    against that same convention (`gpu_impls/mlx/gemv.py`: no f32-accumulation form found).
In f32 both roundings are f32 roundings, inside the bound (budget <= 0.16 on the gate cases).
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract
from gpu_impls.impl import Impl
from gpu_impls.quant_layout import LAYOUT


def _fast_rms_norm_qmm(launch, inputs, outputs, case):
    import mlx.core as mx

    d = case.dims
    normed = mx.fast.rms_norm(inputs["x"], inputs["norm_weight"],
                              float(np.float32(case.params["eps"])))
    out = mx.quantized_matmul(normed[None, :], inputs["w"], inputs["scales"], inputs["biases"],
                              transpose=True, group_size=d["group_size"], bits=d["bits"])
    return {"out": out[0]}


register(Impl("rms_norm_qgemv", "mlx", "fast_rms_norm_qmm", _fast_rms_norm_qmm,
              Contract(invariants=LAYOUT, dtypes=("f32",)),
              doc="mx.fast.rms_norm(x, nw, eps), then mx.quantized_matmul (f32: the half dtypes "
                  "round the normed activation to T)"))
