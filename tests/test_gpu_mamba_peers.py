"""The Mamba-2 peer impls on the GPU (`gpu_impls/torch/mamba_peers.py`: mamba_ssm's Triton
kernels, causal_conv1d's CUDA kernels), beyond the gate (tests/test_gpu.py runs them over their
ops' gate cases, which their contracts thin out: dots="T" only, channels % 8 == 0):

* `torch:mamba_chunk_scan_combined` against `ssd_chunked`'s oracle: T of one token, one chunk
  and past it, chunks of 128 and 256, every distribution, the gate and the dt clamp, a batch,
  odd heads, Nemotron-3-Nano's and a Mamba-2-2.7B-like layer (bf16, 17 tokens);
* `torch:mamba_selective_state_update` against `ssm_step`'s: state sizes across its block
  choices (N 5, 16, 64, 128, 256), the distributions, the model shapes;
* `torch:causal_conv1d_fn` against `conv1d_causal`'s over widths 2 to 4 and T around its
  64-token tiles (a final state from a last tile of fewer than W-1 tokens), both states, the
  params; `torch:causal_conv1d_update` against `conv1d_causal_step`'s at any channel count;
* the two conv peers together: a prefill over [0, T1) then decode steps carrying the state
  equal one prefill (the state bit for bit, y within the prefill's bound) for T1 in
  {0, 1, 3, 4, 5, T-1}: every ring position passes through both libraries.

Each skips with its impl's reason where its library is not installed (or causal_conv1d's
extension not built): `scripts/mamba_peer_install.sh`. `pytest -m gpu` selects it.
"""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest

import gpu_impls
from cases.generate import Work
from cases.model import Case, make_inputs
from runners.correctness import check, run_impl

pytestmark = pytest.mark.gpu
CHUNK_SCAN = "torch:mamba_chunk_scan_combined"
STATE_UPDATE = "torch:mamba_selective_state_update"
CONV_FN = "torch:causal_conv1d_fn"
CONV_UPDATE = "torch:causal_conv1d_update"
# (heads, dim_p, groups, dim_n), as cases/ssd.py's shapes
EDGE = {"heads": 4, "dim_p": 8, "groups": 2, "dim_n": 16}
ODD = {"heads": 6, "dim_p": 3, "groups": 3, "dim_n": 5}
NARROW = {"heads": 2, "dim_p": 4, "groups": 1, "dim_n": 8}
NEMOTRON = {"heads": 64, "dim_p": 64, "groups": 8, "dim_n": 128}
MAMBA2 = {"heads": 80, "dim_p": 64, "groups": 1, "dim_n": 128}
NANO_CONV = 6144  # Nemotron-3-Nano's conv channels


def _peer(impl_id: str):
    impl = gpu_impls.impls()[impl_id]
    ok, why = impl.available(gpu_impls.backend("torch"))
    if not ok:
        pytest.skip(why)
    return impl


def _assert_passes(impl_id: str, case: Case):
    row = check(Work(_peer(impl_id), case, "valid"), gpu_impls.backend("torch"))
    assert row["status"] == "pass", (f"{row['status']} {impl_id} on {case.short()} "
                                     f"{dict(case.param_items)}: {row['message']}\n"
                                     f"case: {case.to_json()}")


# --- mamba_chunk_scan_combined -----------------------------------------------------------------

GIVEN = {"initial_state": "given"}
CHUNKED = ([("edge", EDGE, 1, t, GIVEN) for t in (1, 63, 64, 65, 130)]
           + [(f"edge-{name}", EDGE, 1, 65, params) for name, params in (
               ("zero-state", {}), ("dt-fast", {"dt": "fast"}), ("dt-slow", {"dt": "slow"}),
               ("state-large", {"initial_state": "large"}), ("gate", {"gate": True}),
               ("dt-clamp", {"dt_min": 0.01, "dt_max": 0.1}))]
           + [("chunk128", NARROW, 1, 131, {"chunk": 128, **GIVEN}),
              ("chunk256", NARROW, 1, 259, {"chunk": 256, **GIVEN}),
              ("batch2", EDGE, 2, 33, GIVEN), ("odd", ODD, 1, 70, {"gate": True, **GIVEN})])
# the model layers in bf16 over 17 tokens (the bound's interval model holds Q² H P values: ~5 s)
CHUNKED_MODELS = [("nemotron", NEMOTRON, 1, 17, {"gate": True, **GIVEN}),
                  ("mamba2", MAMBA2, 1, 17, GIVEN)]
CHUNKED_WORK = [(*c, dtype) for c in CHUNKED for dtype in ("bf16", "f16")]
CHUNKED_WORK += [(*c, "bf16") for c in CHUNKED_MODELS]


@pytest.mark.parametrize("label, heads, batch, tokens, params, dtype", CHUNKED_WORK,
                         ids=[f"{c[0]}-t{c[3]}-{c[5]}" for c in CHUNKED_WORK])
def test_chunk_scan_against_the_chunked_oracle(label, heads, batch, tokens, params, dtype):
    case = Case.make("ssd_chunked", {**heads, "batch": batch, "tokens": tokens}, dtype,
                     params={"dots": "T", **params}, label=label)
    _assert_passes(CHUNK_SCAN, case)


# --- selective_state_update --------------------------------------------------------------------

STEPS = ([("edge", EDGE, 4, {}), ("odd", ODD, 2, {"gate": True})]
         + [(f"n{n}", {**NARROW, "dim_n": n}, 3, {}) for n in (64, 128, 256)]
         + [(f"edge-{name}", EDGE, 4, params) for name, params in (
             ("dt-fast", {"dt": "fast"}), ("dt-slow", {"dt": "slow"}), ("gate", {"gate": True}),
             ("state-large", {"initial_state": "large"}),
             ("state-zero", {"initial_state": "zero"}))]
         + [("nemotron", NEMOTRON, 8, {"gate": True}), ("mamba2", MAMBA2, 2, {})])


@pytest.mark.parametrize("label, heads, batch, params", STEPS, ids=[s[0] for s in STEPS])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_state_update_against_the_step_oracle(label, heads, batch, params, dtype):
    case = Case.make("ssm_step", {**heads, "batch": batch}, dtype, params=params, label=label)
    _assert_passes(STATE_UPDATE, case)


# --- causal_conv1d -------------------------------------------------------------------------------

CONV_TOKENS = (1, 2, 3, 4, 5, 64, 65, 130)  # below W-1, W-1, W, a 64-token tile and past it


@pytest.mark.parametrize("width, tokens", list(product((2, 3, 4), CONV_TOKENS)))
@pytest.mark.parametrize("initial_state", ["zero", "given"])
def test_conv_fn_over_widths_and_tile_edges(width, tokens, initial_state):
    case = Case.make("conv1d_causal", {"batch": 2, "tokens": tokens, "channels": 40,
                                       "width": width}, "f32",
                     params={"initial_state": initial_state})
    _assert_passes(CONV_FN, case)


CONV_PARAMS = (("default", {}), ("no-silu", {"silu": False}), ("no-bias", {"bias": False}))


@pytest.mark.parametrize("name, params", CONV_PARAMS, ids=[p[0] for p in CONV_PARAMS])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_conv_fn_params_and_dtypes(name, params, dtype):
    for channels, tokens in ((8, 65), (NANO_CONV, 64)):
        case = Case.make("conv1d_causal", {"batch": 1, "tokens": tokens, "channels": channels,
                                           "width": 4}, dtype,
                         params={"initial_state": "given", **params})
        _assert_passes(CONV_FN, case)


@pytest.mark.parametrize("channels, width", list(product((5, 37, NANO_CONV), (2, 3, 4))))
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_conv_update_against_the_step_oracle(channels, width, dtype):
    for params in ({}, {"silu": False, "bias": False}):
        case = Case.make("conv1d_causal_step", {"batch": 3, "channels": channels,
                                                "width": width}, dtype, params=params)
        _assert_passes(CONV_UPDATE, case)


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def _prefill_then_steps(case: Case, inputs: dict, t1: int):
    """(y [B, T, D], the final state): causal_conv1d_fn over tokens [0, t1) (none where
    t1 = 0) from the case's state, then causal_conv1d_update over each token of [t1, T)."""
    be = gpu_impls.backend("torch")
    state, ys = inputs["conv_state_in"], []
    if t1:
        out = run_impl(_peer(CONV_FN), be, case.replace(tokens=t1),
                       {**inputs, "x": inputs["x"][:, :t1]})
        state, ys = out["conv_state"], [out["y"]]
    dims = {k: case.dims[k] for k in ("batch", "channels", "width")}
    step = Case.make("conv1d_causal_step", dims, case.dtype,
                     params={p: case.params[p] for p in ("bias", "silu")})
    for t in range(t1, case.dims["tokens"]):
        out = run_impl(_peer(CONV_UPDATE), be, step,
                       {**inputs, "x": np.ascontiguousarray(inputs["x"][:, t]),
                        "conv_state_in": state})
        state = out["conv_state_out"]
        ys.append(out["y"][:, None])
    return np.concatenate(ys, axis=1), state


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("initial_state", ["zero", "given"])
def test_conv_prefill_then_steps_is_one_prefill(dtype, initial_state):
    """causal_conv1d_fn over [0, T1), then causal_conv1d_update over [T1, T) carrying the
    state: the final state bit for bit the oracle's (copies of inputs), y within one prefill's
    bound (the step computes each token's y as the prefill does), T1 in {0, 1, 3, 4, 5, T-1}."""
    impl = _peer(CONV_FN)
    _peer(CONV_UPDATE)
    tokens = 9
    case = Case.make("conv1d_causal", {"batch": 2, "tokens": tokens, "channels": 40, "width": 4},
                     dtype, params={"initial_state": initial_state})
    inputs = make_inputs(case)
    exact, ref = case.spec.reference(inputs, case)
    bound = case.spec.bounds(inputs, exact, case, impl.numerics_for(case))["y"]
    for t1 in (0, 1, 3, 4, 5, tokens - 1):
        y, state = _prefill_then_steps(case, inputs, t1)
        np.testing.assert_array_equal(_bits(state), _bits(ref["conv_state"]), err_msg=f"T1 {t1}")
        err = np.abs(np.asarray(y).astype(np.float64) - exact["y"])
        assert np.all(err <= bound), f"T1 = {t1}: budget {np.max(err / bound):.3f}"
