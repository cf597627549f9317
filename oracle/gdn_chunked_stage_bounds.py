"""The tolerances of the chunked GDN pipeline's stages (`oracle/gdn_chunked.py` registers the
ops), each derived, each stage's doc (`*_DOC`, also the op's `doc`) saying how: the kernel
models of `gdn_chunk_cumsum`, `gdn_kkt`, `gdn_wy` and `gdn_chunk_o`, the by-hand bounds of
`gdn_solve_tril` and `gdn_chunk_h`. The composition's: `oracle/gdn_chunked_truth_bound.py`.

Notation: u = 2^-24 (f32's unit roundoff), u_T half an ULP of T relative (eps(T) / 2: 2^-9
bf16, 2^-11 f16, 2^-24 f32), γ_n = n u / (1 − n u) (Higham's bound of an n-term f32 sum or dot
product, any order, relative to the sum of the magnitudes), and "exp" costs its backend's ULPs
(`oracle.numerics`; 2 ULP = 4u relative) plus the rounding of its argument.
"""

from __future__ import annotations

import numpy as np

from oracle.builders import kernel_view
from oracle.dtypes import eps as dtype_eps
from oracle.dtypes import round_to, spacing
from oracle.gdn import scale_of
from oracle.gdn_chunked_math import (CAUSAL, STRICT, chunked, forward_inverse, last_index,
                                     per_value_head, unchunked, valid)
from oracle.numerics import SUB32, TINY32, U, Model, Val, store_bound

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
element-wise: the conditioning of (I + A) is in the bound, not assumed; plus 2C subnormal
half-spacings (2^-150; 2^-126 under ftz, a flushed result) per row, carried by |X|. Then T's
rounding at the store (`store_bound`). Tensor-float-32 merge dots (FLA's default on Ampere and later) are not
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
    # each of a row's 2C operations may also err by a subnormal's half spacing (or flush a
    # result below 2^-126 under ftz), carried by the later rows as the relative errors are
    sub = TINY32 if case.params.get("ftz") else SUB32
    err = 2.0 * gamma(c) * (x @ lower @ x) + 2 * c * sub * x.sum(axis=-1, keepdims=True)
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
        # [B, nb, 1, Hv, 1, C]
        per_j = lambda a: np.swapaxes(a, 2, 3)[:, :, None, :, None, :]  # noqa: E731
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

CHUNK_H_DOC = """`gdn_chunk_h`: the state across chunks (vLLM's `chunk_gated_delta_rule_fwd_h`,
V-major), per chunk n:
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
    # every f32 operation may also err by a subnormal's half spacing (a flush under ftz): per
    # chunk, a v_new element sees 2K + 2 of them, a state element 2C + 2
    sub = TINY32 if case.params.get("ftz") else SUB32
    sub_v, sub_s = (2 * dk + 2) * sub, (2 * c + 2) * sub
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
        dots = g_k * (np.abs(uc[:, n]) + np.einsum("bihk,bhvk->bihv", aw[:, n], np.abs(hn))) \
            + sub_v
        vdec = v_new[:, n] * d[..., None]
        vdec_own = np.abs(vdec) * d_rel[..., None]
        accum = g_c * (decay * np.abs(s) + np.einsum("bihv,bihk->bhvk", np.abs(vdec), kc[:, n])) \
            + sub_s
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
        finite = np.isfinite(m).all(axis=(-2, -1))  # a non-finite map: no bound (SVD fails)
        rho = np.where(finite, np.linalg.norm(np.where(finite[..., None, None], m, 0.0), ord=2,
                                              axis=(-2, -1)), np.inf)  # [B, Hv]
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
