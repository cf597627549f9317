"""Gated DeltaNet's chunked pipeline (issue 29; FLA's, as vLLM's `chunk_gated_delta_rule_fwd`),
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
composition is the recurrence (in float64 they agree to ~1e-16); with the T roundings it is not.

Params: `chunk`; `scale` (None: K^-0.5, held in f32); `l2norm` (eps = f32(1e-6)); and, shared
with `oracle/gdn.py`, `initial_state` (zero, given N(0, 1), large N(0, 1000²)), `decay` and
`beta` (how g and beta are drawn: `cases/gdn_chunked.py`); `ftz`.

Tolerances (derived; each stage's docstring says how): the single-chunk stages with a kernel model
in `oracle/numerics.py`'s interval arithmetic (`gdn_chunk_cumsum`, `gdn_kkt`, `gdn_wy`,
`gdn_chunk_o`); `gdn_solve_tril` from the classical bound of a triangular inverse; `gdn_chunk_h`
and `gdn_chunked`, whose state crosses chunks, by hand in the 2-norm of each state row
(`chunk_h_bound`, `truth_bound`), where the recurrence's contraction keeps the bound linear in
the number of chunks instead of exponential (an element-wise interval grows by ~C·β per chunk).

Where: this module holds the ops (params, shapes, inputs, oracles, work models, registration);
the chunk layout and the float64 stages are `oracle/gdn_chunked_math.py`'s, the stages'
tolerances `oracle/gdn_chunked_stage_bounds.py`'s and `gdn_chunked`'s
`oracle/gdn_chunked_truth_bound.py`'s.
"""

from __future__ import annotations

import numpy as np

from oracle import gdn
from oracle.builders import kernel_view
from oracle.dtypes import round_to
from oracle.gdn import BETAS, DECAYS, INITIAL_STATES, scale_of
from oracle.gdn_chunked_math import (chunk_h_stage, chunk_o_stage, compose, cumsum_stage,
                                     kkt_stage, n_chunks, solve_stage, wy_stage)
from oracle.gdn_chunked_stage_bounds import (CHUNK_H_DOC, CHUNK_O_DOC, CUMSUM_DOC, KKT_DOC,
                                             SOLVE_DOC, WY_DOC, chunk_h_bound, chunk_o_kernel,
                                             cumsum_kernel, kkt_kernel, solve_bound, wy_kernel)
from oracle.gdn_chunked_truth_bound import CHUNKED_DOC, chunked_bound
from oracle.spec import OpSpec, TensorSpec, register

CHUNKS = (16, 32, 64)
PARAMS = {"chunk": 64, "scale": None, "l2norm": True, "initial_state": "zero", "decay": "mixed",
          "beta": "uniform", "ftz": 0}
PARAM_VALUES = {"chunk": CHUNKS, "l2norm": (True, False), "initial_state": INITIAL_STATES,
                "decay": DECAYS, "beta": BETAS}
DIMS = ("batch", "tokens", "heads_k", "heads_v", "dim_k", "dim_v")


# --- shapes, params, domain --------------------------------------------------------------------

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
