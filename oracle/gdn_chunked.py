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
(`oracle/gdn_chunked_bounds.py`), where the recurrence's contraction keeps the bound linear in
the number of chunks instead of exponential (an element-wise interval grows by ~C·β per chunk).
"""

from __future__ import annotations

import numpy as np

from oracle.builders import kernel_view
from oracle.dtypes import round_to
from oracle.gdn_math import L2NORM_EPS, gqa_index, l2norm
from oracle.spec import OpSpec, TensorSpec, register

CHUNKS = (16, 32, 64)
EPS = float(np.float32(L2NORM_EPS))  # the normalisation's eps as a kernel holds it
INITIAL_STATES = ("zero", "given", "large")
DECAYS = ("mixed", "near_one", "near_zero")
BETAS = ("uniform", "near_zero", "near_one")
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
    """Hv a multiple of Hk (GQA), at least one token, the chunk one of CHUNKS, the scale a
    positive finite number or None."""
    d, p = case.dims, case.params
    if d["heads_k"] < 1 or d["heads_v"] % d["heads_k"]:
        raise ValueError(f"{case.op}: heads_v={d['heads_v']} is not a multiple of "
                         f"heads_k={d['heads_k']} (value head h reads q/k head h // (Hv / Hk)): "
                         f"make heads_v a multiple of heads_k")
    if d["tokens"] < 1:
        raise ValueError(f"{case.op}: tokens={d['tokens']}: at least 1")
    if p["chunk"] not in CHUNKS:
        raise ValueError(f"{case.op}: chunk={p['chunk']!r}: one of {', '.join(map(str, CHUNKS))}")
    s = p["scale"]
    if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float))
                          or not np.isfinite(s) or s <= 0):
        raise ValueError(f"{case.op}: scale={s!r} must be a positive finite number, or null "
                         "for K^-0.5")


def scale_of(case) -> float:
    """The output scale as the kernel holds it: f32 of the param, K^-0.5 when it is None."""
    s = case.params["scale"]
    return float(np.float32(case.dims["dim_k"] ** -0.5 if s is None else s))


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
    float64 (row i = e_i − L[i, :i] @ X[:i])."""
    c = a.shape[-1]
    low = np.tril(a, -1)
    x = np.zeros_like(low)
    for i in range(c):
        x[..., i, :] = -np.einsum("...j,...jk->...k", low[..., i, :i], x[..., :i, :])
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


def make_stage_inputs(case, rng) -> dict:
    """The op's inputs: raw GDN inputs drawn by the case layer (`cases/gdn_chunked.py`), then
    the pipeline's stored intermediates up to the stage before this op, so every stage sees what
    its predecessor stores (a strictly lower A, a unit lower-triangular Ai, consistent w, u)."""
    from cases.gdn_chunked import draw_raw  # the case layer draws; the oracle derives

    raw = draw_raw(case, rng)
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


# --- the ops -------------------------------------------------------------------------------------

def _op(name, inputs, outputs, oracle, doc, chain_input, kernel=None, tolerance=None):
    return register(OpSpec(
        name=name, family="gdn", dims=DIMS, inputs=inputs, outputs=outputs, oracle=oracle,
        tolerance=tolerance, kernel=kernel, bytes=_io_bytes, flops=_flops(name), params=PARAMS,
        param_values=PARAM_VALUES, doc=doc, chain_input=chain_input, domain=check_domain,
        make_inputs=make_stage_inputs))


def register_all() -> None:
    """Register the seven ops (the tolerances live in `oracle/gdn_chunked_bounds.py`)."""
    from oracle import gdn_chunked_bounds as bounds

    f32 = dict(role="f32", init="data", adversarial=False)
    _op("gdn_chunk_cumsum", (TensorSpec("g", G, **f32),), (TensorSpec("gc", G, role="f32"),),
        oracle_cumsum, bounds.CUMSUM_DOC, "g", kernel=bounds.cumsum_kernel)
    _op("gdn_kkt", (TensorSpec("k", Q), TensorSpec("beta", G, **f32), TensorSpec("gc", G, **f32)),
        (TensorSpec("A", TILE, role="f32"),), oracle_kkt, bounds.KKT_DOC, "gc",
        kernel=bounds.kkt_kernel)
    _op("gdn_solve_tril", (TensorSpec("A", TILE, **f32),), (TensorSpec("Ai", TILE),),
        oracle_solve, bounds.SOLVE_DOC, "A", tolerance=bounds.solve_bound)
    _op("gdn_wy", (TensorSpec("k", Q), TensorSpec("v", V), TensorSpec("beta", G, **f32),
                   TensorSpec("gc", G, **f32), TensorSpec("Ai", TILE)),
        (TensorSpec("w", VK), TensorSpec("u", V)), oracle_wy, bounds.WY_DOC, "Ai",
        kernel=bounds.wy_kernel)
    _op("gdn_chunk_h", (TensorSpec("k", Q), TensorSpec("w", VK), TensorSpec("u", V),
                        TensorSpec("gc", G, **f32), TensorSpec("h0", STATE, **f32)),
        (TensorSpec("h", STATES), TensorSpec("v_new", V), TensorSpec("state", STATE, role="f32")),
        oracle_chunk_h, bounds.CHUNK_H_DOC, "w", tolerance=bounds.chunk_h_bound)
    _op("gdn_chunk_o", (TensorSpec("q", Q), TensorSpec("k", Q), TensorSpec("v_new", V),
                        TensorSpec("h", STATES), TensorSpec("gc", G, **f32)),
        (TensorSpec("o", V),), oracle_chunk_o, bounds.CHUNK_O_DOC, "v_new",
        kernel=bounds.chunk_o_kernel)
    _op("gdn_chunked", (TensorSpec("q", Q), TensorSpec("k", Q), TensorSpec("v", V),
                        TensorSpec("g", G, **f32), TensorSpec("beta", G, **f32),
                        TensorSpec("h0", STATE, **f32)),
        (TensorSpec("o", V), TensorSpec("state", STATE, role="f32")), oracle_chunked,
        bounds.CHUNKED_DOC, "q", tolerance=bounds.chunked_bound)


register_all()
