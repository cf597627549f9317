"""The chunked GDN pipeline's float64 math (its stages and layouts: `oracle/gdn_chunked.py`'s
docstring): the chunk layout (padding past T, the masks, the decay tile), each stage's oracle on
its stored inputs, and `compose`, every stored intermediate of the pipeline through a stage.
"""

from __future__ import annotations

import numpy as np

from oracle.builders import kernel_view
from oracle.dtypes import round_to
from oracle.gdn import EPS, scale_of
from oracle.gdn_math import gqa_index, l2norm


def n_chunks(d: dict, p: dict) -> int:
    return -(-d["tokens"] // p["chunk"])


# --- chunk layout ------------------------------------------------------------------------------

def chunked(x: np.ndarray, c: int, edge: bool = False) -> np.ndarray:
    """[B, T, ...] -> [B, NT, C, ...], padded past T with zeros, or (`edge`, a chunk-local
    cumsum) with its last value: the cumsum of zero-padded g holds still."""
    x = np.asarray(x, dtype=np.float64)
    b, t = x.shape[:2]
    pad = -t % c
    if pad:
        fill = (np.repeat(x[:, -1:], pad, axis=1) if edge
                else np.zeros((b, pad) + x.shape[2:]))
        x = np.concatenate([x, fill], axis=1)
    return x.reshape((b, -1, c) + x.shape[2:])


def unchunked(x: np.ndarray, t: int) -> np.ndarray:
    """[B, NT, C, ...] -> [B, T, ...]."""
    return x.reshape((x.shape[0], -1) + x.shape[3:])[:, :t]


def per_value_head(x: np.ndarray, heads_v: int) -> np.ndarray:
    """q or k [B, T, Hk, K] -> [B, T, Hv, K] (GQA)."""
    return x[:, :, gqa_index(heads_v, x.shape[2])]


def valid(t: int, c: int) -> np.ndarray:
    """[NT, C] bool: the tokens below T."""
    nt = -(-t // c)
    return (np.arange(nt * c) < t).reshape(nt, c)


def last_index(t: int, c: int) -> np.ndarray:
    """[NT]: the local index of each chunk's last valid token."""
    nt = -(-t // c)
    return np.minimum(c, t - np.arange(nt) * c) - 1


STRICT = lambda c: np.tril(np.ones((c, c)), -1)  # noqa: E731  [i, j]: j < i
CAUSAL = lambda c: np.tril(np.ones((c, c)))  # noqa: E731  [i, j]: j <= i


def decay_tile(gc: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """exp(gc_i − gc_j) [B, NT, C(i), Hv, C(j)] where mask[i, j], else 0, from gc [B, NT, C, Hv]
    (the difference masked before exp: above the diagonal it is >= 0 and may overflow)."""
    diff = gc[:, :, :, :, None] - np.swapaxes(gc, 2, 3)[:, :, None, :, :]
    m = mask[None, None, :, None, :]
    return np.exp(np.where(m > 0, diff, 0.0)) * m


# --- the stage oracles (float64, on the stored inputs) ------------------------------------------

def cumsum_stage(g: np.ndarray, c: int) -> np.ndarray:
    """gc [B, T, Hv]: the chunk-local inclusive cumsum of g."""
    return unchunked(np.cumsum(chunked(g, c), axis=2), g.shape[1])


def kkt_stage(k: np.ndarray, beta: np.ndarray, gc: np.ndarray, c: int) -> np.ndarray:
    """A [B, T, Hv, C]: beta_i (k_i·k_j) exp(gc_i − gc_j) for j < i in the chunk, else 0."""
    t, hv = beta.shape[1], beta.shape[2]
    kc = chunked(per_value_head(k, hv), c)  # [B, NT, C, Hv, K]
    dot = np.einsum("bnihk,bnjhk->bnihj", kc, kc)
    a = chunked(beta, c)[..., None] * dot * decay_tile(chunked(gc, c, edge=True), STRICT(c))
    return unchunked(a, t)


def forward_inverse(a: np.ndarray) -> np.ndarray:
    """(I + L)^-1 for L = the strictly lower part of a [..., C, C], by forward substitution in
    float64 (row i = e_i − L[i, :i] @ X[:i, :i]); the upper part stays exactly 0, as in HF's
    and FLA's substitution (a NaN in L reaches only the entries that read it)."""
    c = a.shape[-1]
    low = np.tril(a, -1)
    x = np.zeros_like(low)
    for i in range(c):
        x[..., i, :i] = -np.einsum("...j,...jk->...k", low[..., i, :i], x[..., :i, :i])
        x[..., i, i] = 1.0
    return x


def solve_stage(a: np.ndarray, c: int) -> np.ndarray:
    """Ai [B, T, Hv, C]: (I + A)^-1 per chunk, row t = n C + i holding row i of chunk n's."""
    t = a.shape[1]
    tiles = np.swapaxes(chunked(a, c), 2, 3)  # [B, NT, Hv, C(i), C(j)]
    return unchunked(np.swapaxes(forward_inverse(tiles), 2, 3), t)


def wy_operands(k, v, beta, gc, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(T(k · beta · exp(gc)) [B, T, Hv, K], T(v · beta) [B, T, Hv, V]): the contract rounds
    both to T before the dots (FLA's `recompute_w_u`)."""
    hv = beta.shape[2]
    kb = per_value_head(k, hv) * (beta * np.exp(gc))[..., None]
    vb = v * beta[..., None]
    return (round_to(kb, dtype).astype(np.float64), round_to(vb, dtype).astype(np.float64))


def wy_stage(k, v, beta, gc, ai, c: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(w [B, T, Hv, K], u [B, T, Hv, V]) = per chunk Ai @ the `wy_operands`."""
    t = beta.shape[1]
    kb, vb = wy_operands(k, v, beta, gc, dtype)
    aic = chunked(ai, c)  # [B, NT, C(i), Hv, C(j)]
    w = np.einsum("bnihj,bnjhk->bnihk", aic, chunked(kb, c))
    u = np.einsum("bnihj,bnjhv->bnihv", aic, chunked(vb, c))
    return unchunked(w, t), unchunked(u, t)


def chunk_h_stage(k, w, u, gc, h0, c: int, dtype: str) -> dict:
    """{"h": [B, NT, Hv, V, K], "v_new": [B, T, Hv, V], "state": [B, Hv, V, K], "vdec":
    [B, NT, C, Hv, V] (stored), "d": exp(gc_last − gc_i) [B, NT, C, Hv]}: the states before each
    chunk and the rest, before their stores (vLLM's `chunk_gated_delta_rule_fwd_h`; V-major)."""
    t, hv = gc.shape[1], gc.shape[2]
    kc = chunked(per_value_head(k, hv), c)
    wc, uc, gcc = chunked(w, c), chunked(u, c), chunked(gc, c, edge=True)
    nt = kc.shape[1]
    ok, lasts = valid(t, c), last_index(t, c)
    s = np.array(h0, dtype=np.float64)
    hs = np.empty((s.shape[0], nt) + s.shape[1:])
    v_new = np.empty(uc.shape)
    vdec = np.empty(uc.shape)
    d = np.empty(gcc.shape)
    for n in range(nt):
        hs[:, n] = s
        hn = round_to(s, dtype).astype(np.float64)
        v_new[:, n] = uc[:, n] - np.einsum("bihk,bhvk->bihv", wc[:, n], hn)
        g_last = gcc[:, n, lasts[n]]  # [B, Hv]
        d[:, n] = np.exp(g_last[:, None] - gcc[:, n]) * ok[n][None, :, None]
        vdec[:, n] = round_to(v_new[:, n] * d[:, n][..., None], dtype).astype(np.float64)
        s = s * np.exp(g_last)[:, :, None, None] + np.einsum("bihv,bihk->bhvk", vdec[:, n],
                                                             kc[:, n])
    return {"h": hs, "v_new": unchunked(v_new, t), "state": s, "vdec": vdec, "d": d}


def chunk_o_stage(q, k, v_new, h, gc, c: int, scale: float, dtype: str) -> np.ndarray:
    """o [B, T, Hv, V] before its store: the seed kernel's formula (`oracle/gdn_chunked.py`'s
    docstring), with h the stored (T) states and the A tile rounded to T."""
    t, hv = gc.shape[1], gc.shape[2]
    qc, kc = chunked(per_value_head(q, hv), c), chunked(per_value_head(k, hv), c)
    gcc = chunked(gc, c, edge=True)
    inter = np.einsum("bnihk,bnhvk->bnihv", qc, h) * np.exp(gcc)[..., None]
    tile = np.einsum("bnihk,bnjhk->bnihj", qc, kc) * decay_tile(gcc, CAUSAL(c))
    tile = round_to(tile, dtype).astype(np.float64)
    intra = np.einsum("bnihj,bnjhv->bnihv", tile, chunked(v_new, c))
    return unchunked(scale * (inter + intra), t)


def normalised(q, k, case) -> tuple[np.ndarray, np.ndarray]:
    """(q̂, k̂) as the pipeline's later stages read them: T(l2norm(x)) with `l2norm`, else as
    given."""
    if not case.params["l2norm"]:
        return q, k
    return tuple(round_to(l2norm(x, EPS), case.dtype).astype(np.float64) for x in (q, k))


def compose(inputs: dict, case, upto: str = "gdn_chunk_o") -> dict:
    """Every stored intermediate of the pipeline on `inputs` (q, k, v, g, beta, h0 as stored),
    float64, through stage `upto`: q̂, k̂ and each stage's outputs rounded to their dtypes, plus
    "o_exact" and "state_exact" (the last stage's pre-store values) and chunk_h's internals."""
    x = kernel_view(inputs, case)
    c, dtype, t = case.params["chunk"], case.dtype, case.dims["tokens"]
    store = lambda a, dt: round_to(a, dt).astype(np.float64)  # noqa: E731
    out = {"v": x["v"], "beta": x["beta"], "h0": x["h0"], "g": x["g"]}
    out["q"], out["k"] = normalised(x["q"], x["k"], case)
    out["gc"] = store(cumsum_stage(x["g"], c), "f32")
    if upto == "gdn_chunk_cumsum":
        return out
    out["A"] = store(kkt_stage(out["k"], x["beta"], out["gc"], c), "f32")
    if upto == "gdn_kkt":
        return out
    out["Ai"] = store(solve_stage(out["A"], c), dtype)
    if upto == "gdn_solve_tril":
        return out
    w, u = wy_stage(out["k"], x["v"], x["beta"], out["gc"], out["Ai"], c, dtype)
    out["w"], out["u"] = store(w, dtype), store(u, dtype)
    if upto == "gdn_wy":
        return out
    hs = chunk_h_stage(out["k"], out["w"], out["u"], out["gc"], x["h0"], c, dtype)
    out["h"], out["v_new"] = store(hs["h"], dtype), store(hs["v_new"], dtype)
    out["state_exact"], out["vdec"], out["d"] = hs["state"], hs["vdec"], hs["d"]
    out["h_exact"] = hs["h"]
    if upto == "gdn_chunk_h":
        return out
    out["o_exact"] = chunk_o_stage(out["q"], out["k"], out["v_new"], out["h"], out["gc"], c,
                                   scale_of(case), dtype)
    assert out["o_exact"].shape[1] == t
    return out
