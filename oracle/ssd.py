"""Mamba-2's state-space scan, sequential (issue 30; mamba_ssm's `selective_state_update_ref`,
HF Nemotron-H, the seed's `ssm_step` in metaltile-std `src/ffai/ssm.rs`): the scan, its
packed-sequence form and the decode step. The float64 recurrence is `oracle/ssd_math.py`; the
chunked form is `oracle/ssd_chunked.py`.

Layouts (mamba_ssm / HF Mamba2 / Nemotron-H): x, z, y [B, T, H, P]; dt_raw [B, T, H]; A_log,
dt_bias, D [H]; Bm, Cm [B, T, G, N]; states [B, H, P, N]. Head h reads B/C group
g = h // (H / G) (HF's `repeat_interleave(H // G)`, mamba's "b g n -> b (g h) n"; NOT h % G);
H % G == 0 is checked at case load. Per (b, h), the state S [P, N]:

    dt = softplus(dt_raw + dt_bias)        f32, then clamped to [dt_min, dt_max] (param)
    A  = −exp(A_log);  S = exp(dt A) S + dt x ⊗ B[g];  y = S C[g] + D x;  y *= silu(z) (gate)

Ops (dtypes: x, z, dt_raw, Bm, Cm, y in T, the case dtype; A_log, dt_bias, D and every state
f32):

* `ssd_scan`: x, dt_raw, A_log, dt_bias, Bm, Cm, D, z, h0 -> y, state (the final state).
* `ssd_scan_varlen`: packed sequences (the seed's `seg_reset`, FlashAttention's varlen layout):
  x [1, ΣL, H, P] etc., cu_seqlens [S + 1] i32 (the exclusive prefix sums of param `segments`,
  the lengths, a tuple), h0 [S, H, P, N] -> y [1, ΣL, H, P], states [S, H, P, N]: sequence s
  starts from h0[s] (the state resets at every segment start) and ends in states[s].
* `ssm_step`: one token, the decode step: x [B, H, P], dt_raw [B, H], Bm, Cm [B, G, N],
  z [B, H, P], state_in -> y [B, H, P], state_out (a plain output: an impl updating in place
  writes a copy). Param `layout`: "hpn" (state [B, H, P, N]: mamba_ssm's
  `selective_state_update`, MLX) or "hnp" (state [B, H, N, P]: the seed's `ssm_step`, index
  h·N·P + n·P + d).

Params: `gate` (False: no z, its tensor is empty; True: y *= silu(z)); `dt_min`, `dt_max` (the
dt clamp, Nemotron-H's `time_step_limit`; default 0 and None: no clamp, as the CUDA path
passes (0, inf); a tuple param holds only integers here, hence two floats); `initial_state`
("zero", "given" N(0, 1), "large" N(0, 1000²)); `dt` ("mixed", "fast", "slow": how dt_bias is
drawn, `cases/ssd.py`); `ftz` (the kernel reads f32 subnormals as 0 and may flush its subnormal
results).

Rounding points (the contract): the inputs as stored; dt, A, exp(dt A), the products, the sums
and the state in f32 registers; the state stored in f32; y rounded to T once, at the store. The
oracle is the float64 recurrence on the stored inputs.

Tolerance: derived from the admissible kernel (`scan_kernel`, `step_kernel`, `varlen_kernel`) in
`oracle/numerics.py`'s interval arithmetic, so `tests/test_bounds_corners.py` covers it. Per
token: dt_raw + dt_bias (one add), softplus as log(1 + exp(z)) (exp's and log's ULPs and the
add's rounding: mamba_ssm's Triton `softplus` on triton >= 3; an impl computing log1p(exp(z))
(torch, MLX, triton < 3) errs less: its bound is this one's with the add's rounding at 1 left
out), the clamp (exact, 1-Lipschitz), exp(A_log) and its sign, the product dt·A and its exp,
dt·x·B in any association, the decay product and the update's sum, the N-term dot S·C in the
impl's declared order, D·x and its add, silu(z) as z / (1 + exp(−z)) or z·(1 / (1 + exp(−z)))
and the gate's product, then T's rounding at the store.

The element-wise interval is sound and not loose here, unlike the GDN recurrence's
(`oracle/gdn.py`): the SSD recurrence is diagonal (each state element S[p, n] evolves alone, its
decay exp(dt A) <= 1), so the state's bound grows as E_t = exp(dt_t A) E_{t-1} + ℓ_t: linear in
T at most (slow decay), saturating at ℓ / (1 − exp(dt A)) where the state forgets; the worst
admissible kernel (every rounding of one sign, `tests/test_bounds_corners.py`) attains it.

Measured (CPU, the gate cases): torch's and MLX's f32 impls use 5-45 % of the bound on y and
the state; where dt is small (`dt="slow"`, 1e-4 to 1e-3) the state's bound is set by softplus's
admitted log(1 + exp(z)) form (an absolute error ~2^-24 in dt, 1e-4 of dt relative), and the
impls (log1p forms) use ~0.3 % of it. Against the tolerances that are the loosest acceptable
(mamba_ssm's tests and the seed's, below; `tests/test_ssd.py` tests the first), max over the
elements of bound / (atol + rtol |y|), under CUDA's function ULPs, any summation order, N = 128:

    ssm_step, Nemotron (H 64, P 64, G 8) and the seed cell (H 32, P 128, G 2), one token:
      mamba_ssm selective_state_update (f32 3e-4/1e-3, f16 5e-3/1e-2, bf16 1e-2/5e-2):
      f32 0.48-0.51, f16 0.09, bf16 0.31-0.34: within.
      the seed's ssm_step (absolute 1e-5, 5e-3, 5e-2): NOT within: f32 97-160x (bound 9.7e-4 at
      |y| <= 38: 2.6e-5 of max |y|; a declared sequential sum: 2.2e-4), f16 3.1-3.3x, bf16 2.5x;
      at these magnitudes the correctly rounded bf16 y alone errs by up to 0.125 > 5e-2 (the
      seed's data must be ~40x smaller), so its absolute tolerance does not transfer.
    ssd_scan, H 8, P 64, G 1, T = 64: selective_state_update's: f32 1.2x (NOT within), f16 0.27,
      bf16 0.34; mamba's selective_scan (f32 6e-4/2e-3, bf16 3e-2/5e-2): f32 0.62, bf16 0.12.
"""

from __future__ import annotations

import numpy as np

from oracle import ssd_math
from oracle.builders import kernel_view
from oracle.numerics import Adverse, Val, exact_where  # noqa: F401 (exact_where: re-exported)
from oracle.spec import BatchDim, OpSpec, TensorSpec, register

INITIAL_STATES = ("zero", "given", "large")
DT_KINDS = ("mixed", "fast", "slow")
LAYOUTS = ("hpn", "hnp")
PARAMS = {"gate": False, "dt_min": 0.0, "dt_max": None, "initial_state": "zero", "dt": "mixed",
          "ftz": 0}
PARAM_VALUES = {"gate": (False, True), "initial_state": INITIAL_STATES, "dt": DT_KINDS}


# --- shapes ------------------------------------------------------------------------------------

X = lambda d: (d["batch"], d["tokens"], d["heads"], d["dim_p"])  # noqa: E731
Z = lambda d, p: X(d) if p["gate"] else (0,)  # noqa: E731  no gate: an empty tensor
DT = lambda d: (d["batch"], d["tokens"], d["heads"])  # noqa: E731
BC = lambda d: (d["batch"], d["tokens"], d["groups"], d["dim_n"])  # noqa: E731
STATE = lambda d: (d["batch"], d["heads"], d["dim_p"], d["dim_n"])  # noqa: E731
PER_HEAD = lambda d: (d["heads"],)  # noqa: E731
X1 = lambda d: (d["batch"], d["heads"], d["dim_p"])  # noqa: E731
Z1 = lambda d, p: X1(d) if p["gate"] else (0,)  # noqa: E731
DT1 = lambda d: (d["batch"], d["heads"])  # noqa: E731
BC1 = lambda d: (d["batch"], d["groups"], d["dim_n"])  # noqa: E731


def STATE1(d, p):
    """ssm_step's state in its layout: [B, H, P, N] (hpn) or [B, H, N, P] (hnp)."""
    b, h, dp, dn = d["batch"], d["heads"], d["dim_p"], d["dim_n"]
    return (b, h, dp, dn) if p["layout"] == "hpn" else (b, h, dn, dp)


def _packed(d, p, *tail):
    return (1, sum(p["segments"])) + tail


XV = lambda d, p: _packed(d, p, d["heads"], d["dim_p"])  # noqa: E731
ZV = lambda d, p: XV(d, p) if p["gate"] else (0,)  # noqa: E731
DTV = lambda d, p: _packed(d, p, d["heads"])  # noqa: E731
BCV = lambda d, p: _packed(d, p, d["groups"], d["dim_n"])  # noqa: E731
STATEV = lambda d, p: (len(p["segments"]), d["heads"], d["dim_p"], d["dim_n"])  # noqa: E731
CU = lambda d, p: (len(p["segments"]) + 1,)  # noqa: E731


# --- domain ------------------------------------------------------------------------------------

def check_domain(case) -> None:
    """H a multiple of G (head h reads group h // (H / G)); the dt clamp a valid interval; at
    least one token; every segment of a packed case at least one token long."""
    d, p = case.dims, case.params
    if d["groups"] < 1 or d["heads"] % d["groups"]:
        raise ValueError(f"{case.op}: heads={d['heads']} is not a multiple of groups="
                         f"{d['groups']} (head h reads B/C group h // (H / G)): make heads a "
                         "multiple of groups")
    lo, hi = p["dt_min"], p["dt_max"]
    if isinstance(lo, bool) or not isinstance(lo, (int, float)) or not np.isfinite(lo) or lo < 0:
        raise ValueError(f"{case.op}: dt_min={lo!r} must be a finite number >= 0 (0: no lower "
                         "clamp)")
    if hi is not None and (isinstance(hi, bool) or not isinstance(hi, (int, float))
                           or not np.isfinite(hi) or hi <= lo):
        raise ValueError(f"{case.op}: dt_max={hi!r} must be a finite number above dt_min={lo!r}, "
                         "or null for no upper clamp")
    if "tokens" in d and d["tokens"] < 1:
        raise ValueError(f"{case.op}: tokens={d['tokens']}: at least 1")
    if "segments" in p and (not p["segments"] or min(p["segments"]) < 1):
        raise ValueError(f"{case.op}: segments={list(p['segments'])}: at least one segment, "
                         "each at least 1 token long")


def dt_limits(case) -> tuple[float, float | None]:
    """(dt_min, dt_max) as the kernel holds them (f32)."""
    lo, hi = case.params["dt_min"], case.params["dt_max"]
    return float(np.float32(lo)), None if hi is None else float(np.float32(hi))


# --- oracles -----------------------------------------------------------------------------------

def _scan(x: dict, case, h0) -> tuple[np.ndarray, np.ndarray]:
    """The float64 recurrence on kernel-view inputs x (x, dt_raw, ... of [B, T, ...] shapes)."""
    dt = ssd_math.time_step(x["dt_raw"], x["dt_bias"], *dt_limits(case))
    return ssd_math.recurrence(x["x"], dt, ssd_math.decay_rate(x["A_log"]), x["Bm"], x["Cm"],
                               x["D"], x["z"] if case.params["gate"] else None, h0)


def ssd_scan(inputs: dict, case) -> dict:
    x = kernel_view(inputs, case)
    y, state = _scan(x, case, x["h0"])
    return {"y": y, "state": state}


def segments(case) -> list[tuple[int, int]]:
    """(offset, length) of each packed sequence."""
    lens = case.params["segments"]
    starts = np.cumsum([0, *lens])
    return [(int(starts[i]), int(n)) for i, n in enumerate(lens)]


def _segment(x: dict, lo: int, n: int) -> dict:
    """The packed tensors' rows [lo, lo + n) (the per-head and empty ones as they are)."""
    seq = ("x", "dt_raw", "Bm", "Cm")
    out = {k: (v[:, lo:lo + n] if k in seq else v) for k, v in x.items()}
    if np.size(x["z"]):
        out["z"] = x["z"][:, lo:lo + n]
    return out


def ssd_scan_varlen(inputs: dict, case) -> dict:
    x = kernel_view(inputs, case)
    ys, states = [], []
    for s, (lo, n) in enumerate(segments(case)):
        y, state = _scan(_segment(x, lo, n), case, x["h0"][s:s + 1])
        ys.append(y)
        states.append(state)
    return {"y": np.concatenate(ys, axis=1), "states": np.concatenate(states, axis=0)}


def to_hpn(state: np.ndarray, case) -> np.ndarray:
    """ssm_step's state in its layout -> [B, H, P, N]."""
    return state if case.params["layout"] == "hpn" else np.swapaxes(state, -1, -2)


def ssm_step(inputs: dict, case) -> dict:
    """One token of `ssd_scan`: the inputs as a sequence of length 1."""
    x = kernel_view(inputs, case)
    seq = {k: (v[:, None] if k in ("x", "dt_raw", "Bm", "Cm") else v) for k, v in x.items()}
    if case.params["gate"]:
        seq["z"] = x["z"][:, None]
    y, state = _scan(seq, case, to_hpn(x["state_in"], case))
    return {"y": y[:, 0], "state_out": to_hpn(state, case)}


# --- the admissible kernel ---------------------------------------------------------------------
#
# Exact rearrangements of a kernel value (a gather, a transpose, a mask by 0/1), in either
# arithmetic of `oracle/numerics.py`: `Val` (the bound) or `Adverse` (one admissible kernel).

def view(a, fn):
    """fn (an exact rearrangement: reshape, transpose, index, pad with exact zeros, multiply by
    a 0/1 mask) applied to a kernel value: no rounding, the error moves with its element."""
    if isinstance(a, Val):
        return Val(fn(a.v), fn(np.broadcast_to(a.e, np.shape(a.v))), a.m)
    return Adverse(fn(a.x), a.m, a.ch)


def clamp(a, lo: float, hi: float | None):
    """min(max(a, lo), hi): exact, and 1-Lipschitz (the error bound stays)."""
    if lo <= 0 and hi is None:
        return a
    top = np.inf if hi is None else hi
    if isinstance(a, Val):
        return Val(np.clip(a.v, lo, top), a.e, a.m)
    return Adverse(np.clip(a.x, lo, top), a.m, a.ch)


def time_step_kernel(A, dt_raw, dt_bias, case):
    """dt = clamp(log(1 + exp(dt_raw + dt_bias))) in f32 (module docstring)."""
    one = A.load(1.0)
    z = A.load(dt_raw) + A.load(dt_bias)
    return clamp((one + z.exp()).log(), *dt_limits(case))


def silu_kernel(A, z):
    """silu(z) as z / (1 + exp(−z)) (torch) or z·(1 / (1 + exp(−z))) (MLX's z·sigmoid(z))."""
    one = A.load(1.0)
    den = one + z.neg().exp()
    return A.either(z / den, z * (one / den))


def step_core(A, s, dt, rate, x, b, c, d, z):
    """One token in arithmetic A: s [B, H, P, N] (hpn), dt [B, H], rate = A [H], x [B, H, P],
    b, c [B, H, N] (per head), d [H], z [B, H, P] or None. Returns (y before its store, the new
    state)."""
    bsz, h, n = b.shape
    decay = A.keep(A.keep((dt * rate).exp()))  # [B, H, 1, 1]
    upd = A.prod3(A.keep(A.keep(dt)), A.keep(x), b.reshape(bsz, h, 1, n))
    s = s * decay + upd
    y = A.sum(s * c.reshape(bsz, h, 1, n)) + view(d, lambda v: v[:, None]) * x
    if z is not None:
        y = y * silu_kernel(A, z)
    return y, s


def decay_and_skip(A, x: dict):
    """A = −exp(A_log) [H] and D [H] as the kernel holds them."""
    return A.load(x["A_log"]).exp().neg(), A.load(x["D"])


def scan_core(A, x: dict, case, h0) -> tuple:
    """`step_core` token by token over x's [B, T, ...] tensors (kernel view), from state h0 (an
    array or a kernel value). Returns (y [B, T, H, P], the final state)."""
    heads = ssd_math.group_index(case.dims["heads"], case.dims["groups"])
    rate, d = decay_and_skip(A, x)
    dt = time_step_kernel(A, x["dt_raw"], x["dt_bias"], case)  # [B, T, H]
    gate = case.params["gate"]
    s = A.load(h0)
    ys = []
    for t in range(x["x"].shape[1]):
        at = (slice(None), t)
        y, s = step_core(A, s, dt.at(at), rate, A.load(x["x"][at]), A.load(x["Bm"][at][:, heads]),
                         A.load(x["Cm"][at][:, heads]), d, A.load(x["z"][at]) if gate else None)
        ys.append(y.reshape(y.shape[0], 1, *y.shape[1:]))
    return (ys[0] if len(ys) == 1 else A.concat(ys, axis=1)), s


def scan_kernel(A, inputs: dict, case) -> dict:
    x = kernel_view(inputs, case)
    y, s = scan_core(A, x, case, x["h0"])
    return {"y": y, "state": s}


def varlen_kernel(A, inputs: dict, case) -> dict:
    """`scan_core` per packed sequence, each from its own h0 row."""
    x = kernel_view(inputs, case)
    ys, states = [], []
    for i, (lo, n) in enumerate(segments(case)):
        y, s = scan_core(A, _segment(x, lo, n), case, x["h0"][i:i + 1])
        ys.append(y)
        states.append(s)
    cat = lambda parts: parts[0] if len(parts) == 1 else A.concat(parts, axis=0)  # noqa: E731
    return {"y": ys[0] if len(ys) == 1 else A.concat(ys, axis=1), "states": cat(states)}


def step_kernel(A, inputs: dict, case) -> dict:
    x = kernel_view(inputs, case)
    heads = ssd_math.group_index(case.dims["heads"], case.dims["groups"])
    rate, d = decay_and_skip(A, x)
    dt = time_step_kernel(A, x["dt_raw"], x["dt_bias"], case)
    z = A.load(x["z"]) if case.params["gate"] else None
    y, s = step_core(A, A.load(to_hpn(x["state_in"], case)), dt, rate, A.load(x["x"]),
                     A.load(x["Bm"][:, heads]), A.load(x["Cm"][:, heads]), d, z)
    if case.params["layout"] == "hnp":
        s = view(s, lambda v: np.swapaxes(v, -1, -2))
    return {"y": y, "state_out": s}


# --- the ops -----------------------------------------------------------------------------------

def _flops(case) -> int:
    """Per token and head: the update (3 P N), the dot S·C (2 P N), D·x and the gate."""
    d, p = case.dims, case.params
    tokens = sum(p["segments"]) if "segments" in p else d.get("batch", 1) * d.get("tokens", 1)
    return int(tokens * d["heads"] * (5 * d["dim_p"] * d["dim_n"] + 4 * d["dim_p"]))


def _io_bytes(case) -> int:
    return case.spec.io_bytes(case)


def _f32(name, shape, init):
    return TensorSpec(name, shape, role="f32", init=init, adversarial=False)


def _per_head_inputs():
    return (_f32("A_log", PER_HEAD, "ssd_a_log"), _f32("dt_bias", PER_HEAD, "ssd_dt_bias"))


COMMON = dict(family="ssd", bytes=_io_bytes, flops=_flops, domain=check_domain, doc=__doc__,
              chain_input="x")
SCAN_DIMS = ("batch", "tokens", "heads", "dim_p", "groups", "dim_n")
STEP_DIMS = ("batch", "heads", "dim_p", "groups", "dim_n")
VARLEN_DIMS = ("heads", "dim_p", "groups", "dim_n")
DT_RAW = dict(init="ssd_dt_raw", adversarial=False)


def scan_inputs(x, dt, bc, z, h0, h0_name="h0") -> tuple:
    """The scan's inputs in the order they are drawn, at these shapes."""
    return (TensorSpec("x", x), TensorSpec("dt_raw", dt, **DT_RAW), *_per_head_inputs(),
            TensorSpec("Bm", bc), TensorSpec("Cm", bc), _f32("D", PER_HEAD, "ssd_d"),
            TensorSpec("z", z, init="gate"), _f32(h0_name, h0, "ssd_state"))


register(OpSpec(
    name="ssd_scan", dims=SCAN_DIMS, inputs=scan_inputs(X, DT, BC, Z, STATE),
    outputs=(TensorSpec("y", X), TensorSpec("state", STATE, role="f32")),
    oracle=ssd_scan, tolerance=None, kernel=scan_kernel, params=PARAMS,
    param_values=PARAM_VALUES,
    batch=BatchDim("batch", ("x", "dt_raw", "Bm", "Cm", "z", "h0"), ("y", "state")), **COMMON))

VARLEN_PARAMS = {**PARAMS, "segments": (2, 1)}
register(OpSpec(
    name="ssd_scan_varlen", dims=VARLEN_DIMS,
    inputs=(TensorSpec("cu_seqlens", CU, role="i32", init="ssd_cu_seqlens", adversarial=False),
            *scan_inputs(XV, DTV, BCV, ZV, STATEV)),
    outputs=(TensorSpec("y", XV), TensorSpec("states", STATEV, role="f32")),
    oracle=ssd_scan_varlen, tolerance=None, kernel=varlen_kernel, params=VARLEN_PARAMS,
    param_values=PARAM_VALUES, **COMMON))

STEP_PARAMS = {**PARAMS, "initial_state": "given", "layout": "hpn"}
register(OpSpec(
    name="ssm_step", dims=STEP_DIMS,
    inputs=scan_inputs(X1, DT1, BC1, Z1, STATE1, "state_in"),
    outputs=(TensorSpec("y", X1), TensorSpec("state_out", STATE1, role="f32")),
    oracle=ssm_step, tolerance=None, kernel=step_kernel, params=STEP_PARAMS,
    param_values={**PARAM_VALUES, "layout": LAYOUTS},
    batch=BatchDim("batch", ("x", "dt_raw", "Bm", "Cm", "z", "state_in"), ("y", "state_out")),
    **COMMON))
