"""MLX quantized embedding gather (`oracle/embedding.py`): the tokens' rows taken (`mx.take`
on the device ids), `mx.dequantize` with the scales and biases widened to f32 (dequantizing
with T scales would round q · s to T before the bias: not the contract), rounded to T once. As
mlx-lm's `QuantizedEmbedding`, but in f32 up to the store."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract
from gpu_impls.impl import Impl
from gpu_impls.quant_layout import ROW_LAYOUT


def _quant_embedding(launch, inputs, outputs, case):
    import mlx.core as mx

    ids, scales = inputs["ids"], inputs["scales"]
    rows = [mx.take(inputs[k], ids, axis=0) for k in ("w", "scales", "biases")]
    out = mx.dequantize(rows[0], rows[1].astype(mx.float32), rows[2].astype(mx.float32),
                        group_size=case.dims["group_size"], bits=case.dims["bits"])
    return {"out": out.astype(scales.dtype)}


register(Impl("quant_embedding", "mlx", "quant_embedding", _quant_embedding,
              Contract(invariants=ROW_LAYOUT),
              doc="mx.take the ids' rows, mx.dequantize in f32, rounded to T"))
