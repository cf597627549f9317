"""torch baselines for the MoE grouped GEMM and expert MLP, as users write them: a Python loop
over the experts (the offsets read to the host once), `F.linear` in f32 on each expert's rows,
one rounding to T (`moe_experts`: the activation rounded to T between the two GEMMs, the op's
declared rounding point). affine4 weights are dequantized per expert in f32 exactly as
`torch:qmm_dequant_linear` does, so an expert's rows equal that op's output on them bit for bit;
dense rows equal this impl run on the expert's rows alone (E = 1): tests/test_moe_gemm.py.
Deterministic: a fixed loop, no atomics.

`torch._grouped_mm` (one launch for all experts) runs on CUDA only: not registered here (CPU
round)."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract, param_is
from gpu_impls.impl import Impl
from gpu_impls.torch.gemv import dequantize_f32
from oracle.moe_gemm import BITS, GROUP, segments

DENSE = Contract(invariants=(param_is("weights", "dense", "torch:grouped_dequant_linear",
                                      other="affine4"),))
AFFINE4 = Contract(invariants=(param_is("weights", "affine4", "torch:grouped_linear",
                                        other="dense"),))


def _segments(offsets):
    """(e, lo, hi) of the experts that own rows: the host read a user's loop makes."""
    return segments({"offsets": offsets.cpu().numpy()})


def _weights(inputs, e: int, case):
    """W[e] [N, K] in f32: the dense slab widened, or the affine4 slab dequantized."""
    if case.params["weights"] == "dense":
        return inputs["w"][e].float()
    view = type("Layout", (), {"dims": {"bits": BITS, "group_size": GROUP,
                                        "in": case.dims["in"]}})
    return dequantize_f32(inputs["w_q"][e], inputs["scales"][e], inputs["biases"][e], view)


def _grouped_linear(launch, inputs, outputs, case):
    import torch
    import torch.nn.functional as F

    x = inputs["x"]
    y = torch.zeros(case.dims["rows"], case.dims["out"], dtype=x.dtype, device=x.device)
    for e, lo, hi in _segments(inputs["offsets"]):
        y[lo:hi] = F.linear(x[lo:hi].float(), _weights(inputs, e, case)).to(x.dtype)
    return {"y": y}


def _activation(h, case):
    """act(h) in f32 over h [m, U] (`oracle.moe_gemm.activation`)."""
    import torch.nn.functional as F

    if case.params["act"] == "relu2":
        r = F.relu(h)
        return r * r
    gate, up = h.split(case.dims["inter"], dim=-1)
    return F.silu(gate) * up


def _experts_loop(launch, inputs, outputs, case):
    import torch
    import torch.nn.functional as F

    x = inputs["x"]
    y = torch.zeros(case.dims["rows"], case.dims["hidden"], dtype=x.dtype, device=x.device)
    for e, lo, hi in _segments(inputs["offsets"]):
        h = F.linear(x[lo:hi].float(), inputs["w_up"][e].float())
        a = _activation(h, case).to(x.dtype)  # the declared rounding point
        y[lo:hi] = F.linear(a.float(), inputs["w_down"][e].float()).to(x.dtype)
    return {"y": y}


register(Impl("moe_grouped_gemm", "torch", "grouped_linear", _grouped_linear, DENSE,
              doc="per-expert loop: F.linear(x[rows of e].float(), W[e].float()), rounded to T"),
         Impl("moe_grouped_gemm", "torch", "grouped_dequant_linear", _grouped_linear, AFFINE4,
              doc="per-expert loop: W[e] unpacked and dequantized in f32 (as "
                  "torch:qmm_dequant_linear), F.linear in f32, rounded to T"),
         Impl("moe_experts", "torch", "experts_linear_loop", _experts_loop,
              doc="per-expert loop: F.linear up in f32, act in f32, rounded to T, F.linear "
                  "down in f32, rounded to T"))
