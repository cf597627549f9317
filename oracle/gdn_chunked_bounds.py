"""The tolerances of the chunked GDN pipeline (`oracle/gdn_chunked.py`), each derived, each
stage's docstring (below, also the op's `doc`) saying how. Notation: u = 2^-24 (f32's unit
roundoff), u_T half an ULP of T relative (eps(T) / 2: 2^-9 bf16, 2^-11 f16, 2^-24 f32),
γ_n = n u / (1 − n u) (Higham's bound of an n-term f32 sum or dot product, any order, relative to
the sum of the magnitudes), and "exp" costs its backend's ULPs (`oracle.numerics`; 2 ULP = 4u
relative) plus the rounding of its argument.
"""

from __future__ import annotations

import numpy as np

from oracle.builders import kernel_view
from oracle.dtypes import eps as dtype_eps
from oracle.dtypes import round_to, spacing
from oracle.gdn_chunked import (CAUSAL, STRICT, chunked, compose, decay_tile, forward_inverse,
                                last_index, per_value_head, scale_of, unchunked, valid,
                                wy_operands)
from oracle.numerics import U, Model, Val, store_bound

# The kernel models' arrays per block of chunks (float64 intervals, a few copies each).
BLOCK_ELEMS = 1 << 21
EXP_REL = 4.0 * U  # an exp of 2 ULPs at its result (`oracle.numerics.FUNCTION_ULPS`), relative


def gamma(n) -> np.ndarray:
    n = np.asarray(n, dtype=np.float64)
    return n * U / (1.0 - n * U)


def half_ulp_rel(dtype: str) -> float:
    """u_T: half an ULP of 1 in `dtype`, the relative error of one rounding to it."""
    return dtype_eps(dtype) / 2.0


def _blocks(nt: int, per_chunk: int) -> list[slice]:
    step = max(1, BLOCK_ELEMS // max(1, per_chunk))
    return [slice(a, min(nt, a + step)) for a in range(0, nt, step)]


def _finish(A, parts: list, shape_tail: tuple, t: int):
    """Concatenate per-block chunk results [B, nb, C, ...] and lay them out as [B, T, ...]."""
    whole = parts[0] if len(parts) == 1 else A.concat(parts, axis=1)
    b, nt, c = whole.shape[:3]
    return whole.reshape(b, nt * c, *shape_tail).at((slice(None), slice(0, t)))


def _masked_gc(gcc: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gc_i, gc_j) [B, NT, C(i), Hv, C(j)], both 0 where not mask[i, j]: exp of their
    difference is then an exact 1 there, never an overflow."""
    m = mask[None, None, :, None, :]
    return gcc[:, :, :, :, None] * m, np.swapaxes(gcc, 2, 3)[:, :, None, :, :] * m


# --- gdn_chunk_cumsum ----------------------------------------------------------------------------

CUMSUM_DOC = """`gdn_chunk_cumsum`: gc [B, T, Hv] f32, the chunk-local inclusive cumsum of g
(`oracle/gdn_chunked.py`). Tolerance: the admissible kernel (`cumsum_kernel`) sums each prefix's
terms in f32 in any order (a sequential scan, a tree scan): `oracle/numerics.py`'s any-order
sum bound, at most (i/2) u Σ_{m<=i} |g_m| for token i of its chunk."""


def cumsum_kernel(A, inputs, case):
    g = kernel_view(inputs, case)["g"]
    c, t = case.params["chunk"], g.shape[1]
    gc = chunked(g, c)  # [B, NT, C, Hv]
    incl = CAUSAL(c)[None, None, :, None, :]
    parts = []
    for blk in _blocks(gc.shape[1], gc.shape[0] * c * c * gc.shape[3]):
        terms = np.swapaxes(gc[:, blk], 2, 3)[:, :, None, :, :] * incl  # [B, nb, C, Hv, C]
        parts.append(A.sum(A.load(terms)))
    return {"gc": _finish(A, parts, (g.shape[2],), t)}


# --- gdn_kkt ------------------------------------------------------------------------------------

KKT_DOC = """`gdn_kkt`: A [B, T, Hv, C] f32, A[n C + i, h, j] = beta_i (k_i·k_j) exp(gc_i − gc_j)
for j < i in the chunk, else exactly 0 (`oracle/gdn_chunked.py`). Tolerance: the admissible
kernel (`kkt_kernel`): the K-term dot k_i·k_j in any order, the f32 difference gc_i − gc_j and
its exp, then the product of beta_i, the dot and the decay in any association; or (FLA's
`chunk_scaled_dot_kkt_fwd`, tensor cores) k_i·beta_i formed first and held in T or f32 as the
dot's operand (`may_round`), the dot, then the decay. Masked entries are exact zeros."""


def kkt_kernel(A, inputs, case):
    x = kernel_view(inputs, case)
    c, t, hv, dtype = case.params["chunk"], x["beta"].shape[1], x["beta"].shape[2], case.dtype
    kc = chunked(per_value_head(x["k"], hv), c)  # [B, NT, C, Hv, K]
    bc, gcc = chunked(x["beta"], c), chunked(x["gc"], c, edge=True)
    strict = STRICT(c)
    b, nt, _, _, dk = kc.shape
    parts = []
    for blk in _blocks(nt, b * c * hv * c * dk):
        ki = kc[:, blk][:, :, :, :, None, :]  # [B, nb, C(i), Hv, 1, K]
        kj = np.swapaxes(kc[:, blk], 2, 3)[:, :, None]  # [B, nb, 1, Hv, C(j), K]
        beta_i = bc[:, blk][..., None] * strict[None, None, :, None, :]  # masked: exact 0
        gi, gj = _masked_gc(gcc[:, blk], strict)
        decay = (A.load(gi) - A.load(gj)).exp()
        dot = A.sum(A.load(ki) * A.load(kj))
        plain = A.prod3(A.load(beta_i), dot, decay)
        kb = (A.load(ki) * A.load(beta_i[..., None])).may_round(dtype)
        tensor_core = A.sum(kb * A.load(kj)) * decay
        parts.append(A.either(plain, tensor_core))
    return {"A": _finish(A, parts, (hv, c), t)}


# --- gdn_solve_tril -----------------------------------------------------------------------------

SOLVE_DOC = """`gdn_solve_tril`: Ai [B, T, Hv, C] in T, (I + L)^-1 per chunk, L = A's strictly
lower part (the rest of A is not read), row n C + i holding row i of chunk n's inverse
(`oracle/gdn_chunked.py`). Tolerance, by hand (`solve_bound`): X = (I + L)^-1 computed in f32 by
substitution (row or column oriented, any order within each dot; FLA's 16x16 blocks and their
merge X21 = −X22 L21 X11 are the same products) satisfies (Higham, Accuracy and Stability §8.1,
§14.2) (I + L + ΔL_j) x̂_j = e_j with |ΔL_j| <= γ_C |I + L|, so |X̂ − X| <= γ_C |X| |I + L| |X̂|,
and with |X̂| <= |X| + |X̂ − X| while γ_C ‖|X||I + L|‖ < 1/2: |X̂ − X| <= 2 γ_C |X| |I + L| |X|
element-wise: the conditioning of (I + A) is in the bound, not assumed. Then T's rounding at the
store (`store_bound`). Tensor-float-32 merge dots (FLA's default on Ampere and later) are not
admitted: their 2^-11 relative error is outside this bound."""


def _tiles(a: np.ndarray, c: int) -> np.ndarray:
    """A [B, T, Hv, C] -> per-chunk matrices [B, NT, Hv, C(i), C(j)]."""
    return np.swapaxes(chunked(a, c), 2, 3)


def _untiles(x: np.ndarray, t: int) -> np.ndarray:
    return unchunked(np.swapaxes(x, 2, 3), t)


def solve_bound(inputs, exact, case):
    a = kernel_view(inputs, case)["A"]
    c, t = case.params["chunk"], a.shape[1]
    tiles = _tiles(a, c)
    x = np.abs(forward_inverse(tiles))
    lower = np.eye(c) + np.abs(np.tril(tiles, -1))
    err = 2.0 * gamma(c) * (x @ lower @ x)
    return {"Ai": store_bound(Val(exact["Ai"], _untiles(err, t), Model()), case.dtype)}


# --- gdn_wy -------------------------------------------------------------------------------------

WY_DOC = """`gdn_wy`: w = Ai @ T(k · beta · exp(gc)) [B, T, Hv, K], u = Ai @ T(v · beta)
[B, T, Hv, V], both in T, per chunk (`oracle/gdn_chunked.py`; FLA's `recompute_w_u`: the two
operands rounded to T before the dots). Tolerance: the admissible kernel (`wy_kernel`): exp(gc)
with its ULPs, the three-factor product in any association, the declared rounding to T (an
interval straddling a midpoint of T costs its neighbour: `oracle/numerics.py`), the C-term dot
with Ai in any order; T's rounding at the store."""


def wy_kernel(A, inputs, case):
    x = kernel_view(inputs, case)
    c, dtype = case.params["chunk"], case.dtype
    t, hv = x["beta"].shape[1], x["beta"].shape[2]
    kc = chunked(per_value_head(x["k"], hv), c)  # [B, NT, C, Hv, K]
    vc, bc, gcc = chunked(x["v"], c), chunked(x["beta"], c), chunked(x["gc"], c, edge=True)
    aic = chunked(x["Ai"], c)  # [B, NT, C(i), Hv, C(j)]
    b, nt, _, _, dk = kc.shape
    dv = vc.shape[-1]
    w_parts, u_parts = [], []
    for blk in _blocks(nt, b * c * hv * max(dk, dv) * c):
        ai = A.load(aic[:, blk][:, :, :, :, None, :])  # [B, nb, C(i), Hv, 1, C(j)]
        per_j = lambda a: np.swapaxes(a, 2, 3)[:, :, None, :, None, :]  # noqa: E731  [B,nb,1,Hv,1,C]
        kt = np.moveaxis(kc[:, blk], 2, -1)[:, :, None]  # [B, nb, 1, Hv, K, C(j)]
        vt = np.moveaxis(vc[:, blk], 2, -1)[:, :, None]  # [B, nb, 1, Hv, V, C(j)]
        beta_j, decay_j = A.load(per_j(bc[:, blk])), A.load(per_j(gcc[:, blk])).exp()
        kb = A.prod3(A.load(kt), beta_j, decay_j).round_to(dtype)
        vb = (A.load(vt) * beta_j).round_to(dtype)
        w_parts.append(A.sum(ai * kb))
        u_parts.append(A.sum(ai * vb))
    return {"w": _finish(A, w_parts, (hv, dk), t), "u": _finish(A, u_parts, (hv, dv), t)}


# --- gdn_chunk_o --------------------------------------------------------------------------------

CHUNK_O_DOC = """`gdn_chunk_o`: the seed kernel (mlx-native `gated_delta_net_chunk_o`, FLA
`chunk_fwd_kernel_o`), o [B, T, Hv, V] in T, per chunk n and token i:

    o_i = scale·exp(gc_i)·(h_n q_i) + scale·Σ_{j<=i} T(exp(gc_i − gc_j)·(q_i·k_j))·v_new_j

h [B, NT, Hv, V, K] (T, V-major: the state before chunk n), v_new (T), gc (f32). The causal mask
INCLUDES the diagonal; the A tile is rounded to T after the mask and before the closing dot (a
contract rounding point: a kernel keeping it in f32 is wrong in bf16 and f16); the scale is
applied after the dots. Tolerance: the admissible kernel (`chunk_o_kernel`): the K-term dots
q·h and q·k in any order, exp(gc_i) and exp(gc_i − gc_j) with their arguments' rounding and ULPs,
the gate products, the declared rounding of the tile to T (`Val.round_to`: a tile entry whose
interval straddles a midpoint of T costs one neighbour), the C-term closing dot in any order,
then (inter + intra)·scale or inter·scale + intra·scale (the seed: once at the store; FLA: each
dot), and T's rounding at the store. Memory: the model holds C·V·K products per chunk and head
(blocks of chunks keep it to ~2^21 at a time)."""


def chunk_o_kernel(A, inputs, case):
    x = kernel_view(inputs, case)
    c, dtype = case.params["chunk"], case.dtype
    t, hv = x["gc"].shape[1], x["gc"].shape[2]
    qc = chunked(per_value_head(x["q"], hv), c)  # [B, NT, C, Hv, K]
    kc = chunked(per_value_head(x["k"], hv), c)
    vc, gcc, h = chunked(x["v_new"], c), chunked(x["gc"], c, edge=True), x["h"]
    b, nt, _, _, dk = qc.shape
    dv = vc.shape[-1]
    causal = CAUSAL(c)
    sc = A.load(scale_of(case))
    parts = []
    for blk in _blocks(nt, b * c * hv * max(dv * dk, c * dk, c * dv)):
        qi = A.load(qc[:, blk][:, :, :, :, None, :])  # [B, nb, C(i), Hv, 1, K]
        inter = A.sum(qi * A.load(h[:, blk][:, :, None]))  # [B, nb, C, Hv, V]
        inter = inter * A.load(gcc[:, blk][..., None]).exp()
        kj = np.swapaxes(kc[:, blk], 2, 3)[:, :, None] * causal[None, None, :, None, :, None]
        qk = A.sum(qi * A.load(kj))  # [B, nb, C(i), Hv, C(j)], exact 0 above the diagonal
        gi, gj = _masked_gc(gcc[:, blk], causal)
        tile = (qk * (A.load(gi) - A.load(gj)).exp()).round_to(dtype)
        nb = qk.shape[1]
        vt = np.moveaxis(vc[:, blk], 2, -1)[:, :, None]  # [B, nb, 1, Hv, V, C(j)]
        intra = A.sum(tile.reshape(b, nb, c, hv, 1, c) * A.load(vt))  # [B, nb, C, Hv, V]
        parts.append(A.either((inter + intra) * sc, inter * sc + intra * sc))
    return {"o": _finish(A, parts, (hv, dv), t)}


# --- gdn_chunk_h --------------------------------------------------------------------------------

CHUNK_H_DOC = """`gdn_chunk_h`: the state across chunks (math.md §1.3, V-major), per chunk n:
h_n = S (stored in T), v_new = u − w @ T(S)ᵀ (stored in T, before the decay), vdec = T(v_new ·
exp(gc_last − gc_i)) (0 past T), S = exp(gc_last) S + vdecᵀ k; outputs h [B, NT, Hv, V, K] (T),
v_new (T) and the final state (f32) (`oracle/gdn_chunked.py`).

Tolerance, by hand (`chunk_h_bound`), since the state crosses chunks: an element-wise interval
grows by ~C·beta per chunk (every state element feeds every other through w and k), exponential
in NT. The kernel's state S' differs from the oracle's S by ε (per value row v, a K-vector).
Two bounds, both carried chunk by chunk, the smaller one used (both hold):

* linear, in the 2-norm of each row: the chunk maps ε to M_n ε, M_n = exp(gc_last) I −
  Σ_i d_i k_i w_iᵀ (d_i = exp(gc_last − gc_i)): the chunk's own state transition, a contraction
  (~Π_t exp(g_t)(I − beta_t k_t k_tᵀ)) up to w's rounding; ρ_n = ‖M_n‖₂ is computed, not
  assumed. Its T roundings may land on either neighbour (T(S') and T(S) one ULP of T apart,
  likewise vdec: a *flip*), charged every chunk at every element: r_{n+1} = ρ_n r_n + ℓ_n, ℓ_n the
  2-norm over the row of Σ_i |k_i| (d_i (Σ_k |w_ik| ulp_T(S[v, k]) + γ_{K+1} (|u_i| + |w_i| |T(S)|))
  + |v_new_i d_i| (exp's error + u) + ulp_T(vdec_i)) + γ_{C+1} (exp(gc_last) |S| + |vdec|ᵀ |k|)
  + exp(gc_last) |S| (exp's error + u). Grows linearly in NT at ~one T ULP per chunk.
* element-wise, with the roundings absorbing small errors: T(S') = T(S) unless [S − E, S + E]
  straddles a midpoint of T (then at most E + one ULP apart), likewise vdec; E carried through
  exactly these steps. Without a flip it stays at f32's level; a flip makes it grow, and the
  linear bound takes over.

The outputs: h_n within `store_bound` of S_n at min(E, r_n); v_new within ‖w_i‖₂ r_n + the
v_new terms above (or the element-wise form); the final state within min(E, r_NT) (f32)."""


def _reach(x: np.ndarray, e: np.ndarray, dtype: str) -> np.ndarray:
    """Bound on |T(x') − T(x)| for x' in [x − e, x + e] (rounding is monotone): 0 unless the
    interval straddles a midpoint of T."""
    c = round_to(x, dtype).astype(np.float64)
    lo = round_to(x - e, dtype).astype(np.float64)
    hi = round_to(x + e, dtype).astype(np.float64)
    return np.maximum(np.abs(hi - c), np.abs(c - lo))


def chunk_h_bound(inputs, exact, case):
    x = kernel_view(inputs, case)
    c, dtype = case.params["chunk"], case.dtype
    t, hv = x["gc"].shape[1], x["gc"].shape[2]
    kc = np.abs(chunked(per_value_head(x["k"], hv), c))  # [B, NT, C, Hv, K]
    wc, uc, gcc = chunked(x["w"], c), chunked(x["u"], c), chunked(x["gc"], c, edge=True)
    aw = np.abs(wc)
    ok, lasts = valid(t, c), last_index(t, c)
    nt, dk = kc.shape[1], kc.shape[-1]
    hs = exact["h"]  # [B, NT, Hv, V, K]: the oracle's states before each chunk
    v_new = chunked(exact["v_new"], c)
    r = np.zeros((hs.shape[0],) + hs.shape[2:4])  # [B, Hv, V]: the linear bound
    e_int = np.zeros(hs.shape[:1] + hs.shape[2:])  # [B, Hv, V, K]: the element-wise bound
    h_err = np.empty(hs.shape)
    vn_err = np.empty(v_new.shape)
    g_k, g_c = gamma(dk + 1), gamma(c + 1)
    for n in range(nt):
        s = hs[:, n]
        hn = round_to(s, dtype).astype(np.float64)
        e_use = np.minimum(e_int, r[..., None])
        h_err[:, n] = e_use
        g_last = gcc[:, n, lasts[n]]  # [B, Hv]
        x_d = g_last[:, None] - gcc[:, n]  # [B, C, Hv]: the exponents of d_i
        d = np.exp(x_d) * ok[n][None, :, None]
        d_rel = EXP_REL + 2.0 * U * np.abs(x_d) + U
        decay = np.exp(g_last)[:, :, None, None]
        decay_err = decay * np.abs(s) * (EXP_REL + 2.0 * U * np.abs(g_last)[:, :, None, None] + U)
        dots = g_k * (np.abs(uc[:, n]) + np.einsum("bihk,bhvk->bihv", aw[:, n], np.abs(hn)))
        vdec = v_new[:, n] * d[..., None]
        vdec_own = np.abs(vdec) * d_rel[..., None]
        accum = g_c * (decay * np.abs(s) + np.einsum("bihv,bihk->bhvk", np.abs(vdec), kc[:, n]))
        # linear: flips charged everywhere, ε through M_n
        flips_h = np.einsum("bihk,bhvk->bihv", aw[:, n], spacing(s, dtype))
        vn_lin = flips_h + dots
        vn_err_lin = vn_lin + np.sqrt(np.sum(wc[:, n] ** 2, axis=-1))[..., None] * \
            r[:, None, :, :]
        vdec_lin = d[..., None] * vn_lin + vdec_own + spacing(np.abs(vdec) + d[..., None]
                                                              * vn_err_lin, dtype)
        local = np.einsum("bihv,bihk->bhvk", vdec_lin, kc[:, n]) + accum + decay_err
        m = decay * np.eye(dk) - np.einsum("bihk,bihl->bhkl", d[..., None] *
                                                   chunked(per_value_head(x["k"], hv), c)[:, n],
                                                   wc[:, n])
        rho = np.linalg.norm(m, ord=2, axis=(-2, -1))  # [B, Hv]
        # element-wise: roundings absorb errors that do not reach a midpoint
        jh = _reach(s, e_use, dtype)
        vn_int = np.einsum("bihk,bhvk->bihv", aw[:, n], jh) + dots
        vn_err[:, n] = np.minimum(vn_err_lin, vn_int)
        jv = _reach(vdec, d[..., None] * vn_int + vdec_own, dtype)
        e_int = decay * e_use + np.einsum("bihv,bihk->bhvk", jv, kc[:, n]) + accum + decay_err
        r = rho[..., None] * r + np.sqrt(np.sum(local ** 2, axis=-1))
    state_err = np.minimum(e_int, r[..., None])
    model = Model()
    return {"h": store_bound(Val(hs, h_err, model), dtype),
            "v_new": store_bound(Val(exact["v_new"], unchunked(vn_err, t), model), dtype),
            "state": store_bound(Val(exact["state"], state_err, model), "f32")}


# --- gdn_chunked --------------------------------------------------------------------------------

CHUNKED_DOC = """`gdn_chunked`: the composition (`oracle/gdn_chunked.py`): q̂ = T(l2norm(q)),
k̂ = T(l2norm(k)) (with `l2norm`), then cumsum, kkt, solve_tril, wy, chunk_h, chunk_o, each on
the stored outputs of the ones before. Same inputs and outputs as `gdn_recurrent` plus `chunk`.
The oracle is that composition, T roundings included; an admissible impl may hold any of its
intermediates in f32 instead (the torch form users write, FLA's fused kernels) and compute in f32
anywhere between.

Tolerance (`chunked_bound`), derived from B = `truth_bound`: a first-order bound on
|any admissible chunked computation − the float64 recurrence| (`oracle/gdn_math.py`: the ground
truth, with q̂, k̂ exact): the composition and the impl are both admissible, so |impl −
composition| <= 2 B (triangle inequality), then T's store.

B: within a chunk, every rounding is a relative error (u_T at each T store that an impl may or
may not make, u and γ_n for f32 arithmetic, exp's error with its argument's: 4u + 2u|x| + the
cumsum's γ_C Σ|g|; q̂ and k̂ within δ_l2 = 4 u_T + γ_K / 2 + 6u, which covers HF's l2norm computed
in T) propagated to first order through the chunk's algebra in absolute values:

    ΔA   = β e (Σ|k_i||k_j|)(2 δ_l2 + γ_K + u_T) + |A| (δe + 3u)
    ΔX   = |X| ΔA |X| + 2 γ_C |X| |I + A| |X| + u_T |X|                 (X = (I + A)^-1)
    Δw   = ΔX |kb| + |X| |kb| (δ_l2 + u_T + δe + 3u + γ_C) + u_T |w|    (u likewise, vb)
    Δv_new_i = Δu_i + Δw_i |S| + |w_i| u_T |S| + γ_{K+1} (|u_i| + |w_i| |S|)
    Δvdec_i  = d_i Δv_new_i + |vdec_i| (u_T + δd_i + u)
    ΔS_n     = Σ_i |k_i| (Δvdec_i + |vdec_i| δ_l2) + γ_{C+1} (γ |S| + |vdec|ᵀ |k|) + γ |S| δγ
    Δo_i     = scale (e^{gc_i} |q_i| ((δ_l2 + u + γ_K) |S| + u_T |S|) + |inter_i| (δg_i + u)
               + Σ_j (ΔM_ij |v_new_j| + |M_ij| (Δv_new_j + u_T |v_new_j|) + γ_C |M_ij| |v_new_j|))
               + 3u scale (|inter| + |M| |v_new|),   ΔM = e |q| |k| (2 δ_l2 + u + γ_K) + |M| (δe + 2u + u_T)

Across chunks, the state error of each value row (a K-vector, rows are independent) in the
2-norm: the exact chunk maps it by M_n = Π_t exp(g_t)(I − β_t k̂_t k̂_tᵀ), whose norm is at most
ρ_n = Π_t exp(g_t) max(1, |1 − β_t ‖k̂_t‖²|) (= exp(gc_last) <= 1 for unit keys and β in [0, 1]:
a contraction), so r_{n+1} = ρ_n r_n + ‖ΔS_n‖₂ (r_0 = 0) and a token i of chunk n also carries
scale ‖q̂_i‖₂ ρ_{n,i} r_n (ρ_{n,i}: the product through token i). The bound therefore grows
linearly in the number of chunks (at gates near 1; the decay shortens the memory otherwise): the
worst case of same-signed roundings, which random roundings (√NT) do not reach. The state's
element error is at most its row's r_NT. Second-order terms (products of two relative errors,
u_T² times the conditioning) are covered by a factor 1 + 1/16 while u_T ‖|X||I + A|‖ < 1/16.
`scripts/gdn_chunked_budget.py` prints the budget a torch impl and the composition use per T up
to 16384 (benchmarks/gdn_chunked_budget.md)."""


def _rel_exp(x, gc_err_a, gc_err_b=0.0):
    """Relative error of an f32 exp(x), x an f32 difference of cumsums each within gc_err."""
    return EXP_REL + 2.0 * U * np.abs(x) + gc_err_a + gc_err_b


def truth_bound(inputs, case, comp: dict | None = None) -> dict:
    """B (module docstring of `gdn_chunked`): {"o": [B, T, Hv, V], "state": [B, Hv, V, K],
    "r": [B, NT + 1, Hv, V]} bounds on |chunked − recurrence| before any store."""
    comp = comp if comp is not None else compose(inputs, case)
    p, dtype = case.params, case.dtype
    c, t = p["chunk"], case.dims["tokens"]
    hv, dk = case.dims["heads_v"], case.dims["dim_k"]
    ut = half_ulp_rel(dtype)
    d_l2 = (4.0 * ut + gamma(dk) / 2.0 + 6.0 * U) if p["l2norm"] else 0.0
    g_k, g_c = gamma(dk), gamma(c)
    qc = chunked(per_value_head(comp["q"], hv), c)  # [B, NT, C, Hv, K]
    kc = chunked(per_value_head(comp["k"], hv), c)
    aq, ak = np.abs(qc), np.abs(kc)
    bc = chunked(comp["beta"], c)
    gcc = chunked(comp["gc"], c, edge=True)
    g_abs = np.cumsum(np.abs(chunked(comp["g"], c)), axis=2)
    gc_err = g_c * g_abs  # [B, NT, C, Hv]
    ok, lasts = valid(t, c), last_index(t, c)
    nt = qc.shape[1]
    s = comp["h_exact"]  # [B, NT, Hv, V, K]
    abs_s = np.abs(s)

    # --- the kkt tile, its inverse, w and u -----------------------------------------------------
    strict = STRICT(c)
    e_strict = decay_tile(gcc, strict)  # [B, NT, C(i), Hv, C(j)]
    diff = gcc[:, :, :, :, None] - np.swapaxes(gcc, 2, 3)[:, :, None, :, :]
    gc_err_j = np.swapaxes(gc_err, 2, 3)[:, :, None, :, :]
    d_e = _rel_exp(diff, gc_err[..., None], gc_err_j)
    kk = np.einsum("bnihk,bnjhk->bnihj", ak, ak)
    a_abs = np.abs(chunked(comp["A"], c))
    d_a = bc[..., None] * e_strict * kk * (2 * d_l2 + g_k + ut) + a_abs * (d_e + 3 * U) * \
        strict[None, None, :, None, :]
    x_t = np.abs(_tiles(comp["Ai"], c))  # [B, NT, Hv, C, C]
    lower = np.eye(c) + np.swapaxes(a_abs, 2, 3)
    d_x = x_t @ np.swapaxes(d_a, 2, 3) @ x_t + 2 * g_c * (x_t @ lower @ x_t) + ut * x_t
    kb, vb = wy_operands(comp["k"], comp["v"], comp["beta"], comp["gc"], dtype)
    kb, vb = np.abs(chunked(kb, c)), np.abs(chunked(vb, c))
    x_c = np.swapaxes(x_t, 2, 3)  # [B, NT, C(i), Hv, C(j)]
    d_xc = np.swapaxes(d_x, 2, 3)
    mix = lambda tile, y: np.einsum("bnihj,bnjhk->bnihk", tile, y)  # noqa: E731
    d_kb = kb * (d_l2 + ut + _rel_exp(gcc, gc_err) + 3 * U)[..., None]
    w, u = chunked(comp["w"], c), chunked(comp["u"], c)
    d_w = mix(d_xc, kb) + mix(x_c, d_kb) + g_c * mix(x_c, kb) + ut * np.abs(w)
    d_u = mix(d_xc, vb) + mix(x_c, vb) * (ut + U) + g_c * mix(x_c, vb) + ut * np.abs(u)

    # --- v_new, vdec, the state's local error ----------------------------------------------------
    ws = lambda a, b: np.einsum("bnihk,bnhvk->bnihv", a, b)  # noqa: E731
    aw = np.abs(w)
    d_vn = d_u + ws(d_w, abs_s) + ut * ws(aw, abs_s) + gamma(dk + 1) * (np.abs(u) + ws(aw, abs_s))
    g_last = np.take_along_axis(gcc, lasts[None, :, None, None], axis=2)[:, :, 0]  # [B, NT, Hv]
    err_last = np.take_along_axis(gc_err, lasts[None, :, None, None], axis=2)[:, :, 0]
    x_d = g_last[:, :, None] - gcc
    d = np.exp(x_d) * ok[None, :, :, None]
    vdec = np.abs(comp["vdec"])
    d_vdec = d[..., None] * d_vn + vdec * (ut + _rel_exp(x_d, gc_err, err_last[:, :, None])
                                           + U)[..., None]
    decay = np.exp(g_last)[..., None, None]  # [B, NT, Hv, 1, 1]
    sk = lambda a, b: np.einsum("bnihv,bnihk->bnhvk", a, b)  # noqa: E731
    local = (sk(d_vdec + d_l2 * vdec, ak) + gamma(c + 1) * (decay * abs_s + sk(vdec, ak))
             + decay * abs_s * _rel_exp(g_last, err_last)[..., None, None])
    ell = np.sqrt(np.sum(local ** 2, axis=-1))  # [B, NT, Hv, V]

    # --- the contraction and the carried state error ------------------------------------------------
    norms = np.sum(kc ** 2, axis=-1)  # [B, NT, C, Hv]
    expand = np.log(np.maximum(1.0, np.abs(1.0 - bc * norms))) * ok[None, :, :, None]
    rho_i = np.exp(gcc + np.cumsum(expand, axis=2))  # [B, NT, C, Hv]: through token i
    rho = np.take_along_axis(rho_i, lasts[None, :, None, None], axis=2)[:, :, 0]  # [B, NT, Hv]
    r = np.zeros((s.shape[0], nt + 1) + s.shape[2:4])
    for n in range(nt):
        r[:, n + 1] = rho[:, n][..., None] * r[:, n] + ell[:, n]

    # --- the output ---------------------------------------------------------------------------------
    scale = scale_of(case)
    causal = CAUSAL(c)
    e_causal = decay_tile(gcc, causal)
    d_e_c = d_e * causal[None, None, :, None, :]
    qk = np.einsum("bnihk,bnjhk->bnihj", aq, ak)
    m_abs = np.abs(np.einsum("bnihk,bnjhk->bnihj", qc, kc) * e_causal)
    d_m = e_causal * qk * (2 * d_l2 + U + g_k) + m_abs * (d_e_c + 2 * U + ut)
    vn = np.abs(chunked(comp["v_new"], c))
    eg = np.exp(gcc)[..., None]
    qs = ws(aq, abs_s)
    inter = eg * np.abs(ws(qc, s))
    d_inter = eg * qs * (d_l2 + U + g_k + ut) + inter * (_rel_exp(gcc, gc_err) + U)[..., None]
    mv = mix(m_abs, vn)
    d_intra = mix(d_m, vn) + mix(m_abs, d_vn + ut * vn) + g_c * mv
    q_norm = np.sqrt(np.sum(qc ** 2, axis=-1))  # [B, NT, C, Hv]
    carried = (q_norm * rho_i)[..., None] * r[:, :nt][:, :, None]
    o_err = scale * (d_inter + d_intra + carried) + 3 * U * scale * (inter + mv)
    second = 1.0 + 1.0 / 16.0
    state = np.broadcast_to(r[:, nt][..., None], s.shape[:1] + s.shape[2:])
    return {"o": second * unchunked(o_err, t), "state": second * state, "r": second * r}


def chunked_bound(inputs, exact, case):
    b = truth_bound(inputs, case)
    model = Model()
    return {"o": store_bound(Val(exact["o"], 2.0 * b["o"], model), case.dtype),
            "state": store_bound(Val(exact["state"], 2.0 * b["state"], model), "f32")}
