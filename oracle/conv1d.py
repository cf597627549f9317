"""Mamba-2's causal depthwise conv1d: the prefill over T tokens and the decode step (issue 30;
Dao-AILab/causal-conv1d's `causal_conv1d_ref` / `causal_conv1d_update_ref`; the seed's
`conv1d_causal_step`, metaltile-std `src/ffai/ssm.rs`).

Layouts (channels last, the seed's `w[K, C]`): x [B, T, D]; weight [W, D], w[W-1] multiplying
the current token; bias [D]; the conv state [B, W-1, D]: the W-1 previous raw inputs, oldest
first (vLLM's W-1 slots; mamba_ssm's `Mamba2.step` keeps W). Per channel d and token t, with
xx = cat(state_in, x) along the tokens (so xx[t + j] is x[t - (W-1) + j]):

    y_t = bias + Σ_{j<W} w[j] · xx[t + j]       then silu(y_t) = y_t · sigmoid(y_t) (param silu)
    conv_state = xx[T:]                         the last W-1 raw inputs, oldest first

* `conv1d_causal`: x [B, T, D], weight, bias, conv_state_in -> y [B, T, D], conv_state
  [B, W-1, D]. causal_conv1d's `causal_conv1d_fn` with `initial_states` and
  `return_final_states`, channels last.
* `conv1d_causal_step`: x [B, D], weight, bias, conv_state_in -> y [B, D], conv_state_out
  = cat(state_in[:, 1:], x): the seed's `conv1d_causal_step` (its shift `state[k] =
  state[k+1]; state[K-2] = x`) with its caller's SiLU as param `silu`; a plain output (an impl
  that updates the state in place writes it as a copy).

Params: `bias` (False: the model has no conv bias; the input is still drawn, nonzero, and must
be ignored), `silu`, `initial_state` ("zero": the state is all zero, a fresh sequence; "given":
raw inputs of the case's distribution), `ftz` (the kernel reads f32 subnormals as 0 and may
flush its subnormal results).

Rounding points (the contract): inputs as stored (T); the products, the sum and the silu in f32;
y rounded to T once, at the store; the state is a copy of stored inputs, bit for bit (its
comparator is `Exact`: no tolerance), under `ftz` too (a copy is no arithmetic: subnormals kept). An impl that rounds the conv's sum to T before the silu
(`causal_conv1d_ref` run in bf16: F.conv1d's output is bf16, then F.silu) has a second rounding
this contract does not admit.

Tolerance of y (derived, `oracle/numerics.py`'s interval arithmetic, `conv_kernel`): the W
products w[j]·xx[t+j] (one rounding each: an FMA rounds less, which the charge covers) and the
bias summed in any order (W additions, each charged at the partial sums' caterpillar bound),
then silu as y · (1 / (1 + exp(-y))): exp's ULPs, the add, the divide at 2 ULP, the product;
then T's store. At W = 4, |y| ~ 1: about 4 f32 ULPs before silu, so the f32 bound is ~5e-7 and
the f16/bf16 bounds are T's half ULP at the output (the store dominates). The seeds' tolerances
[f32, f16, bf16] (`docs/seed_kernels.md`, absolute at outputs ~1; the loosest acceptable):
`conv1d_causal_step` [1e-5, 5e-3, 5e-2] (no SiLU), `ffai_conv1d_causal_step_silu_cast_many`
[1e-3, 8e-3, 4e-2] (SiLU, f32 output); causal-conv1d's own tests rtol/atol fp32 3e-4/1e-3,
fp16 3e-3/5e-3, bf16 1e-2/5e-2 (conv and update). The derived bounds are below the seeds' on every
normal-data gate case, under CUDA's function ULPs and MLX's (tests/test_conv1d.py): f32 ~1e-6
(CUDA) and ~3e-6 (MLX's 96-ULP exp in the silu) at |y| ~ 2, f16 1e-3 and bf16 8e-3 at |y| ~ 3.
Measured (CPU, the gate cases): the torch and MLX f32 impls use at most 66 % of the bound; f16
and bf16 outputs are T's correctly rounded value (the store's half-ULP floor, budget up to 1).
MLX's exp is inf past 88.0 (`oracle.numerics.BACKEND_OVERFLOWS`): its silu is 0 for y below -88
(down to -108, where the exact value underflows f32 too), where the exact value is an f32
subnormal; the bound charges it.

NaN and inf (the `nonfinite` distribution): IEEE propagation through the formula is the
contract: a NaN input makes NaN of the W outputs whose window holds it; ±inf gives ±inf there
(inf - inf = NaN where both meet), and silu(-inf) = -inf · 0 = NaN. The state copies them.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from oracle.builders import kernel_view, silu
from oracle.comparators import Exact
from oracle.spec import BatchDim, OpSpec, TensorSpec, register

INITIAL_STATES = ("zero", "given")
PARAMS = {"bias": True, "silu": True, "initial_state": "zero", "ftz": 0}
PARAM_VALUES = {"bias": (True, False), "silu": (True, False), "initial_state": INITIAL_STATES}

X = lambda d: (d["batch"], d["tokens"], d["channels"])  # noqa: E731
X1 = lambda d: (d["batch"], d["channels"])  # noqa: E731
WEIGHT = lambda d: (d["width"], d["channels"])  # noqa: E731
BIAS = lambda d: (d["channels"],)  # noqa: E731
STATE = lambda d: (d["batch"], d["width"] - 1, d["channels"])  # noqa: E731


def check_domain(case) -> None:
    """The conv needs a width of at least 2 (a state of W-1 >= 1 tokens)."""
    w = case.dims["width"]
    if w < 2:
        raise ValueError(f"{case.op}: width={w}: a causal conv with a state needs width >= 2 "
                         "(Mamba-2's is 4)")


# --- the float64 truth --------------------------------------------------------------------------

def windows(xx: np.ndarray, width: int) -> np.ndarray:
    """[B, T, D, W]: window t holds xx[t .. t+W-1] (oldest first) of xx [B, T+W-1, D]."""
    return sliding_window_view(xx, width, axis=1)


def conv(xx: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, act: bool) -> np.ndarray:
    """y [B, T, D] float64 over xx = cat(state, x) [B, T+W-1, D]: bias + Σ_j w[j]·xx[t+j],
    then silu where `act`."""
    width = weight.shape[0]
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.einsum("btdw,wd->btd", windows(xx, width), weight)
        if bias is not None:
            y = y + bias
        return silu(y) if act else y


def _bias(v: dict, case):
    return v["bias"] if case.params["bias"] else None


def stored_window(inputs: dict, x) -> np.ndarray:
    """cat(conv_state_in, x) as stored, float64: what the state out copies. A copy is no
    arithmetic, so FTZ does not touch it (`kernel_view` with param `ftz` reads f32 subnormals as
    0, as the kernel's arithmetic does): the state keeps subnormals and their signs."""
    return np.concatenate([np.asarray(inputs["conv_state_in"]).astype(np.float64),
                           np.asarray(x).astype(np.float64)], axis=1)


def conv1d_causal(inputs: dict, case) -> dict:
    v = kernel_view(inputs, case)
    xx = np.concatenate([v["conv_state_in"], v["x"]], axis=1)
    return {"y": conv(xx, v["weight"], _bias(v, case), case.params["silu"]),
            "conv_state": stored_window(inputs, inputs["x"])[:, case.dims["tokens"]:]}


def conv1d_causal_step(inputs: dict, case) -> dict:
    """One token of `conv1d_causal`: its state out is cat(state_in[:, 1:], x)."""
    v = kernel_view(inputs, case)
    xx = np.concatenate([v["conv_state_in"], v["x"][:, None]], axis=1)
    y = conv(xx, v["weight"], _bias(v, case), case.params["silu"])
    return {"y": y[:, 0],
            "conv_state_out": stored_window(inputs, np.asarray(inputs["x"])[:, None])[:, 1:]}


# --- the admissible kernel -----------------------------------------------------------------------

def _terms(A, xx: np.ndarray, weight: np.ndarray, bias):
    """The sum's terms [B, T, D, (1 +) W]: the bias where there is one, then the W products (a
    kernel's chain acc = bias, acc += w_j x_j, as an impl declaring the order sums them)."""
    prods = A.load(windows(xx, weight.shape[0])) * A.load(weight.T)
    if bias is None:
        return prods
    b = np.broadcast_to(bias[:, None], prods.shape[:-1] + (1,))
    return A.concat([A.load(b), prods], axis=-1)


def conv_kernel(A, xx: np.ndarray, weight: np.ndarray, bias, act: bool):
    """y [B, T, D] in arithmetic A from xx = cat(state, x) [B, T+W-1, D] (float64, as the
    kernel reads it): the W products and the bias summed in the impl's order, then silu."""
    y = A.sum(_terms(A, xx, weight, bias))
    if not act:
        return y
    one = A.load(1.0)
    return y * (one / (one + y.neg().exp()))


def conv1d_causal_kernel(A, inputs: dict, case) -> dict:
    v = kernel_view(inputs, case)
    xx = np.concatenate([v["conv_state_in"], v["x"]], axis=1)
    stored = stored_window(inputs, inputs["x"])
    return {"y": conv_kernel(A, xx, v["weight"], _bias(v, case), case.params["silu"]),
            "conv_state": A.load(stored[:, case.dims["tokens"]:])}


def conv1d_causal_step_kernel(A, inputs: dict, case) -> dict:
    v = kernel_view(inputs, case)
    xx = np.concatenate([v["conv_state_in"], v["x"][:, None]], axis=1)
    y = conv_kernel(A, xx, v["weight"], _bias(v, case), case.params["silu"])
    stored = stored_window(inputs, np.asarray(inputs["x"])[:, None])
    return {"y": y.reshape(y.shape[0], y.shape[2]), "conv_state_out": A.load(stored[:, 1:])}


# --- the ops -----------------------------------------------------------------------------------

def _flops(case) -> int:
    """Per output element: W multiply-adds, the bias, silu (~4)."""
    d = case.dims
    return (2 * d["width"] + 5) * d["batch"] * d.get("tokens", 1) * d["channels"]


def _io_bytes(case) -> int:
    return case.spec.io_bytes(case)


def _state(name: str) -> TensorSpec:
    return TensorSpec(name, STATE, init="conv_state", adversarial=True)


COMMON = dict(family="conv1d", bytes=_io_bytes, flops=_flops, domain=check_domain, doc=__doc__,
              param_values=PARAM_VALUES, chain_input="x")
WEIGHTS = (TensorSpec("weight", WEIGHT, init="conv_weight"),
           TensorSpec("bias", BIAS, init="conv_bias"))

register(OpSpec(
    name="conv1d_causal", dims=("batch", "tokens", "channels", "width"),
    inputs=(TensorSpec("x", X), *WEIGHTS, _state("conv_state_in")),
    outputs=(TensorSpec("y", X), TensorSpec("conv_state", STATE, comparator=Exact())),
    oracle=conv1d_causal, tolerance=None, kernel=conv1d_causal_kernel, params=PARAMS,
    batch=BatchDim("batch", ("x", "conv_state_in"), ("y", "conv_state")), **COMMON))

register(OpSpec(
    name="conv1d_causal_step", dims=("batch", "channels", "width"),
    inputs=(TensorSpec("x", X1), *WEIGHTS, _state("conv_state_in")),
    outputs=(TensorSpec("y", X1), TensorSpec("conv_state_out", STATE, comparator=Exact())),
    oracle=conv1d_causal_step, tolerance=None, kernel=conv1d_causal_step_kernel,
    params={**PARAMS, "initial_state": "given"},
    batch=BatchDim("batch", ("x", "conv_state_in"), ("y", "conv_state_out")), **COMMON))
