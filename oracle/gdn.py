"""Gated DeltaNet, the recurrent form and the decode step (issue 29; FLA's naive recurrence, the
seeds' `src/ffai/gated_delta*.rs` in metaltile-std). The float64 recurrence is
`oracle/gdn_math.py`; this module wraps it as ops.

Layouts (mlx-native / vLLM; `gdn_math`): q, k [B, T, Hk, K]; v, o [B, T, Hv, V]; g (the
log-decay, <= 0) and beta [B, T, Hv]; states [B, Hv, V, K] (V-major). Value head h reads q/k
head h // (Hv / Hk) (GQA; Hv % Hk == 0, checked at case load). Per (b, h), S [V, K]:

    S = exp(g_t) S;   u = beta_t (v_t − S k_t);   S = S + u k_tᵀ;   o_t = S (scale q_t)

Ops (dtypes: q, k, v, o in T, the case dtype; g, beta and every state f32):

* `gdn_recurrent`: q, k, v, g, beta, h0 -> o, state (the final state). FLA's
  `naive_recurrent_gated_delta_rule`: the ground truth of the chunked pipeline
  (`oracle/gdn_chunked.py`).
* `gdn_step`: one token, the decode kernel: q, k [B, Hk, K], v [B, Hv, V], g, beta [B, Hv],
  state_in [B, Hv, V, K] -> o [B, Hv, V], state_out (a plain output: an impl that updates in
  place writes it as a copy).
* `gdn_step_prep`: metaltile's `mt_gated_delta_prep_step` (`gated_delta_prep.rs`): conv_out
  [B, 2·Hk·K + Hv·V] (q | k | v slabs, T), q_norm_weight, k_norm_weight [K] (T), A_log,
  dt_bias [Hv] (f32), a_raw, b_raw [B, Hv] (T), state_in -> o, state_out. Per Hk head
  q̂ = q·rsqrt(mean(q²) + 1e-6)·q_norm_weight (an RMS norm, not L2; the weights fold the scale,
  so there is no scale), k̂ likewise; the log-decay g = −exp(A_log)·softplus(a_raw + dt_bias)
  (`gdn_math.gate`, softplus unclamped), beta = sigmoid(b_raw); then one step of the recurrence.

Params: `scale` (None: K^-0.5; held in f32 as the kernel holds it), `l2norm` (True: q and k are
first x·rsqrt(Σx² + eps), eps = f32(1e-6), FLA's `use_qk_l2norm_in_kernel`), `initial_state`
("zero": h0 all zero; "given": h0 ~ N(0, 1); "large": h0 ~ N(0, 1000²)), and the case
distribution params of `cases/gdn.py` (`decay`, `beta`), which only choose how inputs are
drawn. `ftz`: the kernel reads f32 subnormals as 0 and may flush its subnormal results.

Rounding points (the contract): inputs as stored; q̂, k̂, exp(g), every intermediate and the
state in f32 registers (never rounded to T); the state stored in f32; o rounded to T once, at the
store. The oracle is the float64 recurrence on the stored inputs; the store roundings are
`OpSpec.reference`'s.

Tolerance of `gdn_step` and `gdn_step_prep`: derived from the admissible kernel (`step_kernel`,
`prep_kernel`) in `oracle/numerics.py`'s interval arithmetic, so `tests/test_bounds_corners.py`
covers them: the normalisation (a K-term sum, the add of eps, rsqrt's ULPs, a product), exp's
ULPs on the decay, the decay product, the K-term dot S k in the impl's declared order, the
subtraction and the beta product, the rank-1 update's product and sum, the K-term output dot
with the scale applied to q first or to the dot (either form); the prep's mean (a sum and a
divide), the gate's softplus (exp, log, add), exp(A_log) and sigmoid (exp, add, divide).

Tolerance of `gdn_recurrent`: by hand (`recurrent_bound`), since the interval model cannot
express the recurrence: an element-wise interval loses that the update is a contraction and
grows by ~(1 + beta |k|·‖k‖₁) per token (~1.6^T at K = 128), vacuous within a hundred tokens.
The bound instead follows each row s of the state (a K-vector, rows are independent) in the
2-norm. The exact step is affine in s:

    s_t = M_t s_{t-1} + beta_t v_t k̂_t,   M_t = d_t (I − beta_t k̂_t k̂_tᵀ),   d_t = exp(g_t)

and ‖M_t‖₂ = d_t · max(1, |1 − beta_t ‖k̂_t‖²|) =: m_t. With L2-normalised keys (‖k̂‖ < 1) and
beta in [0, 1], m_t = d_t <= 1: the recurrence contracts, an error made at token j reaches token
t scaled by Π_{j<i<=t} m_i <= 1. (Unnormalised keys with beta ‖k‖² > 2 expand: m_t > 1 is the
problem's own conditioning, and the bound grows with it, as it must.) The kernel's state s'_t
differs from s_t by E_t <= m_t E_{t-1} + (the step's own roundings at a state of norm
‖s_{t-1}‖ + E_{t-1}), all in f32 with u = 2^-24 and γ_n = n u / (1 − n u):

    normalisation  k', q' within ρ_n = (1 − γ_{K+1})^-½ (1 + r_rsqrt)(1 + u) − 1 of k̂, q̂
                   element-wise (0 without l2norm)
    decay          s1 = d' s: d' within r_exp of d, one product: α = (1 + r_exp)(1 + u) − 1
    S k            the dot of K terms, any order: γ_K ‖s1‖ ‖k'‖, and ‖s1‖ ρ_n ‖k̂‖ from k'
    beta (v − kv)  two roundings, γ_2 of |v| + ‖s1‖ ‖k̂‖
    s1 + u k'      a product and a sum per element: u (‖s1‖ + 2|u| ‖k'‖) in the 2-norm, and the
                   errors of u and k' carried by the other factor

(r_f: the impl's ULPs of function f times 2^-23, `oracle.numerics.BACKEND_ULPS`; every product,
sum and function may also be off by 2^-150 in the subnormal range, or flush there under `ftz`:
charged per operation.) The state's element error is at most its row's E_T; the output's is
scale (‖s_t‖ ρ_n ‖q̂‖ + E_t ‖q'‖ + γ_{K+1} (‖s_t‖ + E_t) ‖q'‖) before the store, then T's
rounding (`oracle.numerics.store_bound`). Summed over tokens the bound grows linearly in T (at
d = 1) and in K: the worst case of T·K same-signed roundings, which random rounding (√(T K))
does not reach.

Measured (CPU, the gate cases): the torch and MLX f32 impls use 0.3-15 % of it; the worst
admissible kernels of `recurrent_kernel` (each rounding off by its whole charge, the same way
every token) up to 55 % at K = 16, 7-25 % at K = 128; bf16 and f16 outputs are dominated by the
store's rounding (budget up to 1, the half-ULP floor). A state stored in bf16 between tokens
exceeds it > 10x; a decay applied after the update, or beta on k instead of the delta, by
10-10^5 (`tests/test_gdn.py`, `tests/mutants.py`). Against the seed's tolerances [5e-5 f32,
5e-2 f16, 2e-1 bf16] (`docs/seed_kernels.md`) on the seed tests' shapes (Hk 2, Hv 4,
K = V = 128), under CUDA's (and Metal's) function ULPs: the step's outputs and the o of a
64-token recurrence are bounded below them (tested); the recurrence's f32 state is not (2.6e-4 at
|S| ~ 1 after 64 tokens from an N(0, 1) state: 64 x 128 same-signed roundings of the S k dot,
which a sound bound must admit), nor is o under MLX CPU's exp (96 ULPs: 1.1e-4).
"""

from __future__ import annotations

import numpy as np

from oracle import gdn_math
from oracle.builders import kernel_view
from oracle.numerics import (DEFAULT, FUNCTION_ULPS, SUB32, TINY32, U, Val, model_for,
                             store_bound)
from oracle.spec import BatchDim, OpSpec, TensorSpec, register

EPS = gdn_math.L2NORM_EPS  # the normalisations' eps, f32(1e-6) as the kernel holds it
RMS_EPS = EPS  # gdn_step_prep's RMS norm: mean(x²) + 1e-6 (mt_gated_delta_prep_step)
INITIAL_STATES = ("zero", "given", "large")
PARAMS = {"scale": None, "l2norm": True, "initial_state": "zero", "decay": "mixed",
          "beta": "uniform", "ftz": 0}
DECAYS = ("mixed", "near_one", "near_zero")
BETAS = ("uniform", "near_zero", "near_one")
PARAM_VALUES = {"l2norm": (True, False), "initial_state": INITIAL_STATES, "decay": DECAYS,
                "beta": BETAS}


# --- shapes, params, domain --------------------------------------------------------------------

Q = lambda d: (d["batch"], d["tokens"], d["heads_k"], d["dim_k"])  # noqa: E731
V = lambda d: (d["batch"], d["tokens"], d["heads_v"], d["dim_v"])  # noqa: E731
G = lambda d: (d["batch"], d["tokens"], d["heads_v"])  # noqa: E731
STATE = lambda d: (d["batch"], d["heads_v"], d["dim_v"], d["dim_k"])  # noqa: E731
Q1 = lambda d: (d["batch"], d["heads_k"], d["dim_k"])  # noqa: E731
V1 = lambda d: (d["batch"], d["heads_v"], d["dim_v"])  # noqa: E731
G1 = lambda d: (d["batch"], d["heads_v"])  # noqa: E731
CONV = lambda d: (d["batch"], 2 * d["heads_k"] * d["dim_k"] + d["heads_v"] * d["dim_v"])  # noqa
NORM_W = lambda d: (d["dim_k"],)  # noqa: E731
PER_HEAD = lambda d: (d["heads_v"],)  # noqa: E731


def check_domain(case) -> None:
    """Hv must be a multiple of Hk (GQA), and the scale a positive finite number or None."""
    d = case.dims
    if d["heads_k"] < 1 or d["heads_v"] % d["heads_k"]:
        raise ValueError(f"{case.op}: heads_v={d['heads_v']} is not a multiple of "
                         f"heads_k={d['heads_k']} (value head h reads q/k head h // (Hv / Hk)): "
                         "make heads_v a multiple of heads_k")
    scale = case.params.get("scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not np.isfinite(scale) or scale <= 0):
        raise ValueError(f"{case.op}: scale={scale!r} must be a positive finite number, or "
                         "null for K^-0.5")


def scale_of(case) -> float:
    """The output scale as the kernel holds it: f32 of the param, K^-0.5 when it is None."""
    s = case.params["scale"]
    return float(np.float32(case.dims["dim_k"] ** -0.5 if s is None else s))


# --- oracles -----------------------------------------------------------------------------------

def gdn_recurrent(inputs: dict, case) -> dict:
    x = kernel_view(inputs, case)
    o, state = gdn_math.recurrent(x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"],
                                  scale_of(case), case.params["l2norm"], EPS)
    return {"o": o, "state": state}


def gdn_step(inputs: dict, case) -> dict:
    """One token of `gdn_recurrent`: the inputs as a sequence of length 1."""
    x = kernel_view(inputs, case)
    o, state = gdn_math.recurrent(x["q"][:, None], x["k"][:, None], x["v"][:, None],
                                  x["g"][:, None], x["beta"][:, None], x["state_in"],
                                  scale_of(case), case.params["l2norm"], EPS)
    return {"o": o[:, 0], "state_out": state}


def split_conv(conv_out: np.ndarray, dims) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q [B, Hk, K], k [B, Hk, K], v [B, Hv, V]) from the conv output's q | k | v slabs."""
    b, hk, hv, dk, dv = (dims[n] for n in ("batch", "heads_k", "heads_v", "dim_k", "dim_v"))
    n = hk * dk
    return (conv_out[:, :n].reshape(b, hk, dk), conv_out[:, n:2 * n].reshape(b, hk, dk),
            conv_out[:, 2 * n:].reshape(b, hv, dv))


def rms(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x · rsqrt(mean(x²) + 1e-6) · weight over the last axis, float64."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS) * weight


def gdn_step_prep(inputs: dict, case) -> dict:
    x = kernel_view(inputs, case)
    q, k, v = split_conv(x["conv_out"], case.dims)
    q, k = rms(q, x["q_norm_weight"]), rms(k, x["k_norm_weight"])
    g = gdn_math.gate(x["a_raw"], x["dt_bias"], x["A_log"])
    beta = gdn_math.sigmoid(x["b_raw"])
    o, state = gdn_math.recurrent(q[:, None], k[:, None], v[:, None], g[:, None],
                                  beta[:, None], x["state_in"], 1.0, False)
    return {"o": o[:, 0], "state_out": state}


# --- the admissible step kernel (gdn_step, gdn_step_prep) ----------------------------------------

def _l2(A, x):
    """x · rsqrt(Σx² + eps) along the last axis."""
    return x * A.keep(A.sum(x * x) + A.load(EPS)).rsqrt()


def step_kernel_core(A, q, k, v, g, beta, state, scale):
    """One token in arithmetic A: q, k [B, Hv, K] (already per value head, normalised or not)
    as A values, v [B, Hv, V], g (a log-decay), beta [B, Hv] and state [B, Hv, V, K] as A
    values; scale a float or None (no scale). Returns (o [B, Hv, V], state)."""
    b, hv, dk = k.shape
    kr = k.reshape(b, hv, 1, dk)
    s1 = state * A.keep(A.keep(g.exp()))
    u = (v - A.sum(s1 * kr)) * A.keep(beta)
    s2 = s1 + A.keep(u) * kr
    if scale is None:
        return A.sum(s2 * q.reshape(b, hv, 1, dk)), s2
    sc = A.load(scale)
    o = A.either(A.sum(s2 * (q * sc).reshape(b, hv, 1, dk)),
                 A.sum(s2 * q.reshape(b, hv, 1, dk)) * sc)
    return o, s2


def step_kernel(A, inputs: dict, case) -> dict:
    x = kernel_view(inputs, case)
    heads = gdn_math.gqa_index(case.dims["heads_v"], case.dims["heads_k"])
    q, k = A.load(x["q"][:, heads]), A.load(x["k"][:, heads])
    if case.params["l2norm"]:
        q, k = _l2(A, q), _l2(A, k)
    o, state = step_kernel_core(A, q, k, A.load(x["v"]), A.load(x["g"]), A.load(x["beta"]),
                                A.load(x["state_in"]), scale_of(case))
    return {"o": o, "state_out": state}


def recurrent_kernel(A, inputs: dict, case) -> dict:
    """`gdn_recurrent`'s admissible kernel: `step_kernel_core` token by token. Not the op's
    `kernel` (in the interval arithmetic it is vacuous within a hundred tokens: the module
    docstring); in `oracle.numerics.Worst` it is one admissible kernel, each rounding off by its
    whole charge in the direction its site is given, against which `recurrent_bound` is tested
    (`tests/test_gdn.py`)."""
    x = kernel_view(inputs, case)
    heads = gdn_math.gqa_index(case.dims["heads_v"], case.dims["heads_k"])
    q, k = A.load(x["q"][:, :, heads]), A.load(x["k"][:, :, heads])
    if case.params["l2norm"]:
        q, k = _l2(A, q), _l2(A, k)
    v, g, beta, state = (A.load(x[n]) for n in ("v", "g", "beta", "h0"))
    outs = []
    for t in range(x["q"].shape[1]):
        o, state = step_kernel_core(A, q.at((slice(None), t)), k.at((slice(None), t)),
                                    v.at((slice(None), t)), g.at((slice(None), t)),
                                    beta.at((slice(None), t)), state, scale_of(case))
        outs.append(o.reshape(o.shape[0], 1, *o.shape[1:]))
    return {"o": outs[0] if len(outs) == 1 else A.concat(outs, axis=1), "state": state}


def _rms_kernel(A, x, w):
    """x · rsqrt(Σx² / K + eps) · w: the mean as a sum and a divide."""
    n = A.load(float(x.shape[-1]))
    return x * A.keep(A.sum(x * x) / n + A.load(RMS_EPS)).rsqrt() * A.load(w)


def prep_kernel(A, inputs: dict, case) -> dict:
    x = kernel_view(inputs, case)
    q, k, v = split_conv(x["conv_out"], case.dims)
    heads = gdn_math.gqa_index(case.dims["heads_v"], case.dims["heads_k"])
    q = _rms_kernel(A, A.load(q), x["q_norm_weight"]).at((slice(None), heads))
    k = _rms_kernel(A, A.load(k), x["k_norm_weight"]).at((slice(None), heads))
    # g = −exp(A_log)·softplus(a + dt_bias), softplus unclamped: log(1 + exp(z)) (the seed's)
    one = A.load(1.0)
    z = A.load(x["a_raw"]) + A.load(x["dt_bias"])
    g = (A.load(x["A_log"]).exp() * (one + z.exp()).log()).neg()
    bz = A.load(x["b_raw"])
    beta = one / (one + bz.neg().exp())
    o, state = step_kernel_core(A, q, k, A.load(v), g, beta, A.load(x["state_in"]), None)
    return {"o": o, "state_out": state}


# --- the hand bound of gdn_recurrent (module docstring) ----------------------------------------

def _gamma(n: int) -> float:
    """γ_n = n u / (1 − n u): a sum of n f32 roundings, relative, in any order."""
    return n * U / (1.0 - n * U)


def _norm(x: np.ndarray) -> np.ndarray:
    return np.sqrt(np.sum(x * x, axis=-1))


def recurrent_bound(inputs: dict, exact: dict, case, numerics=None) -> dict:
    """Per output, the bound on |impl − exact| of the module docstring, for an impl declaring
    `numerics` (its function ULPs and flushes; None: the default table). The exact trajectory
    (its row norms) is `gdn_math.recurrent`, one token at a time."""
    numerics = numerics or DEFAULT
    model = model_for(case, numerics)
    ulps = numerics.ulps or FUNCTION_ULPS
    r_exp, r_rsqrt = (ulps.get(f, FUNCTION_ULPS[f]) * 2.0 ** -23 for f in ("exp", "rsqrt"))
    flushes = numerics.flushes if numerics.flushes is not None else ()
    exp_flushes = model.ftz or "exp" in flushes
    sub = TINY32 if model.ftz else SUB32  # what one subnormal result may be off by
    x = kernel_view(inputs, case)
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    dk, l2, scale = case.dims["dim_k"], case.params["l2norm"], scale_of(case)
    heads = gdn_math.gqa_index(case.dims["heads_v"], case.dims["heads_k"])
    qh, kh = (gdn_math.l2norm(a, EPS) if l2 else a for a in (q, k))
    qn, kn = _norm(qh[:, :, heads]), _norm(kh[:, :, heads])  # [B, T, Hv]
    rho = ((1.0 - _gamma(dk + 1)) ** -0.5 * (1.0 + r_rsqrt) * (1.0 + U) - 1.0) if l2 else 0.0
    alpha = (1.0 + r_exp) * (1.0 + U) - 1.0
    root_k = np.sqrt(dk)
    state = np.array(x["h0"], dtype=np.float64)
    err = np.zeros(state.shape[:-1])  # E: the 2-norm of each state row's error
    o_err = np.empty(np.shape(exact["o"]))
    with np.errstate(invalid="ignore", over="ignore"):
        for t in range(q.shape[1]):
            d = np.exp(g[:, t])[..., None]  # [B, Hv, 1]
            b = np.abs(beta[:, t])[..., None]
            kt, k1 = kn[:, t][..., None], kn[:, t][..., None] * (1.0 + rho)
            # a decay that may flush to 0 (under FTZ, or a flushing exp): its whole value
            a_t = np.where(exp_flushes & (d * (1.0 + r_exp) < TINY32), np.maximum(alpha, 1.0),
                           alpha)
            sigma = _norm(state) + err  # >= the kernel's ‖s'‖
            n1 = d * sigma * (1.0 + a_t)  # >= ‖s1'‖
            e_kv = n1 * kt * (_gamma(dk) * (1.0 + rho) + rho) + 2 * dk * sub
            w = np.abs(v[:, t]) + n1 * kt  # >= |v − s1'·k̂|
            e_u = b * (_gamma(2) * (w + e_kv) + e_kv) + 2 * sub
            mu = b * (w + e_kv) * (1.0 + _gamma(2))  # >= |u'|
            a1 = a_t * d * sigma + root_k * sub
            a2 = (U * (n1 + (1.0 + U) * mu * k1) + U * mu * k1 + e_u * k1 + b * w * rho * kt
                  + 2 * root_k * sub)
            contraction = np.maximum(1.0, np.abs(1.0 - b * kt * kt))
            err = contraction * (d * err + a1) + a2
            _, state = gdn_math.recurrent(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1],
                                          g[:, t:t + 1], beta[:, t:t + 1], state, scale, l2, EPS)
            s_new, q1 = _norm(state), qn[:, t][..., None] * (1.0 + rho)
            o_err[:, t] = (scale * (s_new * rho * qn[:, t][..., None] + err * q1
                                    + _gamma(dk + 1) * (s_new + err) * q1)
                           + (2 * dk + 1) * sub)
    err, o_err = (np.where(np.isfinite(e), e, np.inf) for e in (err, o_err))
    o_dtype = case.spec.output_dtype("o", case)
    state_err = np.broadcast_to(err[..., None], np.shape(exact["state"]))
    return {"o": store_bound(Val(np.asarray(exact["o"]), o_err, model), o_dtype),
            "state": store_bound(Val(np.asarray(exact["state"]), state_err, model), "f32")}


# --- the ops -----------------------------------------------------------------------------------

def _flops(case) -> int:
    """Per token and value head: the decay, S k, the rank-1 update and S q: ~7 V K."""
    d = case.dims
    return 7 * d["batch"] * d.get("tokens", 1) * d["heads_v"] * d["dim_v"] * d["dim_k"]


def _io_bytes(case) -> int:
    return case.spec.io_bytes(case)


DIMS = ("batch", "tokens", "heads_k", "heads_v", "dim_k", "dim_v")
STEP_DIMS = ("batch", "heads_k", "heads_v", "dim_k", "dim_v")
COMMON = dict(family="gdn", bytes=_io_bytes, flops=_flops, domain=check_domain, doc=__doc__)
STEP_PARAMS = {**PARAMS, "initial_state": "given"}


def _qk(name, shape):
    return TensorSpec(name, shape, init="gdn_qk")


def _f32(name, shape, init):
    return TensorSpec(name, shape, role="f32", init=init, adversarial=False)


register(OpSpec(
    name="gdn_recurrent", dims=DIMS,
    inputs=(_qk("q", Q), _qk("k", Q), TensorSpec("v", V), _f32("g", G, "gdn_log_decay"),
            _f32("beta", G, "gdn_beta"), _f32("h0", STATE, "gdn_state")),
    outputs=(TensorSpec("o", V), TensorSpec("state", STATE, role="f32")),
    oracle=gdn_recurrent, tolerance=recurrent_bound, params=PARAMS, param_values=PARAM_VALUES,
    batch=BatchDim("batch", ("q", "k", "v", "g", "beta", "h0"), ("o", "state")),
    chain_input="q", **COMMON))

register(OpSpec(
    name="gdn_step", dims=STEP_DIMS,
    inputs=(_qk("q", Q1), _qk("k", Q1), TensorSpec("v", V1), _f32("g", G1, "gdn_log_decay"),
            _f32("beta", G1, "gdn_beta"), _f32("state_in", STATE, "gdn_state")),
    outputs=(TensorSpec("o", V1), TensorSpec("state_out", STATE, role="f32")),
    oracle=gdn_step, tolerance=None, kernel=step_kernel, params=STEP_PARAMS,
    param_values=PARAM_VALUES,
    batch=BatchDim("batch", ("q", "k", "v", "g", "beta", "state_in"), ("o", "state_out")),
    chain_input="q", **COMMON))

PREP_PARAMS = {"initial_state": "given", "ftz": 0}
register(OpSpec(
    name="gdn_step_prep", dims=STEP_DIMS,
    inputs=(TensorSpec("conv_out", CONV),
            TensorSpec("q_norm_weight", NORM_W, init="gdn_q_norm_weight"),
            TensorSpec("k_norm_weight", NORM_W, init="gdn_k_norm_weight"),
            _f32("A_log", PER_HEAD, "gdn_a_log"), _f32("dt_bias", PER_HEAD, "gdn_dt_bias"),
            TensorSpec("a_raw", G1, init="gdn_a_raw", adversarial=False),
            TensorSpec("b_raw", G1, init="gdn_b_raw", adversarial=False),
            _f32("state_in", STATE, "gdn_state")),
    outputs=(TensorSpec("o", V1), TensorSpec("state_out", STATE, role="f32")),
    oracle=gdn_step_prep, tolerance=None, kernel=prep_kernel, params=PREP_PARAMS,
    param_values={"initial_state": INITIAL_STATES},
    batch=BatchDim("batch", ("conv_out", "a_raw", "b_raw", "state_in"), ("o", "state_out")),
    chain_input="conv_out", **{**COMMON, "domain": check_domain}))
