"""PyTorch quantized embedding gather (`oracle/embedding.py`): the tokens' rows selected by
`index_select` on the device ids, unpacked and dequantized in f32 (q · s + b), rounded to T
once: what `torch:dequant_linear` does to a whole matrix, on the rows a step needs."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract
from gpu_impls.impl import Impl
from gpu_impls.quant_layout import ROW_LAYOUT
from gpu_impls.torch.gemv import unpack_codes


def _quant_embedding(launch, inputs, outputs, case):
    ids = inputs["ids"].long()
    bits, group, hidden = case.dims["bits"], case.dims["group_size"], case.dims["hidden"]
    scales = inputs["scales"]
    q = unpack_codes(inputs["w"].index_select(0, ids), bits, hidden).float()
    s = scales.index_select(0, ids).float().repeat_interleave(group, dim=-1)
    b = inputs["biases"].index_select(0, ids).float().repeat_interleave(group, dim=-1)
    return {"out": (q * s + b).to(scales.dtype)}


register(Impl("quant_embedding", "torch", "quant_embedding", _quant_embedding,
              Contract(invariants=ROW_LAYOUT),
              doc="index_select the ids' rows, unpack, q * s + b in f32, rounded to T"))
