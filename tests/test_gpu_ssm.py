"""Mamba-2's CUDA impls on the GPU (issue 30, `gpu_impls/cuda/ssm.py`), beyond the gate
(tests/test_gpu.py runs all three over their ops' gate cases, where kp_ssm_step's contract keeps
only the model shapes: N % 32 == 0):

* `cuda:kp_ssm_step` at every instance (N / 32 in 1..8: scalar, float2 and float4 lanes), P
  that leaves rows of a warp, whole warps and float4 columns of a block empty, both layouts, the
  gate on and off; every distribution of the gate (dt fast / slow, the clamp, zero, given and
  large states) at Nemotron-3-Nano's heads; batch 64; applied T times, feeding its state back,
  it follows `ssd_scan`: every y and the final state within the scan's own bound;
* `cuda:kp_conv1d_causal_step` and `cuda:kp_conv1d_causal` at W 2, 3, 4, at channel counts
  with and without a partial 16-byte vector, over one and several 8-token spans (the halo),
  non-finite inputs (raw copies in the state), batch 64; a prefill over [0, T1) then T - T1
  steps equals one prefill for T1 in {0, 1, 3, 4, 5, T-1} (the state bit for bit, y within the
  one-prefill bound); two prefill calls equal one;
* the mutants (tests/mutants.py SSM_CUDA_MUTANTS) go red on the gate cases and in the property
  harnesses, and each passes a position-0 case (one token from a zero state): the class of bug
  a single-token test misses.

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run.
"""

from __future__ import annotations

import numpy as np
import pytest

from cases.generate import Work, plan
from cases.model import Case, make_inputs
from cases.ssd import DISTS
from runners.correctness import check, oracle_for, run_impl
from runners.verdicts import repro_command
from tests.gpu_helpers import cuda_backend as _cuda, impl as _impl

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]
NEMOTRON = {"heads": 64, "dim_p": 64, "groups": 8, "dim_n": 128}
SEQ = ("x", "dt_raw", "Bm", "Cm")


def _status(impl_id: str, case: Case) -> dict:
    return check(Work(_impl(impl_id), case, "valid"), _cuda())


def _assert_passes(impl_id: str, case: Case):
    row = _status(impl_id, case)
    assert row["status"] == "pass", (f"{row['status']} {impl_id} on {case.short()}: "
                                     f"{row['message']}\ncase: {case.to_json()}")


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def _budget(got, exact, bound) -> float:
    """The largest |got - exact| / bound over the elements (inf where an error meets a zero
    bound, or where got is NaN and exact is not)."""
    err = np.abs(np.asarray(got).astype(np.float64) - exact)
    b = np.broadcast_to(bound, err.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / b)
    return float(np.max(np.where(np.isnan(ratio), np.inf, ratio)))


# --- kp_ssm_step ----------------------------------------------------------------------------------

# (heads, dim_p, groups, dim_n): every instance N / 32 = 1..8; P below one block's 16 (hpn:
# idle warps), 4 past it (the second block: hpn one warp of 4 rows, hnp one live float4
# column), not a multiple of 4 (hpn only: a warp with 1 or 3 live rows; the hnp contract
# refuses it), whole blocks
STEP_SHAPES = ((4, 8, 2, 32), (4, 20, 2, 64), (2, 17, 1, 96), (6, 36, 3, 128), (2, 16, 2, 160),
               (2, 12, 1, 192), (2, 5, 1, 224), (2, 32, 2, 256))


def _step(dims: dict, dtype="bf16", batch=3, label="gpu", dist="normal", **params) -> Case:
    return Case.make("ssm_step", {**dims, "batch": batch}, dtype, dist, params=params,
                     label=label)


@pytest.mark.parametrize("shape", STEP_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["hpn", "hnp"])
def test_step_every_instance_and_partial_blocks(shape, layout):
    heads, dim_p, groups, dim_n = shape
    if layout == "hnp" and dim_p % 4:
        pytest.skip("hnp: P % 4 == 0 (the contract; tests/test_cuda_ssm.py)")
    dims = {"heads": heads, "dim_p": dim_p, "groups": groups, "dim_n": dim_n}
    for gate in (False, True):
        _assert_passes("cuda:kp_ssm_step", _step(dims, layout=layout, gate=gate))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("layout", ["hpn", "hnp"])
def test_step_dtypes_at_the_model_shapes(dtype, layout):
    """Nemotron-3-Nano, Mamba-2-2.7B (one group) and the seed's cell (P 128) in every dtype."""
    for dims in (NEMOTRON, {"heads": 80, "dim_p": 64, "groups": 1, "dim_n": 128},
                 {"heads": 32, "dim_p": 128, "groups": 2, "dim_n": 128}):
        _assert_passes("cuda:kp_ssm_step", _step(dims, dtype, batch=2, layout=layout,
                                                 gate=dims is NEMOTRON))


STEP_DISTS = DISTS + (("state-zero", {"initial_state": "zero"}),)


@pytest.mark.parametrize("name, params", STEP_DISTS, ids=[n for n, _ in STEP_DISTS])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("layout", ["hpn", "hnp"])
def test_step_distributions_at_nemotron_heads(name, params, dtype, layout):
    """The gate's distribution cases run at edge heads (N = 16), which the contract refuses:
    here the same distributions at Nemotron-3-Nano's heads."""
    _assert_passes("cuda:kp_ssm_step", _step(NEMOTRON, dtype, batch=2, label=f"dist:{name}",
                                             layout=layout, **params))


@pytest.mark.nightly  # batch 64 / bench shapes: the nightly tier
@pytest.mark.parametrize("layout", ["hpn", "hnp"])
def test_step_batch_64(layout):
    _assert_passes("cuda:kp_ssm_step", _step(NEMOTRON, batch=64, layout=layout, gate=True))


def _flip(layout: str):
    """[B, H, P, N] <-> the layout's state."""
    if layout == "hpn":
        return lambda a: a
    return lambda a: np.ascontiguousarray(np.swapaxes(a, -1, -2))


def _ssm_steps(impl, backend, case: Case, inputs: dict, layout: str) -> dict:
    """`impl` (op ssm_step) applied to each token of the ssd_scan `case` in turn, its state_out
    fed back as the next state_in: {"y": [B, T, H, P], "state": the last state [B, H, P, N]}."""
    dims = {k: v for k, v in case.dims.items() if k != "tokens"}
    params = {k: case.params[k] for k in ("gate", "dt_min", "dt_max", "ftz")}
    step = Case.make("ssm_step", dims, case.dtype, params={**params, "layout": layout},
                     label="steps")
    flip = _flip(layout)
    gate = case.params["gate"]
    state, ys = flip(np.asarray(inputs["h0"], dtype=np.float32)), []
    for t in range(case.dims["tokens"]):
        x = {k: (np.ascontiguousarray(v[:, t]) if k in SEQ or (k == "z" and gate) else v)
             for k, v in inputs.items() if k != "h0"}
        out = run_impl(impl, backend, step, {**x, "state_in": state})
        ys.append(out["y"])
        state = out["state_out"]
    return {"y": np.stack(ys, axis=1), "state": flip(state)}


def _scan_case(dtype: str, **params) -> Case:
    dims = {"heads": 4, "dim_p": 20, "groups": 2, "dim_n": 64, "batch": 2, "tokens": 24}
    return Case.make("ssd_scan", dims, dtype, params={"initial_state": "given", **params},
                     label="steps")


def _chain_budgets(impl_id: str, case: Case, layout: str) -> dict:
    """Per output of ssd_scan, the budget `impl_id` applied T times uses of the scan's bound
    (the step impl's numerics on CUDA)."""
    from gpu_impls.cuda.ssm import ssm_step_order
    from oracle.numerics import Numerics
    from runners.oracle_cache import reference_and_bounds

    backend, impl = _cuda(), _impl(impl_id)
    inputs = make_inputs(case)
    # the step's sum order over n for `layout` (the scan case has no layout param: the step
    # impl's per-case numerics read it from a step case)
    numerics = Numerics(ssm_step_order(layout, case.dims["dim_n"])).on("cuda")
    exact, _, bound, _ = reference_and_bounds(case, inputs, numerics,
                                              ftz=backend.flushes_subnormals)
    got = _ssm_steps(impl, backend, case, inputs, layout)
    return {name: _budget(got[name], exact[name], bound[name]) for name in ("y", "state")}


SCAN_PARAMS = (("default", {}), ("gate", {"gate": True}), ("dt-slow", {"dt": "slow"}),
               ("dt-clamp", {"dt_min": 0.01, "dt_max": 0.1}),
               ("state-large", {"initial_state": "large"}))


@pytest.mark.parametrize("name, params", SCAN_PARAMS, ids=[n for n, _ in SCAN_PARAMS])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("layout", ["hpn", "hnp"])
def test_step_applied_t_times_follows_the_scan(name, params, dtype, layout):
    """24 steps from a given state equal `ssd_scan` over the 24 tokens: every y and the final
    state within the scan's bound for this impl."""
    budgets = _chain_budgets("cuda:kp_ssm_step", _scan_case(dtype, **params), layout)
    assert max(budgets.values()) <= 1.0, budgets


# --- the conv kernels -----------------------------------------------------------------------------

def _conv(op: str, dtype: str, batch: int, channels: int, width: int = 4, tokens=None,
          dist="normal", **params) -> Case:
    dims = {"batch": batch, "channels": channels, "width": width}
    if tokens is not None:
        dims["tokens"] = tokens
    return Case.make(op, dims, dtype, dist, params={"initial_state": "given", **params},
                     label="gpu")


# channels: a partial 16-byte vector in every dtype (5, 37), whole vectors (64), Nemotron's
CHANNELS = (5, 37, 64, 6144)


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("channels", CHANNELS)
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_conv_step_widths_and_tails(width, channels, dtype):
    _assert_passes("cuda:kp_conv1d_causal_step",
                   _conv("conv1d_causal_step", dtype, 3, channels, width))


# tokens: one; 4 spans and one more token (the halo from x, a look-ahead of 1); 70: 9 spans,
# the last of 6 tokens (a partial look-ahead of 4)
@pytest.mark.parametrize("tokens", [1, 33, 70])
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("channels", [37, 64])
def test_conv_prefill_spans_widths_and_tails(tokens, width, channels):
    for dtype in ("f32", "bf16"):
        _assert_passes("cuda:kp_conv1d_causal",
                       _conv("conv1d_causal", dtype, 2, channels, width, tokens))


@pytest.mark.parametrize("op", ["conv1d_causal_step", "conv1d_causal"])
@pytest.mark.parametrize("dist", ["nonfinite", "f16_overflow"])
def test_conv_special_values(op, dist):
    """NaN and inf propagate through y and are copied bit for bit into the state (the kernels
    move the state as raw bits); silu's far tails."""
    tokens = 40 if op == "conv1d_causal" else None
    for channels in (37, 64):
        _assert_passes(f"cuda:kp_{op}", _conv(op, "bf16", 2, channels, tokens=tokens, dist=dist))


@pytest.mark.nightly  # batch 64 / bench shapes: the nightly tier
def test_conv_at_the_bench_shapes():
    """The step at batch 64 and the prefill over 2048 tokens at Nemotron-3-Nano's conv."""
    _assert_passes("cuda:kp_conv1d_causal_step", _conv("conv1d_causal_step", "bf16", 64, 6144))
    _assert_passes("cuda:kp_conv1d_causal", _conv("conv1d_causal", "bf16", 1, 6144,
                                                  tokens=2048))


TOKENS = 9
SPLITS = (0, 1, 3, 4, 5, TOKENS - 1)


def prefill_then_steps(prefill, step, be, case: Case, inputs: dict, t1: int):
    """(y [B, T, D], the final state): `prefill` over [0, t1) (none where t1 = 0) from the
    case's state, then `step` over each token of [t1, T), carrying the state."""
    state, ys = inputs["conv_state_in"], []
    if t1:
        out = run_impl(prefill, be, case.replace(tokens=t1),
                       {**inputs, "x": np.ascontiguousarray(inputs["x"][:, :t1])})
        state, ys = out["conv_state"], [out["y"]]
    dims = {k: v for k, v in case.dims.items() if k != "tokens"}
    step_case = Case.make("conv1d_causal_step", dims, case.dtype,
                          params={p: case.params[p] for p in ("bias", "silu", "ftz")})
    for t in range(t1, case.dims["tokens"]):
        out = run_impl(step, be, step_case, {**inputs, "conv_state_in": state,
                                             "x": np.ascontiguousarray(inputs["x"][:, t])})
        state = out["conv_state_out"]
        ys.append(out["y"][:, None])
    return np.concatenate(ys, axis=1), state


def _prefill_case(dtype: str, channels: int, initial_state: str) -> Case:
    return _conv("conv1d_causal", dtype, 2, channels, tokens=TOKENS, initial_state=initial_state)


@pytest.mark.parametrize("channels", [37, 64])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("initial_state", ["zero", "given"])
def test_prefill_then_steps_is_one_prefill(channels, dtype, initial_state):
    """A prefill over [0, T1) then T - T1 steps carrying the conv state give one prefill's y
    (within its bound) and final state (bit for bit), for T1 in {0, 1, 3, 4, 5, T-1} (W = 4:
    every state slot holds a prefill token, a step token or the initial state in some split)."""
    be = _cuda()
    prefill, step = _impl("cuda:kp_conv1d_causal"), _impl("cuda:kp_conv1d_causal_step")
    case = _prefill_case(dtype, channels, initial_state)
    inputs = make_inputs(case)
    exact, ref, bound = oracle_for(prefill, be, case, inputs)
    whole = run_impl(prefill, be, case, inputs)
    np.testing.assert_array_equal(_bits(whole["conv_state"]), _bits(ref["conv_state"]))
    for t1 in SPLITS:
        y, state = prefill_then_steps(prefill, step, be, case, inputs, t1)
        np.testing.assert_array_equal(_bits(state), _bits(whole["conv_state"]), err_msg=f"{t1}")
        assert _budget(y, exact["y"], bound["y"]) <= 1.0, f"T1 = {t1}"


def test_state_carries_across_two_prefill_calls():
    """Prefills over [0, T1) and then [T1, T) from its final state equal one prefill."""
    be, prefill = _cuda(), _impl("cuda:kp_conv1d_causal")
    case = _conv("conv1d_causal", "bf16", 2, 37, tokens=70, initial_state="zero")
    inputs = make_inputs(case)
    exact, _, bound = oracle_for(prefill, be, case, inputs)
    whole = run_impl(prefill, be, case, inputs)
    for t1 in (1, 3, 33):
        first = run_impl(prefill, be, case.replace(tokens=t1),
                         {**inputs, "x": np.ascontiguousarray(inputs["x"][:, :t1])})
        second = run_impl(prefill, be, case.replace(tokens=70 - t1, initial_state="given"),
                          {**inputs, "x": np.ascontiguousarray(inputs["x"][:, t1:]),
                           "conv_state_in": first["conv_state"]})
        y = np.concatenate([first["y"], second["y"]], axis=1)
        np.testing.assert_array_equal(_bits(second["conv_state"]), _bits(whole["conv_state"]))
        assert _budget(y, exact["y"], bound["y"]) <= 1.0, f"T1 = {t1}"


# --- mutants --------------------------------------------------------------------------------------

MUTANT_IMPLS = ("mutant_kp_ssm_step_softplus_twice", "mutant_kp_conv_step_double_shift",
                "mutant_kp_conv_state_skips_last_token")


@pytest.mark.parametrize("mutant", MUTANT_IMPLS)
def test_ssm_mutants_go_red_on_the_gate(mutant):
    backend = _cuda()
    impl = _impl(f"cuda:{mutant}")
    work = plan([impl], invalid=False)
    rows = [check(w, backend) for w in work]
    assert any(r["status"] == "fail" for r in rows), (
        f"{impl.id} passed all {len(rows)} cases; repro: "
        f"{repro_command(impl.id, work[0].case.id) if work else 'no case'}")


# the position-0 test of each mutant: one token from a zero state (W = 4 for the conv)
POSITION_0 = {
    "mutant_kp_ssm_step_softplus_twice": _step(NEMOTRON, batch=2, initial_state="zero"),
    "mutant_kp_conv_step_double_shift": _conv("conv1d_causal_step", "f32", 2, 37,
                                              initial_state="zero"),
    "mutant_kp_conv_state_skips_last_token": _conv("conv1d_causal", "f32", 2, 37, tokens=1,
                                                   initial_state="zero"),
}


@pytest.mark.parametrize("mutant", MUTANT_IMPLS)
def test_a_single_token_from_a_zero_state_misses_each_mutant(mutant):
    """Each mutant passes its position-0 case (the bug shows only once the state holds earlier
    tokens), and the non-mutant kernel passes it too (the case is a real check)."""
    case = POSITION_0[mutant]
    _assert_passes(f"cuda:{mutant}", case)
    _assert_passes(f"cuda:kp_{case.op}", case)


def test_the_chained_steps_catch_softplus_twice_from_a_zero_state():
    """The 'T steps == the scan' harness turns the mutant red from a zero state, where its one
    step passes: the second token decays the state by the wrong factor."""
    case = _scan_case("f32", initial_state="zero")
    assert max(_chain_budgets("cuda:mutant_kp_ssm_step_softplus_twice", case, "hpn").values()
               ) > 1.0
    assert max(_chain_budgets("cuda:kp_ssm_step", case, "hpn").values()) <= 1.0


def test_prefill_then_steps_catches_the_double_shift_from_a_zero_state():
    be = _cuda()
    prefill, step = (_impl("cuda:kp_conv1d_causal"),
                     _impl("cuda:mutant_kp_conv_step_double_shift"))
    case = _prefill_case("f32", 37, "zero")
    inputs = make_inputs(case)
    exact, ref, bound = oracle_for(prefill, be, case, inputs)
    y, state = prefill_then_steps(prefill, step, be, case, inputs, 0)
    assert _budget(y, exact["y"], bound["y"]) > 1.0
    assert not np.array_equal(_bits(state), _bits(ref["conv_state"]))


def test_state_skips_last_token_caught_past_one_token():
    """The prefill mutant's final state is wrong from two tokens on (T = 5, a zero state), right
    at one: the gate's T >= 2 cases catch it."""
    row = _status("cuda:mutant_kp_conv_state_skips_last_token",
                  _conv("conv1d_causal", "f32", 2, 37, tokens=5, initial_state="zero"))
    assert row["status"] == "fail", row["message"]
