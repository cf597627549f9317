"""torch baselines for the MoE grouped GEMM and expert MLP, as users write them: a Python loop
over the experts (the offsets read to the host once), `F.linear` in f32 on each expert's rows,
one rounding to T (`moe_experts`: the activation rounded to T between the two GEMMs, the op's
declared rounding point). affine4 weights are dequantized per expert in f32 exactly as
`torch:qmm_dequant_linear` does, so an expert's rows equal that op's output on them bit for bit;
dense rows equal this impl run on the expert's rows alone (E = 1): tests/test_moe_gemm.py.
Deterministic: a fixed loop, no atomics.

`torch:grouped_mm`: `torch._grouped_mm(x, W^T, offs=offsets[1:])`, one launch for all experts
and no host sync, where torch runs it as its grouped GEMM kernel (CUTLASS, f32 accumulation,
one rounding to bf16): torch 2.11 takes that path for bf16 x, W and out on sm_90 / sm_100 only;
elsewhere (other GPUs, other dtypes, a CPU) it falls back to a per-group loop of `mm` after
`offs.cpu()`, a host sync: so the impl `requires` such a GPU and is skipped (unavailable) on
other machines. Its signature: x [M, K] (2-D, row-major) against mat_b [E, K, N] (3-D: W [E, N,
K] viewed transposed, column-major, no copy), offs int32 [E] holding each group's END row
(cumulative, no leading zero: our offsets[1:]; group e's rows are offs[e-1]:offs[e], from 0),
no bias; both operands' strides a multiple of 16 bytes (K % 8) and 16-byte aligned (fresh
tensors are); the output [M, N] is torch's own, its row stride padded to 16 bytes. Contract:
bf16, dense weights, in % 8 == 0."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, nearest_multiples, param_is
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


GROUPED_MM_STRIDE = 8  # bf16 elements in 16 bytes: the operands' stride rule


def _grouped_mm_fast_path() -> tuple[bool, str]:
    """Where torch._grouped_mm runs its grouped kernel (no host sync): a CUDA GPU of compute
    capability 9.x or 10.x (torch 2.11's `_scaled_mm_allowed_device(sm90_only, sm100_only)`)."""
    import torch

    if not hasattr(torch, "_grouped_mm"):
        return False, f"torch {torch.__version__} has no torch._grouped_mm"
    if not torch.cuda.is_available():
        return False, ("torch:grouped_mm times torch._grouped_mm's CUDA kernel (sm_90 / sm_100); "
                       "no GPU here (torch would run a per-group loop after offs.cpu())")
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 10):
        return False, (f"torch._grouped_mm runs its grouped kernel on sm_90 / sm_100 only; this "
                       f"GPU is sm_{major}{minor}, where torch falls back to a per-group loop "
                       "with a host sync")
    return True, ""


def grouped_mm(x, w, offsets):
    """y [M, N] = x [M, K] against w [E, N, K] per the CSR offsets [E+1] (offsets[0] = 0), in one
    torch._grouped_mm call: its offs are each group's end row, int32."""
    import torch

    ends = offsets[1:].to(torch.int32)
    return torch._grouped_mm(x, w.transpose(-2, -1), offs=ends)


def _grouped_mm(launch, inputs, outputs, case):
    return {"y": grouped_mm(inputs["x"], inputs["w"], inputs["offsets"])}


GROUPED_MM = Contract(
    invariants=(
        param_is("weights", "dense", "torch:grouped_dequant_linear", other="affine4"),
        Invariant(
            name=f"in % {GROUPED_MM_STRIDE} == 0",
            holds=lambda ns: ns["in"] % GROUPED_MM_STRIDE == 0,
            why="torch._grouped_mm needs every operand stride a multiple of 16 bytes: x's rows "
                "and W^T's columns are K bf16 elements apart",
            fix=lambda ns: f"in = {nearest_multiples(ns['in'], GROUPED_MM_STRIDE)}, or "
                           "torch:grouped_linear",
            violation={"in": 66}, shows=("in",)),
    ),
    dtypes=("bf16",))


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


OFFSETS_READ = "the Python loop reads the offsets back to the host (offsets.cpu())"

register(Impl("moe_grouped_gemm", "torch", "grouped_linear", _grouped_linear, DENSE,
              host_sync=OFFSETS_READ,
              doc="per-expert loop: F.linear(x[rows of e].float(), W[e].float()), rounded to T"),
         Impl("moe_grouped_gemm", "torch", "grouped_dequant_linear", _grouped_linear, AFFINE4,
              host_sync=OFFSETS_READ,
              doc="per-expert loop: W[e] unpacked and dequantized in f32 (as "
                  "torch:qmm_dequant_linear), F.linear in f32, rounded to T"),
         Impl("moe_grouped_gemm", "torch", "grouped_mm", _grouped_mm, GROUPED_MM,
              requires=_grouped_mm_fast_path,
              doc="torch._grouped_mm(x, W^T, offs=offsets[1:]): one launch, no host sync "
                  "(sm_90 / sm_100, bf16)"),
         Impl("moe_experts", "torch", "experts_linear_loop", _experts_loop,
              host_sync=OFFSETS_READ,
              doc="per-expert loop: F.linear up in f32, act in f32, rounded to T, F.linear "
                  "down in f32, rounded to T"))
