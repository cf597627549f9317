"""MLX Mamba-2 scans (`oracle/ssd.py`) in `mx` ops, f32: the decode step and the sequential scan.

`mlx:ssm_step` is one token: dt = softplus(dt_raw + dt_bias) (mlx.nn's softplus,
`mx.logaddexp(x, 0)`; clamped where the case says), dA = exp(dt A), S = S dA + (dt x) ⊗ B,
y = Σ_n S C + D x, y *= silu(z) (mlx.nn's x·sigmoid(x)); B and C repeated per head
(`mx.repeat`: head h reads group h // (H / G)). `mlx:ssd_scan` is the token loop over that same
`step` on the same per-token shapes, so T calls of `mlx:ssm_step` reproduce it bit for bit
(`tests/test_ssd.py`). Every input is widened to f32 first (the contract's registers), y is
rounded to T once. The hnp state layout is transposed in and out around the hpn step.
Both declare batch invariance on a CPU (row i of a batch is that row alone, bit for bit:
verified over the gate cases, batches 2-8 at T up to 17, and the step at Nemotron-3-Nano's
heads up to batch 64).
"""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl
from oracle.ssd import dt_limits

CPU = ("cpu",)  # batch invariance verified on a CPU (tests/test_qmm.py's generic check)
EVAL_EVERY = 256  # tokens between evaluations in the loop: keeps MLX's lazy graph shallow


def step(state, x, dt_raw, dt_bias, A, b, c, D, z, case):
    """One token in f32: state [B, H, P, N]; x [B, H, P]; dt_raw [B, H]; dt_bias, A, D [H];
    b, c [B, G, N]; z [B, H, P] or None. Returns (y [B, H, P] f32, the new state)."""
    import mlx.core as mx

    f32 = mx.float32
    heads = x.shape[1]
    x = x.astype(f32)
    dt = mx.logaddexp(dt_raw.astype(f32) + dt_bias, 0.0)
    lo, hi = dt_limits(case)
    if lo > 0 or hi is not None:
        dt = mx.clip(dt, lo if lo > 0 else None, hi)
    decay = mx.exp(dt * A)
    repeat = heads // b.shape[-2]
    b, c = (mx.repeat(v.astype(f32), repeat, axis=-2) if repeat > 1 else v.astype(f32)
            for v in (b, c))
    state = state * decay[..., None, None] + (dt[..., None] * x)[..., None] * b[..., None, :]
    y = (state * c[..., None, :]).sum(axis=-1) + D[:, None] * x
    if z is not None:
        z = z.astype(f32)
        y = y * (z * mx.sigmoid(z))
    return y, state


def _scan(launch, inputs, outputs, case):
    import mlx.core as mx

    A = -mx.exp(inputs["A_log"])
    gate = case.params["gate"]
    state, ys = inputs["h0"], []
    for t in range(inputs["x"].shape[1]):
        at = lambda name: mx.contiguous(inputs[name][:, t])  # noqa: E731
        y, state = step(state, at("x"), at("dt_raw"), inputs["dt_bias"], A, at("Bm"), at("Cm"),
                        inputs["D"], at("z") if gate else None, case)
        ys.append(y)
        if (t + 1) % EVAL_EVERY == 0:
            mx.eval(state, *ys)
    return {"y": mx.stack(ys, axis=1).astype(inputs["x"].dtype), "state": state}


def _ssm_step(launch, inputs, outputs, case):
    import mlx.core as mx

    hnp = case.params["layout"] == "hnp"
    state = inputs["state_in"]
    if hnp:
        state = mx.contiguous(mx.swapaxes(state, -1, -2))
    y, state = step(state, inputs["x"], inputs["dt_raw"], inputs["dt_bias"],
                    -mx.exp(inputs["A_log"]), inputs["Bm"], inputs["Cm"], inputs["D"],
                    inputs["z"] if case.params["gate"] else None, case)
    if hnp:
        state = mx.contiguous(mx.swapaxes(state, -1, -2))
    return {"y": y.astype(inputs["x"].dtype), "state_out": state}


register(
    Impl("ssd_scan", "mlx", "ssd_scan", _scan, batch_invariant=CPU,
         doc="the sequential loop over mlx:ssm_step's step in f32 mx ops, y rounded once"),
    Impl("ssm_step", "mlx", "ssm_step", _ssm_step, batch_invariant=CPU,
         doc="one token in f32 mx ops (logaddexp softplus, x·sigmoid(x) gate), hpn or hnp"),
)
