"""Gated DeltaNet's recurrence in float64 (FLA's `fla/ops/gated_delta_rule/naive.py`,
`naive_recurrent_gated_delta_rule`): the ground truth every GDN op's oracle and property is
checked against (`oracle/gdn.py`: the recurrent op and the decode step; `oracle/gdn_chunked.py`:
the chunked pipeline's stages).

Layouts (mlx-native / vLLM: the state is [V, K]):

    q, k   [B, T, Hk, K]        v, o   [B, T, Hv, V]        g, beta  [B, T, Hv]
    state  [B, Hv, V, K]        value head h reads q/k head h // (Hv / Hk)  (GQA)

Per (b, h), S [V, K] starting at the initial state, for t = 0..T-1:

    S   = exp(g_t) · S                  g_t: the log-decay (<= 0), not cumsum'd
    u   = beta_t · (v_t − S k_t)        [V]   (the decayed S)
    S   = S + u k_tᵀ                    rank-1 update
    o_t = S (scale · q_t)               [V]

With `l2norm`, q and k are first x · rsqrt(Σx² + eps), eps = f32(1e-6) (FLA's
`use_qk_l2norm_in_kernel` passes 1e-6 to an f32 kernel argument; HF Qwen3-Next's torch `l2norm`
adds the Python float 1e-6 to an f32 tensor, which rounds it to f32 too). Everything here is float64 on the values
as given: the ops' oracles apply their contracts' rounding points around it.
"""

from __future__ import annotations

import numpy as np

L2NORM_EPS = float(np.float32(1e-6))  # 9.99999997e-07: as the kernels hold it (above)


def l2norm(x: np.ndarray, eps: float = L2NORM_EPS) -> np.ndarray:
    """x · rsqrt(Σ x² + eps) over the last axis, float64."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite rows: NaN, as IEEE has it
        return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def gqa_index(heads_v: int, heads_k: int) -> np.ndarray:
    """The q/k head of each value head: h // (Hv / Hk)."""
    if heads_k <= 0 or heads_v % heads_k:
        raise ValueError(f"GDN: heads_v={heads_v} must be a multiple of heads_k={heads_k}")
    return np.arange(heads_v) // (heads_v // heads_k)


def recurrent(q, k, v, g, beta, state=None, scale: float | None = None, l2: bool = False,
              eps: float = L2NORM_EPS) -> tuple[np.ndarray, np.ndarray]:
    """(o [B, T, Hv, V], final state [B, Hv, V, K]), float64, by the recurrence above.
    `state` None: zeros; `scale` None: K^-0.5; `l2`: normalise q and k first."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    g, beta = np.asarray(g, dtype=np.float64), np.asarray(beta, dtype=np.float64)
    B, T, Hk, K = q.shape
    Hv, V = v.shape[2], v.shape[3]
    if l2:
        q, k = l2norm(q, eps), l2norm(k, eps)
    heads = gqa_index(Hv, Hk)
    q, k = q[:, :, heads], k[:, :, heads]  # [B, T, Hv, K]
    scale = K ** -0.5 if scale is None else float(scale)
    S = np.zeros((B, Hv, V, K)) if state is None else np.array(state, dtype=np.float64)
    o = np.empty((B, T, Hv, V))
    for t in range(T):
        S *= np.exp(g[:, t])[:, :, None, None]
        u = beta[:, t][:, :, None] * (v[:, t] - np.einsum("bhvk,bhk->bhv", S, k[:, t]))
        S += u[:, :, :, None] * k[:, t][:, :, None, :]
        o[:, t] = np.einsum("bhvk,bhk->bhv", S, scale * q[:, t])
    return o, S


def gate(a, dt_bias, a_log) -> np.ndarray:
    """Qwen3-Next's log-decay g = −exp(A_log) · softplus(a + dt_bias), float64 (softplus
    unclamped, ln(1 + eˣ), in its overflow-free form); `a` [..., Hv], the others [Hv]."""
    x = np.asarray(a, dtype=np.float64) + np.asarray(dt_bias, dtype=np.float64)
    softplus = np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))
    return -np.exp(np.asarray(a_log, dtype=np.float64)) * softplus


def sigmoid(b) -> np.ndarray:
    """beta = sigmoid(b), float64, overflow-free."""
    b = np.asarray(b, dtype=np.float64)
    e = np.exp(-np.abs(b))
    return np.where(b >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
