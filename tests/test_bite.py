"""Bounds that bite (issue 24 item 6): with a declared reduction order the derived bound catches
two subtle planted mistakes on normal f32 data, while the same kernel without the mistake passes.

The kernels are f32 NumPy emulations with a known order (`tests/mutants.py`, "declared reduction
order"), so the order they declare is true and their bound rigorous:

    torch:lanes_rms_norm            x^2 summed in 256 lanes + a tree    Numerics(lanes(256))
    torch:mutant_lanes_eps_swapped  the same, eps 1e-5 where the case says 1e-6
    torch:lanes_dequant_gemv        (q s + b) x summed in 32 lanes + a tree   Numerics(lanes(32))
    torch:mutant_lanes_code_off_by_one  the same, one code per row off by one at max |s x|

Sizes of the mistakes against the bounds at n = in = 4096 (measured, seeds 0..4):

    eps swap     out moves by (1e-5 - 1e-6) / 2 = 4.5e-6 relative (mean x^2 ~ 1); the 256-lane
                 bound is ~7.7e-7 relative (budget 6.4..6.8), the any-order one ~6e-5
                 ((n/4) u at inv: budget 0.08, never caught).
    code slip    out moves by max_d |s_d x_d| ~ 3e-4 (s ~ 0.004, x ~ 1/64); the 32-lane bound
                 is ~9e-7 (budget 380..420), the any-order one ~235x wider (per row budget
                 0.77..1.8: caught at case level because every row slips, missed in 9..19 % of
                 the rows, so a slip confined to one row goes unseen as often).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gpu_impls
from cases.distributions import DOMAIN
from cases.generate import Work, gate_cases
from cases.model import Case, make_inputs
from oracle.numerics import DEFAULT
from runners.correctness import check, run_impl

MUTANTS = Path(__file__).with_name("mutants.py")
CONTROLS = {"rms_norm": "torch:lanes_rms_norm", "dequant_gemv": "torch:lanes_dequant_gemv"}
LM_HEAD_OUT = 32000  # the lm_head gate case: a 33M-term float64 oracle and bound, ~5 s each

# (rows, seed) and (out, seed): a few sizes, fresh data each
NORM_CASES = [Case.make("rms_norm", {"rows": rows, "n": 4096}, "f32", "normal", seed,
                        {"eps": 1e-6, "rounding": "once"}, label="bite")
              for seed, rows in enumerate((4, 7, 10, 13, 16))]
GEMV_CASES = [Case.make("dequant_gemv", {"out": out, "in": 4096, "bits": 4, "group_size": 64},
                        "f32", "normal", seed, label="bite")
              for seed, out in enumerate((32, 40, 48, 56, 64))]


@pytest.fixture(scope="module")
def impls():
    gpu_impls.load_plugin(str(MUTANTS))
    return gpu_impls.impls()


def _check(impl, case) -> dict:
    return check(Work(impl, case, "valid"), gpu_impls.backend("torch"))


def test_lanes_sum_is_the_declared_order(impls):
    """`lanes_sum_f32` against the order written out one scalar f32 addition at a time: lane j
    sums t_j, t_{j+L}, ... left to right, then node k of each tree level = node 2k + node 2k+1
    (a zero appended to an odd level: L = 6 has levels 6, 3 -> 4, 2, 1). Data over 2^±20, so
    another order would round differently; bit equality pins this one."""
    # the plugin module is not importable by name (load_plugin runs it from its path): take the
    # function from the module the registered control runs in
    lanes_sum_f32 = impls["torch:lanes_rms_norm"].run.__globals__["lanes_sum_f32"]
    rng = np.random.default_rng(24)
    for n, n_lanes in ((11, 4), (37, 6), (256, 32), (5, 8)):
        t = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32)
        level = []
        for j in range(n_lanes):
            acc = np.float32(0.0)
            for i in range(j, n, n_lanes):
                acc = np.float32(acc + t[i])
            level.append(acc)
        while len(level) > 1:
            level += [np.float32(0.0)] * (len(level) % 2)
            level = [np.float32(level[k] + level[k + 1]) for k in range(0, len(level), 2)]
        assert lanes_sum_f32(t, n_lanes).tobytes() == level[0].tobytes(), (n, n_lanes)


@pytest.mark.parametrize("op", sorted(CONTROLS))
def test_controls_pass_every_f32_gate_case(op, impls):
    """Every f32 gate case the control's contract admits, every distribution (rms_norm: normal,
    tiny, outlier_rows, constant_rows, zero_rows, f16_overflow, nonfinite; dequant_gemv: normal,
    outlier_rows, constant_rows, zero_rows, quantized), passes under the declared lanes bound.
    Left out: the 32000-row lm_head (slow here; measured once: budget 0.08 on its normal,
    near_tie and clear_margin cases)."""
    impl = impls[CONTROLS[op]]
    cases = [c for c in gate_cases(op) if c.dtype == "f32" and impl.contract.admits(c)
             and c.dims.get("out") != LM_HEAD_OUT]
    assert {c.dist for c in cases} >= {"normal", "outlier_rows", "constant_rows"}
    rows = [_check(impl, c) for c in cases]
    failed = [(c.short(), r["status"], r["message"]) for c, r in zip(cases, rows)
              if r["status"] != "pass"]
    assert not failed, failed
    # measured: 0.46 (rms_norm tiny, n = 8192); past the f32 domain (`f32_overflow`) the control's
    # sum overflows, inv = 0, and its 0 uses the whole budget the contract gives there
    assert max(r["budget"] for c, r in zip(cases, rows) if c.dist not in DOMAIN) < 0.5


@pytest.mark.parametrize("dist", ["tiny", "outlier_rows", "constant_rows", "zero_rows"])
def test_gemv_control_passes_other_distributions_at_4096(dist, impls):
    """The GEMV gate draws tiny x nowhere; at in = 4096 subnormal terms and one 1000x element
    (outlier_rows) stress the 32-lane bound's subnormal and partial-sum charges."""
    case = Case.make("dequant_gemv", GEMV_CASES[0].dims, "f32", dist, label="bite")
    row = _check(impls["torch:lanes_dequant_gemv"], case)
    assert row["status"] == "pass", row["message"]


@pytest.mark.parametrize("control, mutant, cases", [
    ("torch:lanes_rms_norm", "torch:mutant_lanes_eps_swapped", NORM_CASES),
    ("torch:lanes_dequant_gemv", "torch:mutant_lanes_code_off_by_one", GEMV_CASES),
], ids=["eps_swapped", "code_off_by_one"])
def test_declared_lanes_catch_the_mistake_on_every_case(control, mutant, cases, impls):
    """Same kernel, same declared order: the control passes every case, the mutant fails every
    one, on output `out` (the worst element named in the message)."""
    for case in cases:
        good, bad = _check(impls[control], case), _check(impls[mutant], case)
        assert good["status"] == "pass", (case.short(), good["message"])
        assert bad["status"] == "fail", (case.short(), bad["budget"])
        assert bad["worst_output"] == "out" and bad["message"].startswith("out["), bad["message"]
        assert bad["budget"] > 3  # measured: eps swap >= 6.4, code slip >= 380


def _budgets(impl, case, numerics) -> np.ndarray:
    """Per element |out - exact| / bound, the bound derived for `numerics`."""
    inputs = make_inputs(case)
    exact, _ = case.spec.reference(inputs, case)
    bound = case.spec.bounds(inputs, exact, case, numerics)["out"]
    out = run_impl(impl, gpu_impls.backend("torch"), case, inputs)["out"].astype(np.float64)
    return np.abs(out - exact["out"]) / bound


def test_without_a_declared_order_the_mistakes_slip_through(impls):
    """The same mutant outputs against the any-order bound (`numerics.DEFAULT`, what an impl
    that declares nothing is held to): why declaring the reduction matters.

    eps swap: the any-order bound charges the sum of n positive x^2 as if every order were
    possible, (n/2) u relative on the sum, (n/4) u = 6e-5 at inv for n = 4096: 13x the
    4.5e-6 the wrong eps moves out by. Budget 0.08 on every case: never caught.

    code slip: the any-order bound on a row of 4096 terms is ~ (n/2) u sum_d |t_d|, about the
    size of the slip max_d |s_d x_d| itself: per row budget 0.77..1.8. Every row slips, so the
    case fails (max over rows ~1.7), but 9..19 % of the rows pass: a slip in one such row alone
    goes unseen. With 32 lanes declared, every row's budget is above 200."""
    eps = impls["torch:mutant_lanes_eps_swapped"]
    for case in NORM_CASES:
        assert _budgets(eps, case, DEFAULT).max() < 1, case.short()
        assert _budgets(eps, case, eps.numerics).max() > 3, case.short()

    slip = impls["torch:mutant_lanes_code_off_by_one"]
    escaped = []
    for case in GEMV_CASES:
        by_row = _budgets(slip, case, DEFAULT)
        escaped.append(np.mean(by_row < 1))
        assert _budgets(slip, case, slip.numerics).min() > 100, case.short()
    assert max(escaped) > 0, escaped  # measured: 9..19 % of the rows under 1 on each case
