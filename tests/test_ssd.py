"""Mamba-2's scans (issue 30; `oracle/ssd.py`, `oracle/ssd_chunked.py`) on CPU: the float64 oracles
against each other, the properties (T decode steps equal the scan, chunk-size invariance, packed
sequences equal separate ones, the state carries across calls, the chunked form within its
bound of the recurrence), the chunked bound's worst admissible kernels across chunks, the case
domain, and the mutants going red where a position-0 test stays green. The bound's growth with
T up to 16384 is slow: set KPARITY_SLOW=1 (`scripts/ssd_chunked_budget.py` prints it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import gpu_impls
from cases.casefile import CaseFileError, load_cases
from cases.model import Case, make_inputs
from oracle import ssd_math
from oracle.numerics import Choices, Model, Numerics, Worst, adverse_store
from oracle.ssd_chunked import chunked_kernel
from runners.correctness import Work, check, run_impl
from tests.recurrence_checks import assert_state_carries, bits
from verbs.cli import main

MUTANTS = str(Path(__file__).with_name("mutants.py"))
HEADS = {"heads": 4, "dim_p": 8, "groups": 2, "dim_n": 16}  # cases/ssd.py's edge heads
NARROW = {"heads": 2, "dim_p": 4, "groups": 1, "dim_n": 8}
BACKENDS = ["torch", "mlx"]
SEQ = ("x", "dt_raw", "Bm", "Cm", "z")


def _scan(tokens, dtype="bf16", op="ssd_scan", batch=1, heads=HEADS, **params) -> Case:
    return Case.make(op, {**heads, "batch": batch, "tokens": tokens}, dtype, params=params)


def _impl(backend: str, op: str):
    pytest.importorskip(backend if backend == "torch" else "mlx.core")
    return gpu_impls.impls()[f"{backend}:{op}"], gpu_impls.backend(backend)


def _sliced(inputs: dict, lo: int, hi: int, h0) -> dict:
    """Scan inputs over tokens [lo, hi) from state h0 (the empty z of a gateless case kept)."""
    return {**{k: (v[:, lo:hi] if k in SEQ and np.size(v) else v) for k, v in inputs.items()},
            "h0": h0}


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _recurrence(inputs: dict, case: Case):
    """The float64 recurrence (the ground truth) on the stored inputs: `ssd_scan`'s oracle."""
    scan = Case.make("ssd_scan", case.dims, case.dtype, case.dist, params={
        k: v for k, v in case.param_items if k not in ("chunk", "dots")})
    return scan.spec.oracle(inputs, scan)


# --- the float64 oracles -----------------------------------------------------------------------

def test_the_chunk_math_is_the_recurrence_in_float64():
    """`ssd_math.chunked` (the stable segsum, chunk states, passing, Y_off) equals the recurrence
    to float64 rounding, T not a multiple of the chunk, with a gate and a given state; the stable
    segsum is the masked cumsum, −inf above the diagonal."""
    case = _scan(150, "f32", gate=True, initial_state="given")
    x = {k: _f64(v) for k, v in make_inputs(case).items()}
    dt = ssd_math.time_step(x["dt_raw"], x["dt_bias"])
    args = (x["x"], dt, ssd_math.decay_rate(x["A_log"]), x["Bm"], x["Cm"], x["D"])
    y, s = ssd_math.recurrence(*args, z=x["z"], h0=x["h0"])
    for chunk in (64, 128):
        got = ssd_math.chunked(*args, chunk, z=x["z"], h0=x["h0"])
        np.testing.assert_allclose(got["y"], y, rtol=1e-11, atol=1e-11 * np.abs(y).max())
        np.testing.assert_allclose(got["state"], s, rtol=1e-11, atol=1e-13)
    a = np.array([-1.0, -2.0, -0.5, -4.0])
    seg = ssd_math.segsum(a)
    assert seg[3, 1] == a[2] + a[3] and seg[3, 0] == a[1] + a[2] + a[3] and seg[2, 2] == 0
    assert np.isneginf(seg[1, 2])


# --- properties --------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["hpn", "hnp"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_ssm_step_applied_t_times_is_ssd_scan_bit_for_bit(backend, layout):
    """T calls of <backend>:ssm_step, each handed the previous state (in its layout), give
    <backend>:ssd_scan's y and final state bit for bit (the same step, declared so in the
    impls' docstrings): a batch of 2, a gate, T = 65 crossing a chunk of 64."""
    case = _scan(65, batch=2, gate=True, initial_state="given")
    inputs = make_inputs(case)
    scan, be = _impl(backend, "ssd_scan")
    step, _ = _impl(backend, "ssm_step")
    whole = run_impl(scan, be, case, inputs)
    step_case = Case.make("ssm_step", {**HEADS, "batch": 2}, case.dtype,
                          params={"gate": True, "layout": layout})
    flip = (lambda a: np.ascontiguousarray(np.swapaxes(a, -1, -2))) if layout == "hnp" else \
        (lambda a: a)
    state, ys = flip(inputs["h0"]), []
    for t in range(case.dims["tokens"]):
        out = run_impl(step, be, step_case, {
            **{k: (inputs[k][:, t] if k in SEQ else inputs[k]) for k in inputs if k != "h0"},
            "state_in": state})
        state = out["state_out"]
        ys.append(out["y"])
    np.testing.assert_array_equal(bits(np.stack(ys, axis=1)), bits(whole["y"]))
    np.testing.assert_array_equal(bits(flip(state)), bits(whole["state"]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_carries_across_two_calls(backend):
    """[0, T1) then [T1, T) from its final state equals one call over [0, T): bit for bit for each
    scan impl (its loop does not know where the call began), within float64 noise for the
    oracle."""
    case = _scan(64, "f32", initial_state="given")
    inputs = make_inputs(case)
    impl, be = _impl(backend, "ssd_scan")
    assert_state_carries(case, inputs, impl, be, _sliced, "y", t1=23, oracle_atol=1e-13)


def test_varlen_equals_the_sequences_run_separately():
    """torch:ssd_scan_varlen over packed sequences of (5, 1, 3) tokens equals torch:ssd_scan on
    each sequence alone from its own h0 row, bit for bit; the oracles likewise."""
    case = Case.make("ssd_scan_varlen", HEADS, "bf16",
                     params={"segments": (5, 1, 3), "gate": True, "initial_state": "given"})
    inputs = make_inputs(case)
    varlen, be = _impl("torch", "ssd_scan_varlen")
    scan, _ = _impl("torch", "ssd_scan")
    packed = run_impl(varlen, be, case, inputs)
    exact = case.spec.oracle(inputs, case)
    lo = 0
    for s, n in enumerate((5, 1, 3)):
        one = _scan(n, gate=True)
        seq = {k: v for k, v in _sliced(inputs, lo, lo + n, inputs["h0"][s:s + 1]).items()
               if k != "cu_seqlens"}
        got = run_impl(scan, be, one, seq)
        np.testing.assert_array_equal(bits(got["y"]), bits(packed["y"][:, lo:lo + n]))
        np.testing.assert_array_equal(bits(got["state"]), bits(packed["states"][s:s + 1]))
        want = one.spec.oracle(seq, one)
        np.testing.assert_array_equal(want["y"], exact["y"][:, lo:lo + n])
        np.testing.assert_array_equal(want["state"], exact["states"][s:s + 1])
        lo += n


def _chunked_run(case: Case, inputs: dict) -> tuple[dict, dict, dict]:
    """(torch:ssd_chunked's outputs, the oracle's exact outputs, the bound for torch)."""
    impl, be = _impl("torch", "ssd_chunked")
    exact = case.spec.reference(inputs, case)[0]
    bound = case.spec.bounds(inputs, exact, case, impl.numerics.on("torch"))
    return {k: _f64(v) for k, v in run_impl(impl, be, case, inputs).items()}, exact, bound


def test_chunk_size_invariance():
    """Chunks of 64, 128 and 256 over T = 300 (a tail in each): torch:ssd_chunked's results are
    within the sum of their bounds of each other (each within its own of one exact answer: the
    chunk oracles agree to float64 noise), and not bit-identical (the roundings differ)."""
    base = _scan(300, op="ssd_chunked", heads=NARROW, initial_state="given")
    inputs = make_inputs(base)  # one draw for every chunk size
    runs = {c: _chunked_run(base.replace(chunk=c), inputs) for c in (64, 128, 256)}
    for a, b in ((64, 128), (64, 256), (128, 256)):
        (ga, ea, ba), (gb, eb, bb) = runs[a], runs[b]
        for name in ("y", "state"):
            assert np.all(np.abs(ga[name] - gb[name]) <= ba[name] + bb[name]), (a, b, name)
            np.testing.assert_allclose(ea[name], eb[name], rtol=1e-11, atol=1e-12)
    assert not np.array_equal(runs[64][0]["state"], runs[256][0]["state"])


def _truth_budget(got: dict, exact: dict, bound: dict, truth: dict) -> float:
    """max |got − truth| / (bound + |exact − truth|) over the outputs: the chunked form measured
    against the recurrence, its bound widened by the oracles' float64 difference."""
    return max(float(np.max(np.abs(got[n] - truth[n]) / (bound[n] + np.abs(exact[n] - truth[n]))))
               for n in ("y", "state"))


@pytest.mark.parametrize("tokens", [1, 63, 64, 65, 130])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_chunked_is_within_its_bound_of_the_recurrence(tokens, dtype):
    """torch:ssd_chunked (the listing) is within the chunked bound of the float64 recurrence,
    T = 1 and T not a multiple of 64 included, slow decay (the state remembers: errors
    accumulate); and the bound is not vacuous: in f32 the listing uses at least 1 % of it."""
    case = _scan(tokens, dtype, op="ssd_chunked", initial_state="given", dt="slow")
    inputs = make_inputs(case)
    got, exact, bound = _chunked_run(case, inputs)
    budget = _truth_budget(got, exact, bound, _recurrence(inputs, case))
    assert budget <= 1.0
    if dtype == "f32":
        assert budget > 0.01


def test_worst_admissible_chunked_kernels_stay_within_the_bound_across_chunks():
    """The chunked kernel model in the worst-kernel arithmetic (every rounding off by its whole
    charge: all up, all down, alternating; the kernel path's form and the listing's, whose
    passing is a matrix over the chunks) over three chunks: within the bound, and using a fair
    share of it (the corner test runs one chunk only)."""
    case = _scan(150, "f32", op="ssd_chunked", heads=NARROW, initial_state="given", dt="slow")
    inputs = make_inputs(case)
    exact = case.spec.reference(inputs, case)[0]
    numerics = Numerics().on("torch")
    bound = case.spec.bounds(inputs, exact, case, numerics)
    budgets = []
    for form in (0, 1):
        for flips in ((), range(1 << 16), range(0, 1 << 16, 2)):
            arith = Worst(Model(False, numerics), Choices(flips=flips, form=form))
            with np.errstate(all="ignore"):
                values = chunked_kernel(arith, inputs, case)
            budgets.append(max(float(np.max(np.abs(adverse_store(values[t.name], t.dtype(case))
                                                   - exact[t.name]) / bound[t.name]))
                               for t in case.spec.outputs))
    assert max(budgets) <= 1.0, budgets
    assert min(budgets) > 0.1, budgets


@pytest.mark.parametrize("split", [64, 65])
def test_chunked_state_carries_across_two_calls(split):
    """torch:ssd_chunked over [0, T1) then [T1, T) from its f32 state: each part within its bound
    of the recurrence, the second's widened by what the carried state's error can do (through
    Y_off: Σ_n |C_n| times the first part's state bound; the state itself: that bound)."""
    case = _scan(130, op="ssd_chunked", initial_state="given")
    inputs = make_inputs(case)
    truth = _recurrence(inputs, case)
    c1, c2 = case.replace(tokens=split), case.replace(tokens=130 - split)
    got1, ex1, b1 = _chunked_run(c1, _sliced(inputs, 0, split, inputs["h0"]))
    second = _sliced(inputs, split, 130, got1["state"].astype(np.float32))
    got2, ex2, b2 = _chunked_run(c2, second)
    carried = b1["state"].max()
    reach = np.abs(_f64(inputs["Cm"][:, split:])).sum(-1).max() * carried
    assert np.all(np.abs(got1["y"] - truth["y"][:, :split]) <= b1["y"] + 1e-12)
    assert np.all(np.abs(got2["y"] - truth["y"][:, split:]) <= b2["y"] + reach)
    assert np.all(np.abs(got2["state"] - truth["state"]) <= b2["state"] + carried)


# --- the seed's and upstream's tolerances ------------------------------------------------------

# mamba_ssm's `tests/ops/triton/test_selective_state_update.py`, (rtol, atol) per dtype
SSU_TOLERANCE = {"f32": (3e-4, 1e-3), "f16": (5e-3, 1e-2), "bf16": (1e-2, 5e-2)}


@pytest.mark.parametrize("dtype", sorted(SSU_TOLERANCE))
def test_step_bounds_on_the_model_shapes_are_within_mamba_ssms_tolerances(dtype):
    """The decode step at Nemotron-3-Nano's heads (H 64, P 64, G 8, N 128) under CUDA's function
    ULPs: the bound on every element of y and the state is below selective_state_update's test
    tolerance atol + rtol |y| (the docstring of `oracle/ssd.py` has the scan's and the chunked
    form's, which are not)."""
    rtol, atol = SSU_TOLERANCE[dtype]
    case = Case.make("ssm_step", {"batch": 1, "heads": 64, "dim_p": 64, "groups": 8,
                                  "dim_n": 128}, dtype)
    inputs = make_inputs(case)
    exact = case.spec.reference(inputs, case)[0]
    bound = case.spec.bounds(inputs, exact, case, Numerics().on("cuda"))
    for name in ("y", "state_out"):
        assert np.all(bound[name] <= atol + rtol * np.abs(exact[name])), name


# --- the case domain ---------------------------------------------------------------------------

def test_heads_not_a_multiple_of_groups_is_refused_at_case_load(tmp_path):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([{"op": "ssm_step", "dtype": "bf16", "dims": {
        "batch": 1, "heads": 6, "dim_p": 8, "groups": 4, "dim_n": 16}}]))
    with pytest.raises(CaseFileError, match="heads=6 is not a multiple of groups=4"):
        load_cases(path)


def test_non_finite_inputs_are_outside_the_chunked_domain(tmp_path):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([{"op": "ssd_chunked", "dtype": "f32", "dist": "nonfinite",
                                 "dims": {**HEADS, "batch": 1, "tokens": 5}}]))
    with pytest.raises(CaseFileError, match="dist=nonfinite.*run the non-finite cases on ssd_scan"):
        load_cases(path)


# --- mutants -----------------------------------------------------------------------------------

def _status(impl_id: str, case: Case) -> str:
    gpu_impls.load_plugin(MUTANTS)
    return check(Work(gpu_impls.impls()[impl_id], case, "valid"), gpu_impls.backend("torch"))[
        "status"]


# (mutant, its op's gate preset that catches it, a position-0 case it passes)
SSD_MUTANTS = {
    "mutant_ssd_softplus_twice": ("edge-dt-slow", _scan(1, "f32")),
    "mutant_ssd_varlen_no_reset": ("edge", Case.make("ssd_scan_varlen", HEADS, "f32", params={
        "segments": (7,), "initial_state": "given"})),
    "mutant_ssd_chunked_d_first_chunk": ("edge-dt-fast", _scan(64, "f32", op="ssd_chunked")),
    "mutant_ssd_group_modulo": ("edge-state-large", _scan(1, "f32", heads={**HEADS,
                                                                         "groups": 1})),
}


@pytest.mark.parametrize("mutant", sorted(SSD_MUTANTS))
def test_each_ssd_mutant_fails_check_where_a_position_0_test_passes(tmp_path, mutant, capsys):
    """Each mutant goes red on a gate preset of its op, with its repro command; and passes a case
    a position-0 test would use: one token from a zero state (softplus twice: the decay multiplies
    a zero state), a single packed sequence (the reset), a single chunk (the D skip kept in chunk
    0), one group (h % 1 = h // H: Mamba-2-2.7B's shape; with 1 < G < H the group index is wrong
    from token 0)."""
    preset, position0 = SSD_MUTANTS[mutant]
    rc = main(["--store", str(tmp_path / "store"), "--plugin", MUTANTS, "check", "--impl",
               f"torch:{mutant}", "--preset", preset, "--dtype", "f32", "--show-failures", "1"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert f"--impl torch:{mutant}" in out
    assert _status(f"torch:{mutant}", position0) == "pass"


# --- the growth with T (slow) ------------------------------------------------------------------

@pytest.mark.skipif(not os.environ.get("KPARITY_SLOW"), reason="slow: set KPARITY_SLOW=1")
def test_chunked_bound_holds_up_to_16384_tokens():
    """The chunked bound holds against the recurrence up to T = 16384 (narrow heads, slow decay)
    and is not vacuous: the f32 listing uses at least 1 % of it at every T."""
    from scripts.ssd_chunked_budget import draw, measure

    params = {"dt": "slow", "initial_state": "given"}
    inputs = draw(16384, "f32", params)
    for t in (1, 64, 65, 512, 4096, 16384):
        row = measure(t, "f32", params, inputs=inputs)
        assert max(row["oracle"], row["torch"]) <= 1.0, row
        assert row["torch"] > 0.01, row
