"""`gdn_chunked`'s tolerance: B (`truth_bound`), a probabilistic bound on |any admissible
chunked computation − the float64 recurrence|, and `chunked_bound`, B plus the composition's own
distance to the recurrence, then the store. The derivation is `CHUNKED_DOC` (also the op's
`doc`); the notation `oracle/gdn_chunked_stage_bounds.py`'s.
"""

from __future__ import annotations

import numpy as np

from oracle.builders import kernel_view
from oracle.dtypes import spacing
from oracle.gdn import scale_of
from oracle.gdn_chunked_math import (CAUSAL, STRICT, chunked, compose, decay_tile, last_index,
                                     n_chunks, per_value_head, unchunked, valid, wy_operands)
from oracle.gdn_chunked_stage_bounds import EXP_REL, gamma, half_ulp_rel
from oracle.gdn_math import L2NORM_EPS, recurrent
from oracle.numerics import SUB32, TINY32, U, Model, Val, store_bound

CHUNKED_DOC = """`gdn_chunked`: the composition (`oracle/gdn_chunked.py`): q̂ = T(l2norm(q)),
k̂ = T(l2norm(k)) (with `l2norm`: computed in f32, stored to T once, as FLA's `l2norm_fwd`), then
cumsum, kkt, solve_tril, wy, chunk_h, chunk_o, each on the stored outputs of the ones before.
Same inputs and outputs as `gdn_recurrent` plus `chunk`. The oracle is that composition, T
roundings included; an admissible impl may hold any of its intermediates in f32 instead (the
torch form users write) and compute in f32 anywhere between.

Tolerance (`chunked_bound`) from B = `truth_bound`, a bound on |any admissible chunked
computation − the float64 recurrence| (`oracle/gdn_math.py`, the ground truth, q̂ and k̂ exact):
|impl − composition| <= |impl − truth| + |truth − composition| <= B + |composition − truth|,
the last term computed (the tolerance runs the recurrence; ~0.1 B), then T's store.

B is probabilistic, not worst-case. A worst-case bound (every rounding at its largest, all of
one sign, aligned with what it multiplies) sums C tokens, K and V lanes and NT chunks linearly
and is ~30x the real error at K = 16, more at 128: looser than the seed's end-to-end tolerance
(mlx-native's: 1e-2) that is the loosest acceptable. So (Higham & Mary, "A new approach to
probabilistic rounding error analysis", 2019): each rounding is an independent zero-mean error
δ_m with |δ_m| <= b_m (u_T |x| at a T store, u |x| in f32, exp's 4u + 2u |arg| + the cumsum's
γ_C Σ|g|); to first order an output is Σ_m c_m δ_m, c_m its sensitivity to rounding m, and by
Hoeffding's inequality |Σ_m c_m δ_m| <= λ (Σ_m c_m² b_m²)^½ but with probability 2 e^(−λ²/2).
λ = (2 ln(2 N / 1e-6))^½ over the N outputs of the case (λ ~ 6.6 at 10^3, 8.6 at 10^8): the
whole case within B but with probability 1e-6, per case. The sensitivities c_m are exact where
they are cheap, bounded in norm where not:

* within a chunk (X = Ai = (I + A)^-1, y_j = vb_j − kb_j s: v_new = u − w s = X y; Z_j =
  Σ_i d_i X_ij k_i and P = M X, how the state and o see a change of row j before X): an error
  of A_ij reaches the state as Z_i δ v_new_j and o as P_·i δ v_new_j; of Ai_ij (its T store) as
  d_i k_i δ y_j and M_·i δ y_j; of kb_jk and vb_j as Z_j δ s_k and P_·j δ s_k; of the stores of
  w, u, v_new, vdec and the A tile directly. f32 dot products (γ_n), the solve (2 γ_C |X||I+A||X|
  |y|, Higham §8.1) and the decays add their worst cases as one term each.
* h's T rounding (the state read by the chunk's dots) moves o_i as the state itself does:
  through q_i's exact map into the chunk, of norm <= ‖q_i‖ ρ_{n,i}; and the carried state by
  G = Σ_i d_i k_i w_iᵀ = exp(gc_last) I − M_n, ‖G‖ <= exp(gc_last) + ρ_n.
* q̂, k̂ stored in T (δ_l2 = u_T + γ_K / 2 + 6u relative per element): through the recurrence's
  own sensitivity, k_t + δk moving row v by J_t δk = δk v_new_t[v] − β_t e^{g_t} k_t (δk·s_{t−1})
  (J D Jᵀ <= 2 v_new² D + 2 (sᵀ D s) (β e^g k)(β e^g k)ᵀ: the first part isotropic, the second
  a column carried token by token through the rest of the chunk), and q_i + δq moving o_i by
  δq·s_i (the states inside the chunk from the WY form).
* across chunks, per value row (rows are independent), the K x K proxy (Σ_m b_m² a_m a_mᵀ, a_m
  the state's sensitivity to rounding m): the chunk maps it by its exact transition, carried as
  Σ_{n+1} = M_n Σ_n M_nᵀ + L_n, M_n = exp(gc_last) I − Σ_i d_i k_i w_iᵀ (= Π_t exp(g_t)(I − β_t
  k̂_t k̂_tᵀ), a contraction for unit keys and β in [0, 1]), L_n the chunk's own; o_i reads
  m_iᵀ Σ_n m_i, m_i = e^{gc_i} q_i − Σ_j M_ij w_j (q_i's exact map into the chunk), the final
  state diag(Σ_NT). Where that is costly (`COVARIANCE_WORK`) one proxy per head serves every row,
  each weight its largest over the rows (`_carried_shared`: an upper bound, ~1.4x looser at the
  seed shapes).

The second-order terms (products of two relative errors) are covered by a factor 1 + 1/16 while
u_T ‖|X||I + A|‖ < 1/16. The assumption that fails: data
whose roundings are not independent (every element of a row equal: `constant_rows`), which the
gate does not draw for this op.

Growth with T (`scripts/gdn_chunked_budget.py`, which prints it; CPU, bf16, chunk 64, gates near
1): B² adds each chunk's L_n carried by the chunk maps, so B(T)² = Σ_m ‖M_n⋯M_{m+1}‖² L_m <=
L Σ_k ρ^{2k} (ρ >= ‖M_n‖: Π_t exp(g_t) max(1, |1 − β_t ‖k̂_t‖²|)): √NT while nothing contracts (β ≈ 0 and gates ≈ 1), saturating at (L / (1 −
ρ²))^½ once the decay or the keys' projections forget. Measured max B and the budget (max
|x − truth| / B) of the composition | of torch's f32 form, per T = 1 / 64 / 512 / 4096 / 16384:

    Hv 2, K 16, V 8, β uniform   B_o  .0072 .049 .061 .077 .077   o  .03|.002 .10|.07 .13|.06 .14|.07 .14|.06
                                 B_S  .033  .21  .24  .24  .24    S  .09|.04  .06|.03 .08|.03 .09|.03 .08|.03
    same, β near 0 (B_S x9.5)    B_S  6e-5  2e-4 3e-4 6e-4 6e-4   o  .05|.02  .10|.08 .12|.10 .15|.09 .15|.10
    Hv 4, K = V = 128 (seed)     B_o  .0027 .0094 .020 .022 .023  o  .08|.02  .11|.06 .11|.08 .11|.07 .10|.07
                                 B_S  .051  .11  .22  .24  .24    S  .08|.04  .11|.05 .06|.03 .06|.03 .07|.03

(max |o| 0.02 to 0.9, max |S| 0.5 to 3.2; the seed rows from T = 512 with `_carried_shared`,
~1.4x the exact covariance's B there.) Every budget <= 1, the composition's >= 0.03 at
every T: the bound holds and follows the error as it grows. f32 cases use ~1e-3 of theirs: the worst-case f32 terms
(the solve's 2 γ_C |X||I + A||X|) dominate there."""


def _rel_exp(x, gc_err_a, gc_err_b=0.0):
    """Relative error of an f32 exp(x), x an f32 difference of cumsums each within gc_err."""
    return EXP_REL + 2.0 * U * np.abs(x) + gc_err_a + gc_err_b


def confidence_factor(n: int, failure: float = 1e-6) -> float:
    """λ with N·2·exp(−λ²/2) = failure: Hoeffding over N outputs (`CHUNKED_DOC`)."""
    return float(np.sqrt(2.0 * np.log(2.0 * max(int(n), 1) / failure)))


def token_states(s, v_new, k, q, gc, k_weight=None, q_weight=None) -> dict:
    """Per token t of every chunk (arrays [B, NT, C, Hv, V]): "after" ‖s_t‖ (the state after
    token t, e^{gc_t} s_n + Σ_{j<=t} e^{gc_t − gc_j} v_new_j k_jᵀ, exact in the WY form),
    "before" ‖s_{t−1}‖, "ks"
    Σ_k k_tk² s_{t−1}[v, k]² and "qs" Σ_k q_tk² s_t[v, k]². From s [B, NT, Hv, V, K] (before each
    chunk), v_new [B, NT, C, Hv, V], k and q [B, NT, C, Hv, K], gc [B, NT, C, Hv]; one chunk at a
    time (C·V·K values per head). `k_weight`, `q_weight` (default |k|, |q|): the per-element
    weights "ks" and "qs" take instead of k and q."""
    k_weight = k if k_weight is None else k_weight
    q_weight = q if q_weight is None else q_weight
    out = {name: np.empty(v_new.shape) for name in ("after", "before", "ks", "qs")}
    causal = CAUSAL(k.shape[2])
    for n in range(k.shape[1]):
        tile = decay_tile(gc[:, n:n + 1], causal)[:, 0]  # [B, C(i), Hv, C(j)]
        st = np.exp(gc[:, n])[..., None, None] * s[:, n][:, None]
        st = st + np.einsum("bihj,bjhv,bjhk->bihvk", tile, v_new[:, n], k[:, n], optimize=True)
        before = np.concatenate([s[:, n][:, None], st[:, :-1]], axis=1)
        out["after"][:, n] = np.sqrt(np.sum(st ** 2, axis=-1))
        out["before"][:, n] = np.sqrt(np.sum(before ** 2, axis=-1))
        out["ks"][:, n] = np.einsum("bihk,bihvk->bihv", k_weight[:, n] ** 2, before ** 2)
        out["qs"][:, n] = np.einsum("bihk,bihvk->bihv", q_weight[:, n] ** 2, st ** 2)
    return out


# The state's covariance proxy (K x K per value row) is carried where its work, NT chunks of
# B·Hv·V·K² values times K + 3C + K columns, stays below this (~10 s of NumPy: the seed shapes up to
# T = 512); beyond, one proxy per head for all rows (`_carried_shared`: looser where rows differ).
COVARIANCE_WORK = 1 << 35


def _carried_covariance(cols, weights, diag, m_chunk, m_q, h_round):
    """(o's proxy from the state before each chunk [B, NT, C, Hv, V], the final state's proxy
    [B, Hv, V, K]): `_carried_iterative`'s numbers without its K x K matrix per value row.
    Σ_n = Σ_{j<n} Q_j L_j Q_jᵀ with Q_j = M_{n-1}⋯M_{j+1} (the same for every row), so with
    u = Q_jᵀ m_i: m_iᵀ Σ_n m_i = Σ_{j<n} Σ_col w_j[col] (a_colᵀ u)² + Σ_k diag_j[k] u_k². Per
    pair of chunks j < n and head, K²C + K·M·C + (M + K)·C·V products instead of V·K²(2K + M)
    per chunk (the seed-shaped pipeline cases' oracle: 1.9-3.3 s before, 0.8-1.0 s now, one
    CPU thread); where the pairs cost more (many chunks, few value rows), `_carried_iterative`."""
    b, nt, hv, dk = cols.shape[:4]
    dv, m, c = weights.shape[3], cols.shape[-1], m_q.shape[2]
    pairs = nt * (nt - 1) / 2 * c * (dk * dk + dk * m + (m + dk) * dv)
    if pairs > nt * dv * dk * dk * (2 * dk + m):  # many small chunks, few rows: by chunk
        return _carried_iterative(cols, weights, diag, m_chunk, m_q, h_round)
    t = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731
    w_rows, d_rows = t(weights), t(diag)  # [B, NT, Hv, M | K, V]
    carried = np.empty(m_q.shape[:4] + (dv,))
    for n in range(nt):
        u = np.moveaxis(m_q[:, n], 1, -1)  # m_i as columns [B, Hv, K, C]
        acc = t(u * u) @ t(h_round[:, n])  # m_iᵀ diag(h_round) m_i [B, Hv, C, V]
        for j in range(n - 1, -1, -1):  # u = Q_jᵀ m_i, Q_j one chunk map longer each step
            if j < n - 1:
                u = t(m_chunk[:, j + 1]) @ u
            acc += t(np.square(t(cols[:, j]) @ u)) @ w_rows[:, j] + t(u * u) @ d_rows[:, j]
        carried[:, n] = np.swapaxes(acc, 1, 2)
    state2 = np.zeros((b, hv, dk, dv))
    reach = np.broadcast_to(np.eye(dk), (b, hv, dk, dk))  # Q_j to the final state
    for j in range(nt - 1, -1, -1):
        if j < nt - 1:
            reach = reach @ m_chunk[:, j + 1]
        state2 += np.square(reach @ cols[:, j]) @ w_rows[:, j] + np.square(reach) @ d_rows[:, j]
    return carried, t(state2)


def _carried_iterative(cols, weights, diag, m_chunk, m_q, h_round):
    """`_carried_covariance` carried chunk by chunk: Σ_{n+1} = M_n Σ_n M_nᵀ + L_n per value row,
    L_n = cols diag(weights) colsᵀ + diag; o_i's proxy m_iᵀ (Σ_n + diag(h_round)) m_i (h's T
    rounding, read by the chunk)."""
    b, nt, hv, dk = cols.shape[:4]
    dv = weights.shape[3]
    sigma = np.zeros((b, hv, dv, dk, dk))
    carried = np.empty(m_q.shape[:4] + (dv,))
    for n in range(nt):
        seen = sigma + h_round[:, n][..., None] * np.eye(dk)  # diag(u_T² s²) added
        mq = np.moveaxis(m_q[:, n], 1, -1)[:, :, None]  # [B, Hv, 1, K, C]
        carried[:, n] = np.moveaxis(np.sum(mq * (seen @ mq), axis=-2), -1, 1)  # m_iᵀ Σ m_i
        a = cols[:, n][:, :, None]  # [B, Hv, 1, K, M]
        local = (a * weights[:, n][:, :, :, None, :]) @ np.swapaxes(a, -1, -2)
        local[..., np.arange(dk), np.arange(dk)] += diag[:, n]
        mt = m_chunk[:, n][:, :, None]
        sigma = mt @ sigma @ np.swapaxes(mt, -1, -2) + local
    return carried, sigma[..., np.arange(dk), np.arange(dk)]


def _carried_shared(cols, weights, diag, m_chunk, m_q, h_round):
    """`_carried_covariance` with one proxy per head for all value rows: each weight and diagonal
    term its largest over the rows (Σ_v <= Σ_max in the Loewner order, the weights being >= 0),
    V times cheaper and looser where rows differ."""
    top = lambda a: a.max(axis=3, keepdims=True)  # noqa: E731  over V
    carried, state2 = _carried_iterative(cols, top(weights), top(diag), m_chunk, m_q,
                                         top(h_round))
    dv = weights.shape[3]
    return (np.broadcast_to(carried, carried.shape[:-1] + (dv,)),
            np.broadcast_to(state2, state2.shape[:2] + (dv,) + state2.shape[3:]))


def _through_chunk(scale_t, k, q, beta, g):
    """Carry column a_t = scale_t k_t, introduced at token t of its chunk, through the chunk's
    later tokens (s -> e^{g}(s − β k (k·s))): (the columns at the chunk's end [B, NT, Hv, K, C(t)],
    q_i · (column t at token i) [B, NT, C(i), C(t), Hv], 0 for t > i). All chunks at once, token
    by token: C·K per token and head."""
    b, nt, c, hv, dk = k.shape
    cols = np.zeros((b, nt, hv, dk, c))
    seen = np.zeros((b, nt, c, c, hv))
    for i in range(c):
        ki = k[:, :, i][..., None]  # [B, NT, Hv, K, 1]
        proj = np.sum(ki * cols, axis=-2, keepdims=True)  # k_i · each column
        cols = np.exp(g[:, :, i])[..., None, None] * (cols - beta[:, :, i][..., None, None]
                                                     * ki * proj)
        cols[..., i] = scale_t[:, :, i][..., None] * k[:, :, i]
        seen[:, :, i] = np.moveaxis(np.einsum("bnhk,bnhkt->bnht", q[:, :, i], cols), -1, 2)
    return cols, seen


def truth_bound(inputs, case, comp: dict | None = None) -> dict:
    """B (`CHUNKED_DOC`): {"o": [B, T, Hv, V], "state": [B, Hv, V, K], "lambda": λ,
    "proxy_state": R_n [B, NT + 1, Hv, V]}: bounds on |chunked − recurrence| before any store."""
    comp = comp if comp is not None else compose(inputs, case)
    p, dtype, dims = case.params, case.dtype, case.dims
    c, t, hv, dk = p["chunk"], dims["tokens"], dims["heads_v"], dims["dim_k"]
    ut = half_ulp_rel(dtype)
    d_l2 = (ut + gamma(dk) / 2.0 + 6.0 * U) if p["l2norm"] else 0.0
    # a T store errs by ut |x|, or among T's subnormals by half their spacing h_T (an impl may
    # keep the value in f32 where the composition's store flushes it: f16 `tiny` inputs)
    h_t = 0.5 * float(spacing(np.zeros(1), dtype)[0])
    tq = lambda a: ut * np.abs(a) + h_t  # noqa: E731
    g_k, g_c = gamma(dk), gamma(c)
    sq = np.square
    mix = lambda tile, y: np.einsum("bnihj,bnjhk->bnihk", tile, y)  # noqa: E731
    ws = lambda a, b: np.einsum("bnihk,bnhvk->bnihv", a, b)  # noqa: E731

    qc = chunked(per_value_head(comp["q"], hv), c)  # [B, NT, C, Hv, K]
    kc = chunked(per_value_head(comp["k"], hv), c)
    bc, gcc = chunked(comp["beta"], c), chunked(comp["gc"], c, edge=True)
    gc_err = g_c * np.cumsum(np.abs(chunked(comp["g"], c)), axis=2)  # [B, NT, C, Hv]
    ok, lasts = valid(t, c), last_index(t, c)
    nt = qc.shape[1]
    s = comp["h_exact"]  # [B, NT, Hv, V, K]
    s2 = sq(s)
    x = chunked(comp["Ai"], c)  # [B, NT, C(i), Hv, C(j)]
    a_abs = np.abs(chunked(comp["A"], c))
    kb, vb = (chunked(a, c) for a in wy_operands(comp["k"], comp["v"], comp["beta"],
                                                  comp["gc"], dtype))
    w, u, vn = chunked(comp["w"], c), chunked(comp["u"], c), chunked(comp["v_new"], c)
    y = vb - ws(kb, s)
    lasts_idx = lasts[None, :, None, None]
    g_last = np.take_along_axis(gcc, lasts_idx, axis=2)[:, :, 0]  # [B, NT, Hv]
    err_last = np.take_along_axis(gc_err, lasts_idx, axis=2)[:, :, 0]
    x_d = g_last[:, :, None] - gcc
    d = np.exp(x_d) * ok[None, :, :, None]  # [B, NT, C, Hv]
    vdec = comp["vdec"]
    k_norm2 = sq(kc).sum(axis=-1)  # [B, NT, C, Hv]

    # --- each elementary rounding's bound b_m ----------------------------------------------------
    strict = STRICT(c)[None, None, :, None, :]
    diff = gcc[:, :, :, :, None] - np.swapaxes(gcc, 2, 3)[:, :, None, :, :]
    d_e = _rel_exp(diff, gc_err[..., None], np.swapaxes(gc_err, 2, 3)[:, :, None, :, :])
    kk = np.einsum("bnihk,bnjhk->bnihj", np.abs(kc), np.abs(kc))
    b_a = (bc[..., None] * decay_tile(gcc, STRICT(c)) * kk * (g_k + ut)
           + a_abs * (d_e + 3 * U) * strict)  # kβ may be held in T (FLA's tensor cores)
    b_kb = np.abs(kb) * (ut + _rel_exp(gcc, gc_err) + 3 * U)[..., None] + h_t
    b_vb = np.abs(vb) * (ut + U) + h_t

    # --- sensitivities --------------------------------------------------------------------------
    ks2 = ws(sq(b_kb), s2)  # Σ_k b_kb² s² [B, NT, C, Hv, V]
    # v_new's worst-case f32 errors (dots, the solve, X's dots), one term per element
    lower = np.eye(c)[None, None, :, None, :] + a_abs
    ax = np.abs(x)
    f32_vn = (gamma(dk + 1) * (np.abs(u) + ws(np.abs(w), np.abs(s)))
              + 2 * g_c * mix(ax, mix(lower, mix(ax, np.abs(y))))
              + g_c * mix(ax, ws(np.abs(kb), np.abs(s)) + np.abs(vb)))

    # --- the state: the chunk's proxy L_n per row, then R_n across chunks -------------------------
    # q̂, k̂ stored in T: an element errs by δ_l2 |x| or, among T's subnormals, by half their
    # spacing: the weights |x| + h / δ_l2 (so δ_l2² weight² covers (δ_l2 |x| + h)²)
    h = 0.5 * float(spacing(np.zeros(1), dtype)[0]) / d_l2 if d_l2 else 0.0
    k_w, q_w = np.abs(kc) + h, np.abs(qc) + h
    tok = token_states(s, vn, kc, qc, gcc, k_w, q_w)
    expand = np.log(np.maximum(1.0, np.abs(1.0 - bc * k_norm2))) * ok[None, :, :, None]
    rho_i = np.exp(gcc + np.cumsum(expand, axis=2))  # [B, NT, C, Hv]: through token i
    grow2 = sq(np.maximum(1.0, rho_i.max(axis=2)))[..., None]  # [B, NT, Hv, 1]
    decay = np.exp(g_last)[..., None, None]  # [B, NT, Hv, 1, 1]
    # k̂_t + δk moves the state by J_t δk, J_t = v_new_t[v] I − β_t e^{g_t} k_t s_{t−1}ᵀ, and
    # J D Jᵀ <= 2 (v_new² D + (sᵀ D s) (β e^g k)(β e^g k)ᵀ), D = δ_l2² diag(k_t²): the first part
    # isotropic (<= v_new² max D, through the rest of the chunk at most grow²), the second a
    # column β_t e^{g_t} k_t carried exactly to the chunk's end and to each later o_i
    g_tok = chunked(comp["g"], c)
    l2_iso = 2 * d_l2 ** 2 * sq(k_w).max(axis=-1)[..., None] * sq(vn)  # [B, NT, C, Hv, V]
    l2_w = 2 * d_l2 ** 2 * tok["ks"]  # the column's weight sᵀ D s [B, NT, C, Hv, V]
    l2_cols, l2_o = _through_chunk(bc * np.exp(g_tok), kc, qc, bc, g_tok)
    accum = g_c * (decay * np.abs(s) + np.einsum("bnihv,bnihk->bnhvk", np.abs(vdec),
                                                  np.abs(kc)))
    decay_err = decay * np.abs(s) * (_rel_exp(g_last, err_last) + U)[..., None, None]
    vdec_f32 = np.abs(vdec) * (_rel_exp(x_d, gc_err, err_last[:, :, None]) + U)[..., None]
    # the chunk's roundings as (column a_m, weight b_m² per value row): the state moves by
    # Σ_m a_m δ_m (`CHUNKED_DOC`); L_n = Σ_m b_m² a_m a_mᵀ per row
    z = np.einsum("bnih,bnihk,bnihj->bnhkj", d, kc, x)  # Z_j as columns [B, NT, Hv, K, C]
    kt = np.moveaxis(kc, 2, -1)  # k_i [B, NT, Hv, K, C]
    g_mat = np.einsum("bnih,bnihk,bnihl->bnhkl", d, kc, w)  # G = Σ d_i k_i w_iᵀ
    per_row = lambda a: np.moveaxis(a, 2, -1)  # noqa: E731  [B, NT, C, Hv, V] -> [B,NT,Hv,V,C]
    cols = np.concatenate([z, kt, g_mat, l2_cols], axis=-1)  # [B, NT, Hv, K, 3C + K]
    weights = np.concatenate([
        per_row(ks2 + sq(b_vb)) + np.einsum("bnihj,bnjhv->bnhvi", sq(b_a), sq(vn)),  # Z_i
        per_row(sq(d)[..., None] * (mix(sq(tq(x)), sq(y)) + ws(sq(tq(w)), s2) + sq(tq(u))
                                    + sq(f32_vn))
                + sq(tq(vdec)) + sq(vdec_f32)),  # k_i (d_i k_i's folded in)
        sq(tq(np.sqrt(s2))), per_row(l2_w)], axis=-1)  # [B, NT, Hv, V, 3C + K]
    diag = sq(accum + decay_err) + (grow2 * l2_iso.sum(axis=2))[..., None]  # [B,NT,Hv,V,K]
    m_chunk = decay * np.eye(dk) - g_mat  # the chunk's transition [B, NT, Hv, K, K]
    causal = CAUSAL(c)
    e_causal = decay_tile(gcc, causal)
    m = np.einsum("bnihk,bnjhk->bnihj", qc, kc) * e_causal
    # o_i sees the state before its chunk through m_i = M_{<=i}ᵀ q_i = e^{gc_i} q_i − Σ_j M_ij w_j
    m_q = np.exp(gcc)[..., None] * qc - mix(m, w)  # [B, NT, C, Hv, K]
    carry = (_carried_covariance if np.prod(s.shape) * dk * (2 * dk + cols.shape[-1])
             <= COVARIANCE_WORK else _carried_shared)
    carried, state2 = carry(cols, weights, diag, m_chunk, m_q, sq(tq(np.sqrt(s2))))

    # --- the output -----------------------------------------------------------------------------
    pm = np.einsum("bnihl,bnlhj->bnihj", m, x)  # P = M X
    qk = np.einsum("bnihk,bnjhk->bnihj", np.abs(qc), np.abs(kc))
    b_m = (tq(m) + e_causal * qk * (U + g_k)
           + np.abs(m) * (d_e * causal[None, None, :, None, :] + 2 * U))
    eg = np.exp(gcc)[..., None]
    inter = eg * np.abs(ws(qc, s))
    f32_inter = (eg * g_k * ws(np.abs(qc), np.abs(s))
                 + inter * (_rel_exp(gcc, gc_err) + U)[..., None])
    mv = mix(np.abs(m), np.abs(vn))
    o2 = (carried
          + mix(sq(pm), ks2 + sq(b_vb))
          + mix(sq(pm), mix(sq(b_a), sq(vn)))
          + mix(sq(m), mix(sq(tq(x)), sq(y)))
          + mix(sq(m), ws(sq(tq(w)), s2) + sq(tq(u)) + sq(tq(vn)))
          + mix(sq(b_m), sq(vn))
          + mix(sq(m), sq(f32_vn))
          + sq(f32_inter) + sq(g_c * mv) + sq(3 * U * (inter + mv))
          + sq(qc).sum(axis=-1)[..., None] * grow2[:, :, None] * np.cumsum(l2_iso, axis=2)
          + np.einsum("bnith,bnthv->bnihv", sq(l2_o), l2_w)
          + d_l2 ** 2 * tok["qs"])
    second = 1.0 + 1.0 / 16.0
    n_out = int(np.prod(comp["o_exact"].shape)) + int(np.prod(comp["state_exact"].shape))
    lam = confidence_factor(n_out)
    scale = scale_of(case)
    o_bound = second * lam * scale * np.sqrt(unchunked(o2, t))
    return {"o": o_bound, "state": second * lam * np.sqrt(state2), "lambda": lam}


def chunked_bound(inputs, exact, case):
    """B + |composition − truth| per element (`CHUNKED_DOC`), then the store."""
    comp = compose(inputs, case)
    b = truth_bound(inputs, case, comp)
    x = kernel_view(inputs, case)
    o_true, s_true = recurrent(x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"],
                               scale_of(case), l2=case.params["l2norm"], eps=L2NORM_EPS)
    # B is first order in relative errors: a subnormal's absolute half spacing (a flush under
    # ftz) per f32 operation, counted generously (every operation of every chunk, times C for
    # what Ai's rows may gather), bounds what underflow adds
    c, dk, dv = case.params["chunk"], case.dims["dim_k"], case.dims["dim_v"]
    sub = (TINY32 if case.params.get("ftz") else SUB32) * (2 * (c + dk + dv) + 8) * c * \
        n_chunks(case.dims, case.params)
    model = Model()
    return {"o": store_bound(Val(exact["o"], b["o"] + np.abs(exact["o"] - o_true) + sub, model),
                             case.dtype),
            "state": store_bound(Val(exact["state"], b["state"] + np.abs(exact["state"] - s_true)
                                     + sub, model), "f32")}
