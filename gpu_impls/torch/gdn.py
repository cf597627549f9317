"""PyTorch Gated DeltaNet (`oracle/gdn.py`): FLA's `naive_recurrent_gated_delta_rule` in f32,
with the state V-major ([B, Hv, V, K], mlx-native / vLLM) and q scaled first as FLA does.

`torch:gdn_recurrent` is the token loop over `step`; `torch:gdn_step` is one call of that same
`step` (so T calls of it reproduce the loop bit for bit: `tests/test_gdn.py`);
`torch:gdn_step_prep` is the fused prep (RMS norms with the folded weights, Qwen3-Next's gate
and beta) then `step`. Every intermediate is f32 (the contract's registers), o is rounded to T
once. CUDA where torch sees a GPU, else CPU.
"""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl
from oracle.gdn import EPS, RMS_EPS, scale_of


def l2norm(x):
    """x · rsqrt(Σx² + eps) over the last axis (FLA's `use_qk_l2norm_in_kernel`)."""
    import torch

    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + EPS)


def per_value_head(x, heads_v: int):
    """q or k [..., Hk, K] -> [..., Hv, K]: value head h reads head h // (Hv / Hk)."""
    return x.repeat_interleave(heads_v // x.shape[-2], dim=-2)


def step(state, q, k, v, g, beta):
    """One token, f32: state [B, Hv, V, K]; q (scaled), k [B, Hv, K]; v [B, Hv, V]; g (the
    log-decay), beta [B, Hv]. Returns (o [B, Hv, V], the new state)."""
    state = state * g.exp()[..., None, None]
    kr = k[..., None, :]
    u = (v - (state * kr).sum(-1)) * beta[..., None]
    state = state + u[..., None] * kr
    return (state * q[..., None, :]).sum(-1), state


def _qk(inputs, case):
    """q (scaled) and k in f32 per value head, normalised where the case says."""
    q, k = inputs["q"].float(), inputs["k"].float()
    if case.params["l2norm"]:
        q, k = l2norm(q), l2norm(k)
    hv = case.dims["heads_v"]
    return per_value_head(q, hv) * scale_of(case), per_value_head(k, hv)


def _recurrent(launch, inputs, outputs, case, step=step):
    """The token loop; `step`: the step function (a test's mutant may swap it)."""
    import torch

    q, k = _qk(inputs, case)
    v, g, beta = inputs["v"].float(), inputs["g"], inputs["beta"]
    state = inputs["h0"]
    o = []
    for t in range(q.shape[1]):
        o_t, state = step(state, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t])
        o.append(o_t)
    return {"o": torch.stack(o, dim=1).to(inputs["v"].dtype), "state": state}


def _step(launch, inputs, outputs, case, step=step):
    q, k = _qk(inputs, case)
    o, state = step(inputs["state_in"], q, k, inputs["v"].float(), inputs["g"], inputs["beta"])
    return {"o": o.to(inputs["v"].dtype), "state_out": state}


def _rms(x, w):
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w.float()


def prep(inputs, case):
    """(q̂, k̂ [B, Hv, K], v [B, Hv, V], g, beta [B, Hv]) in f32 from the fused prep's inputs."""
    import torch
    import torch.nn.functional as F

    d = case.dims
    b, hk, hv, dk, n = d["batch"], d["heads_k"], d["heads_v"], d["dim_k"], d["heads_k"] * d["dim_k"]
    conv = inputs["conv_out"].float()
    q = _rms(conv[:, :n].reshape(b, hk, dk), inputs["q_norm_weight"])
    k = _rms(conv[:, n:2 * n].reshape(b, hk, dk), inputs["k_norm_weight"])
    v = conv[:, 2 * n:].reshape(b, hv, d["dim_v"])
    g = -inputs["A_log"].exp() * F.softplus(inputs["a_raw"].float() + inputs["dt_bias"])
    beta = torch.sigmoid(inputs["b_raw"].float())
    return per_value_head(q, hv), per_value_head(k, hv), v, g, beta


def _step_prep(launch, inputs, outputs, case):
    q, k, v, g, beta = prep(inputs, case)
    o, state = step(inputs["state_in"], q, k, v, g, beta)
    return {"o": o.to(inputs["conv_out"].dtype), "state_out": state}


register(
    Impl("gdn_recurrent", "torch", "gdn_recurrent", _recurrent,
         doc="FLA's naive recurrent loop in f32 (V-major state), o rounded to T once"),
    Impl("gdn_step", "torch", "gdn_step", _step,
         doc="one token of torch:gdn_recurrent's loop (bit-identical to it)"),
    Impl("gdn_step_prep", "torch", "gdn_step_prep", _step_prep,
         doc="RMS norms with folded weights, Qwen3-Next's gate and beta, then the f32 step"),
)
