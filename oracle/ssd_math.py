"""Mamba-2's selective state-space scan in float64 (mamba_ssm, HF Nemotron-H): the ground
truth every SSD op's oracle and property is checked against (`oracle/ssd.py`: the sequential
scan, its packed-sequence form and the decode step; `oracle/ssd_chunked.py`: the chunked SSD).

Layouts (mamba_ssm / HF Mamba2 / Nemotron-H):

    x, y, z  [B, T, H, P]     dt [B, T, H]     A, D, dt_bias [H]     Bm, Cm [B, T, G, N]
    state    [B, H, P, N]     head h reads group g = h // (H / G)  (NOT h % G)

Per (b, h), the state S [P, N] starting at the initial state, for t = 0..T-1 (mamba_ssm's
`selective_state_update_ref`, HF `modeling_nemotron_h.py`'s `torch_forward`):

    dt_t = softplus(dt_raw_t + dt_bias)      clamped to [dt_min, dt_max] where the model does
    S    = exp(dt_t A) S + dt_t x_t ⊗ B_t[g]  A = −exp(A_log) < 0: the decay exp(dt A) in (0, 1]
    y_t  = S C_t[g] + D x_t                  then y_t *= silu(z_t) with a gate

The chunked form (`mamba_ssm/modules/ssd_minimal.py::ssd_minimal_discrete`, Listing 1 of the
Mamba-2 paper) regroups the same sums by chunks of Q tokens: with a_t = dt_t A and, inside a
chunk, the segment sums seg(l, s) = Σ_{s<m<=l} a_m (the *stable* segsum: a masked cumulative
sum, never cs_l − cs_s) and the chunk-local prefix cs_l = Σ_{m<=l} a_m,

    Y_diag[l] = Σ_{s<=l} (C_l·B_s) exp(seg(l, s)) dt_s x_s           (inside the chunk)
    st_n      = Σ_s exp(seg(Q−1, s)) dt_s x_s ⊗ B_s                   (the chunk's own state)
    S_{n+1}   = exp(cs_{Q−1}) S_n + st_n                             (state passing, S_0 = h0)
    Y_off[l]  = exp(cs_l) S_n C_l                                     (the state before chunk n)
    y         = Y_diag + Y_off + D x  (then the gate)

equal to the recurrence in exact arithmetic (T need not be a multiple of Q: the chunks are padded
with a = 0 and x = 0, which neither decays nor adds). Everything here is float64 on the values as
given; the ops' oracles apply their contracts' rounding points around it.
"""

from __future__ import annotations

import numpy as np

from oracle.builders import silu


def softplus(x) -> np.ndarray:
    """ln(1 + eˣ), float64, overflow-free."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def time_step(dt_raw, dt_bias, dt_min: float = 0.0, dt_max: float | None = None) -> np.ndarray:
    """dt = softplus(dt_raw + dt_bias), clamped to [dt_min, dt_max] (dt_max None: no upper
    clamp; dt_min 0: no lower clamp, softplus being > 0): [..., H] from dt_raw [..., H] and
    dt_bias [H]."""
    dt = softplus(np.asarray(dt_raw, dtype=np.float64) + np.asarray(dt_bias, dtype=np.float64))
    if dt_min > 0:
        dt = np.maximum(dt, dt_min)
    if dt_max is not None:
        dt = np.minimum(dt, dt_max)
    return dt


def decay_rate(a_log) -> np.ndarray:
    """A = −exp(A_log) [H], float64."""
    return -np.exp(np.asarray(a_log, dtype=np.float64))


def group_index(heads: int, groups: int) -> np.ndarray:
    """The B/C group of each head: h // (H / G)."""
    if groups <= 0 or heads % groups:
        raise ValueError(f"SSD: heads={heads} must be a multiple of groups={groups}")
    return np.arange(heads) // (heads // groups)


def per_head(bc: np.ndarray, heads: int) -> np.ndarray:
    """B or C [..., G, N] -> [..., H, N]: head h reads group h // (H / G)."""
    return np.asarray(bc, dtype=np.float64)[..., group_index(heads, bc.shape[-2]), :]


def recurrence(x, dt, A, Bm, Cm, D, z=None, h0=None) -> tuple[np.ndarray, np.ndarray]:
    """(y [B, T, H, P], final state [B, H, P, N]), float64, token by token (module docstring):
    x [B, T, H, P], dt [B, T, H] (after softplus and the clamp), A and D [H], Bm, Cm
    [B, T, G, N], z [B, T, H, P] or None (no gate), h0 [B, H, P, N] or None (zeros)."""
    x, dt = np.asarray(x, dtype=np.float64), np.asarray(dt, dtype=np.float64)
    A, D = np.asarray(A, dtype=np.float64), np.asarray(D, dtype=np.float64)
    b, t, h, p = x.shape
    bh, ch = per_head(Bm, h), per_head(Cm, h)  # [B, T, H, N]
    n = bh.shape[-1]
    s = np.zeros((b, h, p, n)) if h0 is None else np.array(h0, dtype=np.float64)
    y = np.empty((b, t, h, p))
    for i in range(t):
        decay = np.exp(dt[:, i] * A)[..., None, None]  # [B, H, 1, 1]
        s = s * decay + (dt[:, i, :, None] * x[:, i])[..., None] * bh[:, i, :, None, :]
        y[:, i] = np.einsum("bhpn,bhn->bhp", s, ch[:, i]) + D[:, None] * x[:, i]
    if z is not None:
        y = y * silu(np.asarray(z, dtype=np.float64))
    return y, s


def segsum(a: np.ndarray) -> np.ndarray:
    """The stable segment sum of `ssd_minimal_discrete`: a [..., Q] -> [..., Q(l), Q(s)] with
    Σ_{s<m<=l} a_m where s <= l (0 on the diagonal), −inf above it: a masked cumulative sum of
    a repeated along a new axis, not the difference of two cumulative sums."""
    q = a.shape[-1]
    rep = np.broadcast_to(a[..., :, None], a.shape + (q,))  # [..., m, s] = a_m
    strict = np.tril(np.ones((q, q), dtype=bool), -1)  # m > s
    seg = np.cumsum(np.where(strict, rep, 0.0), axis=-2)  # [..., l, s] = Σ_{s<m<=l} a_m
    return np.where(np.tril(np.ones((q, q), dtype=bool)), seg, -np.inf)


def chunks(x: np.ndarray, q: int) -> np.ndarray:
    """[B, T, ...] -> [B, NT, Q, ...], zero-padded past T."""
    x = np.asarray(x, dtype=np.float64)
    pad = -x.shape[1] % q
    if pad:
        x = np.concatenate([x, np.zeros((x.shape[0], pad) + x.shape[2:])], axis=1)
    return x.reshape((x.shape[0], -1, q) + x.shape[2:])


def chunked(x, dt, A, Bm, Cm, D, chunk: int, z=None, h0=None) -> dict:
    """The chunked SSD in float64 (module docstring), same arguments as `recurrence` plus the
    chunk size: {"y" [B, T, H, P], "state" [B, H, P, N], "states" [B, NT, H, P, N] (the state
    before each chunk), "y_diag", "y_off" [B, T, H, P]}."""
    x, dt = np.asarray(x, dtype=np.float64), np.asarray(dt, dtype=np.float64)
    A, D = np.asarray(A, dtype=np.float64), np.asarray(D, dtype=np.float64)
    b, t, h, p = x.shape
    xc, dtc = chunks(x, chunk), chunks(dt, chunk)  # [B, NT, Q, H, P], [B, NT, Q, H]
    bc, cc = chunks(per_head(Bm, h), chunk), chunks(per_head(Cm, h), chunk)  # [B, NT, Q, H, N]
    n, nt = bc.shape[-1], xc.shape[1]
    a = np.moveaxis(dtc * A, 2, -1)  # [B, NT, H, Q]
    big_l = np.exp(segsum(a))  # [B, NT, H, Q(l), Q(s)], 0 above the diagonal
    cs = np.cumsum(a, axis=-1)  # [B, NT, H, Q]
    xdt = xc * dtc[..., None]  # [B, NT, Q, H, P]
    cb = np.einsum("bclhn,bcshn->bchls", cc, bc)
    y_diag = np.einsum("bchls,bcshp->bclhp", cb * big_l, xdt)
    decay_states = big_l[..., -1, :]  # exp(seg(Q − 1, s)) [B, NT, H, Q]
    st = np.einsum("bcshn,bchs,bcshp->bchpn", bc, decay_states, xdt)
    s = np.zeros((b, h, p, n)) if h0 is None else np.array(h0, dtype=np.float64)
    states = np.empty((b, nt, h, p, n))
    for c in range(nt):
        states[:, c] = s
        s = np.exp(cs[:, c, :, -1])[..., None, None] * s + st[:, c]
    y_off = np.einsum("bclhn,bchpn,bchl->bclhp", cc, states, np.exp(cs))
    flat = lambda v: v.reshape((b, -1) + v.shape[3:])[:, :t]  # noqa: E731
    y = flat(y_diag + y_off) + D[:, None] * x
    if z is not None:
        y = y * silu(np.asarray(z, dtype=np.float64))
    return {"y": y, "state": s, "states": states, "y_diag": flat(y_diag), "y_off": flat(y_off)}
