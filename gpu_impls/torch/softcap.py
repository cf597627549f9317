"""PyTorch `softcap`: Gemma 2's `cap * tanh(x / cap)` (HF's Gemma2 logits and attention), in
f32, rounded to T once."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl


def _softcap(launch, inputs, outputs, case):
    import torch

    cap = float(torch.tensor(case.params["cap"], dtype=torch.float32))
    x = inputs["x"]
    return {"out": (torch.tanh(x.float() / cap) * cap).to(x.dtype)}


register(Impl("softcap", "torch", "softcap", _softcap,
              doc="torch.tanh(x.float() / cap) * cap, rounded to T"))
