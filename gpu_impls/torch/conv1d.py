"""PyTorch Mamba-2 conv1d (`oracle/conv1d.py`) as users write it: causal-conv1d's reference
functions (`causal_conv1d_ref`, `causal_conv1d_update_ref` in Dao-AILab/causal-conv1d
`causal_conv1d/causal_conv1d_interface.py`), channels last.

`torch:conv1d_causal` is `F.conv1d(x, w, bias, padding=W-1, groups=D)[..., :T]` (a fresh
sequence, param initial_state "zero": no `initial_states`) or, with a given state,
`F.conv1d(cat(state, x), w, bias, groups=D)`; the final state is the last W-1 raw inputs.
`torch:conv1d_causal_step` is `causal_conv1d_update_ref` without `cache_seqlens`: F.conv1d over
the window cat(state, x), the state shifted by one. Both widen x, w and the bias to f32 first
(the contract's registers: the reference casts x to the weight's dtype, f32 in a model that
keeps its conv in f32) and round y to T once, after the silu; the state is the stored T values,
copied. CUDA where torch sees a GPU, else CPU. Neither declares batch invariance: on a CPU,
F.silu rounds a vector body and a scalar tail differently and a row's place in the batch picks
which (measured, a given state, 37 channels: rows of a batch of 2 differ from each alone).
"""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl


def _parts(inputs, case):
    """(weight [D, 1, W] f32, bias [D] f32 or None) as F.conv1d takes them."""
    weight = inputs["weight"].float().t().contiguous()[:, None, :]
    bias = inputs["bias"].float() if case.params["bias"] else None
    return weight, bias


def _act(y, case):
    import torch.nn.functional as F

    return F.silu(y) if case.params["silu"] else y


def causal_conv1d(x, state, weight, bias, fresh: bool):
    """y [B, D, T] f32 from x [B, D, T] f32 and state [B, D, W-1] (f32): `causal_conv1d_ref`'s
    F.conv1d, padded with W-1 zeros for a fresh sequence, else over cat(state, x)."""
    import torch
    import torch.nn.functional as F

    width, tokens = weight.shape[-1], x.shape[-1]
    if fresh:
        return F.conv1d(x, weight, bias, padding=width - 1, groups=x.shape[1])[..., :tokens]
    return F.conv1d(torch.cat([state, x], dim=-1), weight, bias, groups=x.shape[1])


def _conv1d_causal(launch, inputs, outputs, case):
    import torch

    x, state = inputs["x"], inputs["conv_state_in"]
    weight, bias = _parts(inputs, case)
    y = causal_conv1d(x.float().transpose(1, 2), state.float().transpose(1, 2), weight, bias,
                      case.params["initial_state"] == "zero")
    y = _act(y, case).transpose(1, 2).to(x.dtype)
    return {"y": y, "conv_state": torch.cat([state, x], dim=1)[:, case.dims["tokens"]:]}


def _conv1d_causal_step(launch, inputs, outputs, case):
    import torch
    import torch.nn.functional as F

    x, state = inputs["x"], inputs["conv_state_in"]
    weight, bias = _parts(inputs, case)
    window = torch.cat([state, x[:, None]], dim=1)  # [B, W, D]
    y = F.conv1d(window.float().transpose(1, 2), weight, bias, groups=x.shape[1])[..., -1]
    return {"y": _act(y, case).to(x.dtype), "conv_state_out": window[:, 1:]}


register(
    Impl("conv1d_causal", "torch", "conv1d_causal", _conv1d_causal,
         doc="causal_conv1d_ref: F.conv1d(groups=D, padding=W-1) in f32, silu, y rounded to T"),
    Impl("conv1d_causal_step", "torch", "conv1d_causal_step", _conv1d_causal_step,
         doc="causal_conv1d_update_ref: F.conv1d over cat(state, x) in f32, the state shifted"),
)
