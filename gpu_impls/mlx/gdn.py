"""MLX Gated DeltaNet (`oracle/gdn.py`) in `mx` ops, as mlx-lm writes it
(`mlx_lm/models/gated_delta.py`: `_gated_delta_step_ops` and the token loop of
`gated_delta_ops`): the decay multiplies the state, kv_mem = Σ_k state·k, delta = (v − kv_mem)·β,
state += k·delta, y = Σ_k state·q. mlx-lm feeds it the multiplicative decay exp(g) and a q
already scaled; here every input is widened to f32 first (the contract's registers: mlx-lm runs
it in the model's dtype) and y is rounded to T once. `mlx:gdn_step` is one call of the same
step, so T calls of it reproduce `mlx:gdn_recurrent` bit for bit (`tests/test_gdn.py`).
"""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl
from oracle.gdn import EPS, scale_of


def gated_delta_step_ops(q, k, v, g, beta, state):
    """mlx-lm's `_gated_delta_step_ops`: q, k [B, H, Dk]; v [B, H, Dv]; g (the multiplicative
    decay), beta [B, H]; state [B, H, Dv, Dk]. Returns (y [B, H, Dv], the new state)."""
    state = state * g[..., None, None]
    kv_mem = (state * k[..., None, :]).sum(axis=-1)
    delta = (v - kv_mem) * beta[..., None]
    state = state + k[..., None, :] * delta[..., None]
    return (state * q[..., None, :]).sum(axis=-1), state


def _qk(inputs, case):
    """q (scaled) and k in f32, normalised where the case says, repeated per value head."""
    import mlx.core as mx

    q, k = inputs["q"].astype(mx.float32), inputs["k"].astype(mx.float32)
    if case.params["l2norm"]:
        q = q * mx.rsqrt((q * q).sum(axis=-1, keepdims=True) + EPS)
        k = k * mx.rsqrt((k * k).sum(axis=-1, keepdims=True) + EPS)
    repeat = case.dims["heads_v"] // case.dims["heads_k"]
    if repeat > 1:
        q, k = mx.repeat(q, repeat, -2), mx.repeat(k, repeat, -2)
    return q * scale_of(case), k


def _recurrent(launch, inputs, outputs, case):
    import mlx.core as mx

    q, k = _qk(inputs, case)
    v, decay, beta = inputs["v"].astype(mx.float32), mx.exp(inputs["g"]), inputs["beta"]
    state, ys = inputs["h0"], []
    for t in range(q.shape[1]):
        y, state = gated_delta_step_ops(q[:, t], k[:, t], v[:, t], decay[:, t], beta[:, t],
                                        state)
        ys.append(y)
    return {"o": mx.stack(ys, axis=1).astype(inputs["v"].dtype), "state": state}


def _step(launch, inputs, outputs, case):
    import mlx.core as mx

    q, k = _qk(inputs, case)
    y, state = gated_delta_step_ops(q, k, inputs["v"].astype(mx.float32), mx.exp(inputs["g"]),
                                    inputs["beta"], inputs["state_in"])
    return {"o": y.astype(inputs["v"].dtype), "state_out": state}


register(
    Impl("gdn_recurrent", "mlx", "gdn_recurrent", _recurrent,
         doc="mlx-lm's gated_delta_ops token loop in f32 mx ops, y rounded to T once"),
    Impl("gdn_step", "mlx", "gdn_step", _step,
         doc="mlx-lm's _gated_delta_step_ops in f32 (one token of mlx:gdn_recurrent)"),
)
