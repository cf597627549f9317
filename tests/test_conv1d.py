"""Mamba-2's causal conv1d (`oracle/conv1d.py`) on CPU: a prefill then decode steps equal one
prefill for every split (each state position exercised at W = 4), the state carries across two
prefill calls, the bounds against the seed kernels' tolerances, the contract's one rounding, the
domain at case load, and the mutants going red where a position-0 test stays green. (The gated
group RMSNorm is a norm: `tests/test_norms_oracle.py` and `tests/test_bounds_corners.py` cover
it with its family.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import gpu_impls
from cases.casefile import CaseFileError, load_cases
from cases.generate import Work, gate_cases
from cases.model import Case, make_inputs
from oracle.numerics import Numerics
from runners.correctness import check, run_impl
from verbs.cli import main

MUTANTS = str(Path(__file__).with_name("mutants.py"))
TOKENS = 9
SPLITS = (0, 1, 3, 4, 5, TOKENS - 1)
DIMS = {"batch": 2, "channels": 37, "width": 4}
# One function serves MLX's prefill and step (mx.conv1d over cat(state, x)): bit for bit. Torch's
# F.conv1d sums in an order that depends on the call's length (measured on CPU, f32: a prefill
# over 9 tokens and 9 one-token calls differ in the last bit): within the bound there.
BIT_IDENTICAL = {"mlx": True, "torch": False}


def _prefill(dtype: str, tokens: int = TOKENS, **params) -> Case:
    return Case.make("conv1d_causal", {**DIMS, "tokens": tokens}, dtype,
                     params={"initial_state": "given", **params})


def _impls(backend: str):
    pytest.importorskip(backend if backend == "torch" else "mlx.core")
    all_ = gpu_impls.impls()
    return (all_[f"{backend}:conv1d_causal"], all_[f"{backend}:conv1d_causal_step"],
            gpu_impls.backend(backend))


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def _sliced(inputs: dict, lo: int, hi: int, state) -> dict:
    return {**inputs, "x": inputs["x"][:, lo:hi], "conv_state_in": state}


def prefill_then_steps(prefill, step, be, case: Case, inputs: dict, t1: int):
    """(y [B, T, D], the final state): `prefill` over tokens [0, t1) (none where t1 = 0) from
    the case's state, then `step` over each token of [t1, T), carrying the state."""
    state, ys = inputs["conv_state_in"], []
    if t1:
        out = run_impl(prefill, be, case.replace(tokens=t1), _sliced(inputs, 0, t1, state))
        state, ys = out["conv_state"], [out["y"]]
    step_case = Case.make("conv1d_causal_step", DIMS, case.dtype,
                          params={p: case.params[p] for p in ("bias", "silu")})
    for t in range(t1, case.dims["tokens"]):
        out = run_impl(step, be, step_case, {**_sliced(inputs, t, t + 1, state),
                                             "x": inputs["x"][:, t]})
        state = out["conv_state_out"]
        ys.append(out["y"][:, None])
    return np.concatenate(ys, axis=1), state


def _budget(y, case: Case, inputs: dict, impl) -> float:
    """The share of the one-prefill bound that `y` uses (the impl's numerics on its backend)."""
    exact = case.spec.reference(inputs, case)[0]
    bound = case.spec.bounds(inputs, exact, case, impl.numerics_for(case))["y"]
    err = np.abs(np.asarray(y).astype(np.float64) - exact["y"])
    return float(np.max(np.where(err == 0, 0.0, err / bound)))


# --- properties ----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["torch", "mlx"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("initial_state", ["zero", "given"])
def test_prefill_then_steps_is_one_prefill(backend, dtype, initial_state):
    """A prefill over [0, T1) and then T - T1 decode steps carrying the conv state give one
    prefill's y and final state, for T1 in {0, 1, 3, 4, 5, T-1} (W = 4: the state's W-1 slots
    each hold a prefill token, a step token or the initial state in some split). The state bit
    for bit (it is copies); y bit for bit where prefill and step share their arithmetic (MLX),
    else within the one-prefill bound."""
    prefill, step, be = _impls(backend)
    case = _prefill(dtype, initial_state=initial_state)
    inputs = make_inputs(case)
    whole = run_impl(prefill, be, case, inputs)
    ref = case.spec.reference(inputs, case)[1]
    np.testing.assert_array_equal(_bits(whole["conv_state"]), _bits(ref["conv_state"]))
    for t1 in SPLITS:
        y, state = prefill_then_steps(prefill, step, be, case, inputs, t1)
        np.testing.assert_array_equal(_bits(state), _bits(whole["conv_state"]), err_msg=f"{t1}")
        if BIT_IDENTICAL[backend]:
            np.testing.assert_array_equal(_bits(y), _bits(whole["y"]), err_msg=f"T1 = {t1}")
        assert _budget(y, case, inputs, prefill) <= 1.0, f"T1 = {t1}"


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_state_carries_across_two_prefill_calls(backend):
    """Prefills over [0, T1) and then [T1, T) from its final state equal one prefill over
    [0, T) (from a zero state: the second call is handed a state where the first had none)."""
    prefill, _, be = _impls(backend)
    case = _prefill("f32", initial_state="zero")
    inputs = make_inputs(case)
    whole = run_impl(prefill, be, case, inputs)
    for t1 in (1, 3, 5):
        first = run_impl(prefill, be, case.replace(tokens=t1),
                         _sliced(inputs, 0, t1, inputs["conv_state_in"]))
        second = run_impl(prefill, be, case.replace(tokens=TOKENS - t1, initial_state="given"),
                          _sliced(inputs, t1, TOKENS, first["conv_state"]))
        y = np.concatenate([first["y"], second["y"]], axis=1)
        np.testing.assert_array_equal(_bits(second["conv_state"]), _bits(whole["conv_state"]))
        if BIT_IDENTICAL[backend]:
            np.testing.assert_array_equal(_bits(y), _bits(whole["y"]))
        assert _budget(y, case, inputs, prefill) <= 1.0


# --- tolerances ----------------------------------------------------------------------------------

# The seeds' test_kernel tolerances [f32, f16, bf16] (docs/seed_kernels.md): conv1d_causal_step
# (the caller applies SiLU) and
# ffai_conv1d_causal_step_silu_cast_many (SiLU in the kernel)
SEED_TOLERANCE = {False: {"f32": 1e-5, "f16": 5e-3, "bf16": 5e-2},
                  True: {"f32": 1e-3, "f16": 8e-3, "bf16": 4e-2}}


@pytest.mark.parametrize("op", ["conv1d_causal", "conv1d_causal_step"])
def test_bounds_are_within_the_seed_tolerances(op):
    """On every normal-data gate case, under CUDA's function ULPs (the seeds run there) and
    MLX's (96 ULP exp), the derived bound of y is below the seed kernel's tolerance for its
    dtype (with SiLU: the fused kernel's; without: the plain step's)."""
    for case in gate_cases(op):
        if case.dist != "normal":
            continue
        inputs = make_inputs(case)
        exact = case.spec.reference(inputs, case)[0]
        tol = SEED_TOLERANCE[case.params["silu"]][case.dtype]
        for backend in ("cuda", "mlx"):
            bound = case.spec.bounds(inputs, exact, case, Numerics().on(backend))["y"]
            assert float(np.max(bound)) <= tol, (case.short(), backend)


def test_the_sum_rounded_to_t_before_silu_fails():
    """`causal_conv1d_ref` run in bf16 (F.conv1d's output rounded to bf16, then F.silu rounding
    again) has a rounding the contract does not admit: it fails Nemotron-3-Nano's bf16 case."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    case = next(c for c in gate_cases("conv1d_causal")
                if c.label == "preset:nemotron-3-nano" and c.dtype == "bf16")
    inputs = make_inputs(case)
    t = {k: gpu_impls.backend("torch").to_device(v) for k, v in inputs.items()}
    xx = torch.cat([t["conv_state_in"], t["x"]], dim=1).transpose(1, 2)
    y = F.silu(F.conv1d(xx, t["weight"].t()[:, None, :], t["bias"], groups=xx.shape[1]))
    y = y.transpose(1, 2).float().numpy()
    assert _budget(y, case, inputs, gpu_impls.impls()["torch:conv1d_causal"]) > 1.0


# --- cases ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("op, dims, message", [
    ("conv1d_causal_step", {"batch": 1, "channels": 8, "width": 1}, "width=1: a causal conv"),
    ("gated_group_rmsnorm", {"rows": 1, "dim": 10, "groups": 4},
     "dim=10 is not a multiple of groups=4")])
def test_a_case_outside_the_domain_is_refused_at_load(tmp_path, op, dims, message):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([{"op": op, "dtype": "bf16", "dims": dims}]))
    with pytest.raises(CaseFileError, match=message):
        load_cases(path)


# --- mutants -------------------------------------------------------------------------------------

MUTANT_OPS = {"mutant_conv_step_double_shift": "conv1d_causal_step",
              "mutant_conv_state_skips_last_token": "conv1d_causal"}


def _load_mutants():
    main(["--plugin", MUTANTS, "ops"])  # registers them, as `check --plugin` does
    return gpu_impls.impls()


@pytest.mark.parametrize("mutant", sorted(MUTANT_OPS))
def test_each_conv_mutant_fails_check(tmp_path, mutant, capsys):
    rc = main(["--store", str(tmp_path / "store"), "--plugin", MUTANTS, "check", "--impl",
               f"torch:{mutant}", "--preset", "edge", "--dtype", "f32", "--show-failures", "1"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert f"--impl torch:{mutant}" in out


@pytest.mark.parametrize("mutant", sorted(MUTANT_OPS))
def test_a_single_token_from_a_zero_state_misses_each_conv_mutant(mutant, capsys):
    """The position-0 test: one token of a fresh sequence (W = 4). Both mutants pass it, y and
    the state: the bugs show only once the state holds earlier tokens."""
    impl = _load_mutants()[f"torch:{mutant}"]
    capsys.readouterr()
    op = MUTANT_OPS[mutant]
    dims = DIMS if op == "conv1d_causal_step" else {**DIMS, "tokens": 1}
    case = Case.make(op, dims, "f32", params={"initial_state": "zero"})
    row = check(Work(impl, case, "valid"), gpu_impls.backend("torch"))
    assert row["status"] == "pass", row["message"]


def test_prefill_then_steps_catches_the_double_shift():
    """The property's own harness turns the double-shift step red from a zero state (the state
    after the first step is right, the second step's is not)."""
    prefill, _, be = _impls("torch")
    step = _load_mutants()["torch:mutant_conv_step_double_shift"]
    case = _prefill("f32", initial_state="zero")
    inputs = make_inputs(case)
    y, state = prefill_then_steps(prefill, step, be, case, inputs, 0)
    assert _budget(y, case, inputs, prefill) > 1.0
    assert not np.array_equal(_bits(state), _bits(case.spec.reference(inputs, case)[1]
                                                  ["conv_state"]))
