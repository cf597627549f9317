"""Gated DeltaNet's chunked pipeline (issue 29; `reference/math.md` §1.2-1.4, `ops.md` §2.9),
stage by stage, each stage its own op whose oracle takes the previous stage's *stored* outputs,
so that a wrong stage is named, and `gdn_chunked`, their composition. The ground truth they are
measured against is the float64 recurrence (`oracle/gdn_math.py`).

Layouts (mlx-native / vLLM, state V-major): q, k [B, T, Hk, K]; v, o [B, T, Hv, V]; g (log-decay
<= 0), beta [B, T, Hv]; states [B, Hv, V, K]. Value head h reads q/k head h // (Hv / Hk).
Chunk size C (param `chunk`: 16, 32, 64), NT = ceil(T / C); T need not be a multiple of C: each
stage pads with zeros inside (q, k, v, beta and g zero past T, so the chunk-local cumsum holds
its last value there). i, j are token indices local to one chunk; `last` its last valid token.

    gdn_chunk_cumsum  g -> gc (f32)           gc_i = Σ_{m<=i} g_m, restarting every chunk
    gdn_kkt           k, beta, gc -> A (f32)  A[t, h, j] = beta_i (k_i·k_j) exp(gc_i − gc_j)
                                              for j < i in t's chunk (t = n C + i), else 0
    gdn_solve_tril    A -> Ai (T)             (I + A)^-1 per chunk (A's strictly lower part)
    gdn_wy            k, v, beta, gc, Ai      w = Ai @ T(k · beta · exp(gc))   [B, T, Hv, K] (T)
                      -> w, u                 u = Ai @ T(v · beta)             [B, T, Hv, V] (T)
    gdn_chunk_h       k, w, u, gc, h0         per chunk n, S (f32) starting at h0:
                      -> h, v_new, state        h_n   = S                       stored in T
                                                v_new = u − w @ T(S)ᵀ           stored in T
                                                vdec  = T(v_new · exp(gc_last − gc_i))
                                                S     = exp(gc_last) S + vdecᵀ k
                                              h [B, NT, Hv, V, K]: the state BEFORE each chunk;
                                              state: the final S (f32)
    gdn_chunk_o       q, k, v_new, h, gc -> o the seed kernel (mlx-native chunk_o, FLA
                                              chunk_fwd_kernel_o), per chunk n:
              o_i = scale·exp(gc_i)(h_n q_i) + scale·Σ_{j<=i} T(exp(gc_i − gc_j) q_i·k_j) v_new_j
                                              the causal mask INCLUDES the diagonal; the A tile
                                              rounded to T before the closing dot; the scale
                                              applied after the dots (held in f32)
    gdn_chunked       q, k, v, g, beta, h0    the composition: q̂ = T(l2norm(q)), k̂ = T(l2norm(k))
                      -> o, state             (with `l2norm`), then the stages above, each on
                                              the stored outputs of the ones before

Dtypes: q, k, v, o, Ai, w, u, h and v_new in T; g, gc, A, beta and every state f32. In the
oracles, a value "stored" is rounded to its dtype, everything between the stores is float64, and
each output is returned before its store (`OpSpec.reference` rounds it). In exact arithmetic the
composition is the recurrence (math.md checked it to 1e-16); with the T roundings it is not.

Params: `chunk`; `scale` (None: K^-0.5, held in f32); `l2norm` (eps = f32(1e-6)); and, shared
with `oracle/gdn.py`, `initial_state` (zero, given N(0, 1), large N(0, 1000²)), `decay` and
`beta` (how g and beta are drawn: `cases/gdn_chunked.py`); `ftz`.

Tolerances (derived; each stage's docstring says how): the single-chunk stages with a kernel model
in `oracle/numerics.py`'s interval arithmetic (`gdn_chunk_cumsum`, `gdn_kkt`, `gdn_wy`,
`gdn_chunk_o`); `gdn_solve_tril` from the classical bound of a triangular inverse; `gdn_chunk_h`
and `gdn_chunked`, whose state crosses chunks, by hand in the 2-norm of each state row
(`oracle/gdn_chunked_py`), where the recurrence's contraction keeps the bound linear in
the number of chunks instead of exponential (an element-wise interval grows by ~C·β per chunk).
"""

from __future__ import annotations

import numpy as np

from oracle import gdn
from oracle.builders import kernel_view
from oracle.dtypes import eps as dtype_eps
from oracle.dtypes import round_to, spacing
from oracle.gdn_math import L2NORM_EPS, gqa_index, l2norm, recurrent
from oracle.numerics import SUB32, TINY32, U, Model, Val, store_bound
from oracle.gdn import BETAS, DECAYS, EPS, INITIAL_STATES, scale_of
from oracle.spec import OpSpec, TensorSpec, register

CHUNKS = (16, 32, 64)
PARAMS = {"chunk": 64, "scale": None, "l2norm": True, "initial_state": "zero", "decay": "mixed",
          "beta": "uniform", "ftz": 0}
PARAM_VALUES = {"chunk": CHUNKS, "l2norm": (True, False), "initial_state": INITIAL_STATES,
                "decay": DECAYS, "beta": BETAS}
DIMS = ("batch", "tokens", "heads_k", "heads_v", "dim_k", "dim_v")


# --- shapes, params, domain --------------------------------------------------------------------

def n_chunks(d: dict, p: dict) -> int:
    return -(-d["tokens"] // p["chunk"])


Q = lambda d: (d["batch"], d["tokens"], d["heads_k"], d["dim_k"])  # noqa: E731
V = lambda d: (d["batch"], d["tokens"], d["heads_v"], d["dim_v"])  # noqa: E731
VK = lambda d: (d["batch"], d["tokens"], d["heads_v"], d["dim_k"])  # noqa: E731
G = lambda d: (d["batch"], d["tokens"], d["heads_v"])  # noqa: E731
TILE = lambda d, p: (d["batch"], d["tokens"], d["heads_v"], p["chunk"])  # noqa: E731
STATE = lambda d: (d["batch"], d["heads_v"], d["dim_v"], d["dim_k"])  # noqa: E731
STATES = lambda d, p: (d["batch"], n_chunks(d, p), d["heads_v"], d["dim_v"],  # noqa: E731
                       d["dim_k"])


def check_domain(case) -> None:
    """`oracle.gdn.check_domain` (GQA heads, the scale), at least one token, the chunk one of
    CHUNKS."""
    gdn.check_domain(case)
    if case.dims["tokens"] < 1:
        raise ValueError(f"{case.op}: tokens={case.dims['tokens']}: at least 1")
    chunk = case.params["chunk"]
    if chunk not in CHUNKS:
        raise ValueError(f"{case.op}: chunk={chunk!r}: one of {', '.join(map(str, CHUNKS))}")


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
    chunk and the rest, before their stores (math.md §1.3; V-major state)."""
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
    """o [B, T, Hv, V] before its store: the seed kernel's formula (module docstring), with h
    the stored (T) states and the A tile rounded to T."""
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


# --- the ops' oracles ---------------------------------------------------------------------------

def _x(inputs, case):
    return kernel_view(inputs, case)


def oracle_cumsum(inputs, case):
    return {"gc": cumsum_stage(_x(inputs, case)["g"], case.params["chunk"])}


def oracle_kkt(inputs, case):
    x = _x(inputs, case)
    return {"A": kkt_stage(x["k"], x["beta"], x["gc"], case.params["chunk"])}


def oracle_solve(inputs, case):
    return {"Ai": solve_stage(_x(inputs, case)["A"], case.params["chunk"])}


def oracle_wy(inputs, case):
    x = _x(inputs, case)
    w, u = wy_stage(x["k"], x["v"], x["beta"], x["gc"], x["Ai"], case.params["chunk"],
                    case.dtype)
    return {"w": w, "u": u}


def oracle_chunk_h(inputs, case):
    x = _x(inputs, case)
    got = chunk_h_stage(x["k"], x["w"], x["u"], x["gc"], x["h0"], case.params["chunk"],
                        case.dtype)
    return {"h": got["h"], "v_new": got["v_new"], "state": got["state"]}


def oracle_chunk_o(inputs, case):
    x = _x(inputs, case)
    return {"o": chunk_o_stage(x["q"], x["k"], x["v_new"], x["h"], x["gc"],
                               case.params["chunk"], scale_of(case), case.dtype)}


def oracle_chunked(inputs, case):
    got = compose(inputs, case)
    return {"o": got["o_exact"], "state": got["state_exact"]}


# --- inputs: each stage's are the pipeline's stored intermediates -------------------------------

RAW = ("q", "k", "v", "g", "beta", "h0")


# The raw inputs every stage's inputs derive from, drawn by the case layer (`cases/gdn.py`'s
# inits: gdn_qk for q and k, the distribution's data for v, the decay, beta and state inits)
RAW_INPUTS = (TensorSpec("q", Q, init="gdn_qk"),
              TensorSpec("k", Q, init="gdn_qk"),
              TensorSpec("v", V, init="data"),
              TensorSpec("g", G, role="f32", init="gdn_log_decay"),
              TensorSpec("beta", G, role="f32", init="gdn_beta"),
              TensorSpec("h0", STATE, role="f32", init="gdn_state"))


def make_stage_inputs(case, raw: dict) -> dict:
    """The op's inputs from the raw GDN inputs (`RAW_INPUTS`, drawn and stored by the case
    layer): the pipeline's stored intermediates up to the stage before this op, so every stage
    sees what its predecessor stores (a strictly lower A, a unit lower-triangular Ai,
    consistent w, u)."""
    raw = {name: np.asarray(value, dtype=np.float64) for name, value in raw.items()}
    spec = case.spec
    names = [t.name for t in spec.inputs]
    if set(names) <= set(RAW):
        return {n: raw[n] for n in names}
    before = PREVIOUS[case.op]
    stored = compose(_stored(raw, case), case, upto=before)
    return {n: stored[n] for n in names}


def _stored(raw: dict, case) -> dict:
    """The raw inputs rounded to their dtypes (q, k, v in T; g, beta, h0 f32)."""
    out = {}
    for name, value in raw.items():
        out[name] = round_to(value, case.dtype if name in ("q", "k", "v") else "f32")
    return out


PREVIOUS = {"gdn_kkt": "gdn_chunk_cumsum", "gdn_solve_tril": "gdn_kkt", "gdn_wy": "gdn_solve_tril",
            "gdn_chunk_h": "gdn_wy", "gdn_chunk_o": "gdn_chunk_h"}


# --- work models -------------------------------------------------------------------------------

def _bhv(case) -> int:
    d = case.dims
    return d["batch"] * d["heads_v"]


def _flops(op: str):
    def flops(case) -> int:
        d, c = case.dims, case.params["chunk"]
        t, k, v = d["tokens"], d["dim_k"], d["dim_v"]
        per = {"gdn_chunk_cumsum": t,
               "gdn_kkt": 2 * t * c * k,
               "gdn_solve_tril": t * c * c // 3,
               "gdn_wy": 2 * t * c * (k + v),
               "gdn_chunk_h": 4 * t * k * v,
               "gdn_chunk_o": 2 * t * (k * v + c * k + c * v)}
        total = sum(per.values()) if op == "gdn_chunked" else per[op]
        return int(_bhv(case) * total)
    return flops


def _io_bytes(case) -> int:
    return case.spec.io_bytes(case)


# === the tolerances =====================================================================
#
# The tolerances of the chunked GDN pipeline (`oracle/gdn_chunked.py`), each derived, each
# stage's docstring (below, also the op's `doc`) saying how. Notation: u = 2^-24 (f32's unit
# roundoff), u_T half an ULP of T relative (eps(T) / 2: 2^-9 bf16, 2^-11 f16, 2^-24 f32),
# γ_n = n u / (1 − n u) (Higham's bound of an n-term f32 sum or dot product, any order, relative to
# the sum of the magnitudes), and "exp" costs its backend's ULPs (`oracle.numerics`; 2 ULP = 4u
# relative) plus the rounding of its argument.

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


# --- gdn_chunked --------------------------------------------------------------------------------

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
(ops.md §2.9: 1e-2) that is the loosest acceptable. So (Higham & Mary, "A new approach to
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
    """λ with N·2·exp(−λ²/2) = failure: Hoeffding over N outputs (module docstring)."""
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
    [B, Hv, V, K]): Σ_{n+1} = M_n Σ_n M_nᵀ + L_n per value row, L_n = cols diag(weights) colsᵀ +
    diag; o_i's proxy m_iᵀ (Σ_n + diag(h_round)) m_i (h's T rounding, read by the chunk)."""
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
    carried, state2 = _carried_covariance(cols, top(weights), top(diag), m_chunk, m_q,
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
    # Σ_m a_m δ_m (module docstring); L_n = Σ_m b_m² a_m a_mᵀ per row
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
    if np.prod(s.shape) * dk * (2 * dk + cols.shape[-1]) <= COVARIANCE_WORK:
        carried, state2 = _carried_covariance(cols, weights, diag, m_chunk, m_q, sq(tq(np.sqrt(s2))))
    else:
        carried, state2 = _carried_shared(cols, weights, diag, m_chunk, m_q, sq(tq(np.sqrt(s2))))

    # --- the output -----------------------------------------------------------------------------
    pm = np.einsum("bnihl,bnlhj->bnihj", m, x)  # P = M X
    qk = np.einsum("bnihk,bnjhk->bnihj", np.abs(qc), np.abs(kc))
    b_m = (tq(m) + e_causal * qk * (U + g_k)
           + np.abs(m) * (d_e * causal[None, None, :, None, :] + 2 * U))
    eg = np.exp(gcc)[..., None]
    inter = eg * np.abs(ws(qc, s))
    f32_inter = eg * g_k * ws(np.abs(qc), np.abs(s)) + inter * (_rel_exp(gcc, gc_err) + U)[..., None]
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


# --- the ops -------------------------------------------------------------------------------------

def _op(name, inputs, outputs, oracle, doc, chain_input, kernel=None, tolerance=None):
    return register(OpSpec(
        name=name, family="gdn", dims=DIMS, inputs=inputs, outputs=outputs, oracle=oracle,
        tolerance=tolerance, kernel=kernel, bytes=_io_bytes, flops=_flops(name), params=PARAMS,
        param_values=PARAM_VALUES, doc=doc, chain_input=chain_input, domain=check_domain,
        make_inputs=make_stage_inputs, raw_inputs=RAW_INPUTS,
        # an infinite input meets others of both signs in the dots and the solve: whether an
        # output ends ±inf or NaN depends on the order of the additions
        inf_may_be_nan=True))


def register_all() -> None:
    """Register the seven ops."""
    f32 = dict(role="f32", init="data", adversarial=False)
    _op("gdn_chunk_cumsum", (TensorSpec("g", G, **f32),), (TensorSpec("gc", G, role="f32"),),
        oracle_cumsum, CUMSUM_DOC, "g", kernel=cumsum_kernel)
    _op("gdn_kkt", (TensorSpec("k", Q), TensorSpec("beta", G, **f32), TensorSpec("gc", G, **f32)),
        (TensorSpec("A", TILE, role="f32"),), oracle_kkt, KKT_DOC, "gc",
        kernel=kkt_kernel)
    _op("gdn_solve_tril", (TensorSpec("A", TILE, **f32),), (TensorSpec("Ai", TILE),),
        oracle_solve, SOLVE_DOC, "A", tolerance=solve_bound)
    _op("gdn_wy", (TensorSpec("k", Q), TensorSpec("v", V), TensorSpec("beta", G, **f32),
                   TensorSpec("gc", G, **f32), TensorSpec("Ai", TILE)),
        (TensorSpec("w", VK), TensorSpec("u", V)), oracle_wy, WY_DOC, "Ai",
        kernel=wy_kernel)
    _op("gdn_chunk_h", (TensorSpec("k", Q), TensorSpec("w", VK), TensorSpec("u", V),
                        TensorSpec("gc", G, **f32), TensorSpec("h0", STATE, **f32)),
        (TensorSpec("h", STATES), TensorSpec("v_new", V), TensorSpec("state", STATE, role="f32")),
        oracle_chunk_h, CHUNK_H_DOC, "w", tolerance=chunk_h_bound)
    _op("gdn_chunk_o", (TensorSpec("q", Q), TensorSpec("k", Q), TensorSpec("v_new", V),
                        TensorSpec("h", STATES), TensorSpec("gc", G, **f32)),
        (TensorSpec("o", V),), oracle_chunk_o, CHUNK_O_DOC, "v_new",
        kernel=chunk_o_kernel)
    _op("gdn_chunked", (TensorSpec("q", Q), TensorSpec("k", Q), TensorSpec("v", V),
                        TensorSpec("g", G, **f32), TensorSpec("beta", G, **f32),
                        TensorSpec("h0", STATE, **f32)),
        (TensorSpec("o", V), TensorSpec("state", STATE, role="f32")), oracle_chunked,
        CHUNKED_DOC, "q", tolerance=chunked_bound)


register_all()
