"""MLX Mamba-2 conv1d (`oracle/conv1d.py`) in `mx` ops, as mlx-lm writes it (its Mamba-2 /
Nemotron-H mixer's `_conv`: `nn.Conv1d(groups=conv_dim, padding=0)` over cat(conv_state, x),
the new state the last W-1 rows of that, then silu): `mx.conv1d` with groups = D, channels last,
then the bias. Here x, the weight and the bias are widened to f32 first (the contract's
registers; mlx-lm runs the conv in the model's dtype) and y is rounded to T once.
`mlx:conv1d_causal_step` is the same function over one token. Both declare batch invariance on
a CPU (verified over the gate cases and a sweep up to batch 64 and 6144 channels).
"""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl

CPU = ("cpu",)  # batch invariance verified on a CPU (tests/test_qmm.py's generic check)


def conv(x, state, weight, bias, act: bool):
    """(y [B, T, D] f32, the new state [B, W-1, D]) from x [B, T, D], state [B, W-1, D] (T),
    weight [W, D], bias [D] (f32) or None."""
    import mlx.core as mx
    import mlx.nn as nn

    padded = mx.concatenate([state, x], axis=1)
    y = mx.conv1d(padded.astype(mx.float32), weight.T[:, :, None], groups=x.shape[-1])
    if bias is not None:
        y = y + bias
    return (nn.silu(y) if act else y), padded[:, x.shape[1]:]


def _parts(inputs, case):
    import mlx.core as mx

    bias = inputs["bias"].astype(mx.float32) if case.params["bias"] else None
    return inputs["weight"].astype(mx.float32), bias


def _conv1d_causal(launch, inputs, outputs, case):
    x = inputs["x"]
    y, state = conv(x, inputs["conv_state_in"], *_parts(inputs, case), case.params["silu"])
    return {"y": y.astype(x.dtype), "conv_state": state}


def _conv1d_causal_step(launch, inputs, outputs, case):
    x = inputs["x"]
    y, state = conv(x[:, None], inputs["conv_state_in"], *_parts(inputs, case),
                    case.params["silu"])
    return {"y": y[:, 0].astype(x.dtype), "conv_state_out": state}


register(
    Impl("conv1d_causal", "mlx", "conv1d_causal", _conv1d_causal, batch_invariant=CPU,
         doc="mlx-lm's Mamba-2 conv: mx.conv1d(groups=D) over cat(state, x) in f32, + bias, "
             "silu, y rounded to T"),
    Impl("conv1d_causal_step", "mlx", "conv1d_causal_step", _conv1d_causal_step,
         batch_invariant=CPU,
         doc="one token of mlx:conv1d_causal's function"),
)
