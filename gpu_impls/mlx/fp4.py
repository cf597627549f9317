"""MLX's FP4 modes: `mx.quantize(x, mode="nvfp4", global_scale=amax)` and `mode="mxfp4"`, the
scale rules named "mlx" in oracle/fp4.py. MLX packs 8 codes per uint32 word (element i at bits
4i): converted here to the op's two-per-byte layout. nvfp4: f32 x only (MLX rounds the
half-precision element scaling at points not yet identified: tests/test_fp4.py)."""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract
from gpu_impls.impl import Impl
from gpu_impls.torch.fp4 import format_is, rules, whole_blocks


def _bytes(words):
    """uint32 words [R, K/8] (element i at bits 4i) -> bytes [R, K/2] (element 2j low nibble):
    little-endian, the same bits."""
    import mlx.core as mx

    return mx.view(words, mx.uint8)


def _quantize(launch, inputs, outputs, case):
    import mlx.core as mx

    x, fmt = inputs["x"], case.params["format"]
    if fmt == "nvfp4":
        amax = mx.max(mx.abs(x)).astype(mx.float32)
        # the op's gs_enc (oracle/fp4.py): 1 for an all-zero x, at most f32's max; MLX takes the
        # amax and forms 2688 / amax itself, so hand it the amax that gives that gs_enc
        gs_enc = mx.where(amax == 0, mx.array(1.0),
                          mx.minimum(mx.array(2688.0) / amax, mx.array(np.finfo(np.float32).max)))
        given = mx.where(amax == 0, mx.array(2688.0), amax)
        words, scales = mx.quantize(x, mode="nvfp4", global_scale=given)
        ts = (mx.array(1.0) / gs_enc).reshape(1)
    else:
        words, scales = mx.quantize(x, mode="mxfp4")
        ts = mx.ones((1,), dtype=mx.float32)
    return {"codes": _bytes(words), "scales": scales, "tensor_scale": ts}


def _dequantize(launch, inputs, outputs, case):
    import mlx.core as mx

    words = mx.view(inputs["codes"], mx.uint32)
    x = mx.dequantize(words, inputs["scales"], mode="mxfp4")
    t = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}[case.dtype]
    return {"x_hat": x.astype(t)}


register(Impl("fp4_quantize", "mlx", "quantize_nvfp4", _quantize,
              Contract(invariants=(format_is("nvfp4"), whole_blocks(), rules("mlx", other="exact")),
                       dtypes=("f32",)),
              doc='mx.quantize(x, mode="nvfp4", global_scale=amax) (f32 x)'),
         Impl("fp4_quantize", "mlx", "quantize_mxfp4", _quantize,
              Contract(invariants=(format_is("mxfp4"), whole_blocks(), rules("mlx", other="ocp"))),
              doc='mx.quantize(x, mode="mxfp4")'),
         Impl("fp4_dequantize", "mlx", "dequantize_mxfp4", _dequantize,
              Contract(invariants=(format_is("mxfp4"), whole_blocks())),
              doc='mx.dequantize(w, scales, mode="mxfp4")'))


def _quantized_matmul(launch, inputs, outputs, case):
    """`mx.quantized_matmul(x, w, scales, transpose=True, mode=fmt)` on our bytes viewed as
    MLX's uint32 words; MLX 0.32.4's quantized_matmul takes no global scale, so nvfp4's tensor
    scale multiplies the f32 result (the kernel model's "applied to the finished dot")."""
    import mlx.core as mx

    fmt = case.params["format"]
    x = inputs["x"]
    words = mx.view(inputs["codes"], mx.uint32)
    y = mx.quantized_matmul(x, words, inputs["scales"], transpose=True, mode=fmt)
    if fmt == "nvfp4":
        y = y.astype(mx.float32) * inputs["tensor_scale"]
    return {"y": y.astype(x.dtype)}


# Measured on MLX 0.32.4 CPU over the fp4_gemv gate cases: f32 within 0.05 of the bound; f16/bf16
# up to 162x (nvfp4) and 139x (mxfp4) the bound, e.g. f16 normal m=1 out=8 in=64 nvfp4: y[6] =
# -0.216309 against -0.215620, bound 6.1e-5.
FP4_HALF = ("MLX's quantized_matmul rounds inside the half-precision product (up to 162x the "
            "f32-accumulation bound on the gate cases, MLX 0.32.4 CPU): a speed baseline only")


def _qmm_impls(fmt: str):
    doc = f'mx.quantized_matmul(x, w, scales, transpose=True, mode="{fmt}")'
    inv = (format_is(fmt), whole_blocks("in"))
    return (Impl("fp4_gemv", "mlx", f"quantized_matmul_{fmt}", _quantized_matmul,
                 Contract(invariants=inv, dtypes=("f32",)), doc=doc),
            Impl("fp4_gemv", "mlx", f"quantized_matmul_{fmt}_half", _quantized_matmul,
                 Contract(invariants=inv, dtypes=("f16", "bf16")),
                 doc=doc + " at f16/bf16: a speed baseline", report_only=FP4_HALF))


register(*_qmm_impls("nvfp4"), *_qmm_impls("mxfp4"))
