"""rms_norm_qgemv: the oracle against an independent float64 formula and closed forms, its
rounding point (the normed activation stays f32), the derived bound against the seed's, the CPU
impls on the gate cases, the contracts of the CUDA seed ports, and the CPU mutants going red."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import gpu_impls
from cases.generate import Work, gate_cases, plan, violating_cases
from cases.model import Case, make_inputs
from gpu_impls.contract import ContractError
from oracle.dtypes import round_to
from oracle.quant import pack
from oracle.rms_qgemv import SEED_REL_TOL
from runners.correctness import check
from runners.verdicts import is_failure

OP = "rms_norm_qgemv"
MUTANTS = Path(__file__).with_name("mutants.py")
CUDA_IMPLS = ("cuda:ffai_rms_norm_qgemv", "cuda:ffai_rms_norm_qgemv_fast",
              "cuda:ffai_rms_norm_qgemv_int8_fast")


def _case(out=3, n=64, bits=4, group=32, dtype="f32", dist="normal", **params):
    return Case.make(OP, {"out": out, "in": n, "bits": bits, "group_size": group}, dtype, dist,
                     params=params)


def _hand_inputs(case, rng):
    """Random codes, scales, biases, x and norm_weight, rounded to the case dtype, plus the
    codes as integers (for the independent formula)."""
    d, t = case.dims, case.dtype
    codes = rng.integers(0, 1 << d["bits"], (d["out"], d["in"]))
    groups = d["in"] // d["group_size"]
    return codes, {"w": pack(codes, d["bits"]),
                   "scales": round_to(rng.uniform(-0.1, 0.1, (d["out"], groups)), t),
                   "biases": round_to(rng.uniform(-0.5, 0.5, (d["out"], groups)), t),
                   "x": round_to(rng.standard_normal(d["in"]) * 3.0, t),
                   "norm_weight": round_to(1.0 + 0.2 * rng.standard_normal(d["in"]), t)}


def _by_hand(codes, inputs, case) -> list[float]:
    """out[r] = sum_d (q s + b) * (x_d * nw_d * inv), element by element in Python floats, eps
    read as f32 (the kernels' eps argument)."""
    n, group = case.dims["in"], case.dims["group_size"]
    x = [float(v) for v in inputs["x"]]
    nw = [float(v) for v in inputs["norm_weight"]]
    eps = float(np.float32(case.params["eps"]))
    inv = 1.0 / math.sqrt(sum(v * v for v in x) / n + eps)
    out = []
    for r in range(case.dims["out"]):
        s = [float(v) for v in inputs["scales"][r]]
        b = [float(v) for v in inputs["biases"][r]]
        out.append(math.fsum((int(codes[r, d]) * s[d // group] + b[d // group])
                             * (x[d] * nw[d] * inv) for d in range(n)))
    return out


@pytest.mark.parametrize("bits, group, dtype", [(4, 32, "f32"), (8, 64, "bf16"), (4, 128, "f16")])
def test_oracle_is_the_hand_formula(bits, group, dtype):
    case = _case(n=256, bits=bits, group=group, dtype=dtype, eps=1e-5)
    codes, inputs = _hand_inputs(case, np.random.default_rng(bits * group))
    exact, _ = case.spec.reference(inputs, case)
    assert np.allclose(exact["out"], _by_hand(codes, inputs, case), rtol=1e-12, atol=0)


def test_constant_x_and_codes_give_the_closed_form():
    """x = c, nw = 1, every code k, s and b constant: out = (k s + b) * in * c / sqrt(c^2 + eps)."""
    case = _case(out=2, n=128, group=64)
    c, k, s, b = 0.75, 11, 0.125, -0.25
    inputs = {"w": pack(np.full((2, 128), k), 4), "scales": np.full((2, 2), s, np.float32),
              "biases": np.full((2, 2), b, np.float32), "x": np.full(128, c, np.float32),
              "norm_weight": np.ones(128, np.float32)}
    exact, _ = case.spec.reference(inputs, case)
    eps = float(np.float32(1e-6))
    assert np.allclose(exact["out"], (k * s + b) * 128 * c / math.sqrt(c * c + eps), rtol=1e-13)


def test_norm_is_over_the_whole_x_and_weights_each_element():
    """Scaling x leaves out unchanged (up to eps); changing one norm weight changes exactly
    that element's share."""
    case = _case(n=128, group=64)
    inputs = make_inputs(case)
    base, _ = case.spec.reference(inputs, case)
    scaled, _ = case.spec.reference(dict(inputs, x=inputs["x"] * np.float32(4)), case)
    assert np.allclose(scaled["out"], base["out"], rtol=1e-5)
    nw = inputs["norm_weight"].copy()
    nw[5] = np.float32(3.0)
    changed, _ = case.spec.reference(dict(inputs, norm_weight=nw), case)
    assert np.count_nonzero(changed["out"] != base["out"]) == case.dims["out"]
    from oracle.rms_qgemv import normed_activation
    from oracle.quant import dequantize
    n5, _ = normed_activation(dict(inputs, norm_weight=nw), case)
    w5 = dequantize(inputs["w"], inputs["scales"], inputs["biases"], 4, 64)[:, 5]
    share = w5 * (n5[5] - n5[5] / 3.0 * float(inputs["norm_weight"][5]))
    assert np.allclose(changed["out"] - base["out"], share, rtol=1e-9, atol=1e-15)


def test_zero_x_gives_an_exact_zero_and_a_zero_bound():
    for case in (c for c in gate_cases(OP) if c.dist == "zero_rows"):
        inputs = make_inputs(case)
        exact, _ = case.spec.reference(inputs, case)
        bound = case.spec.tolerance(inputs, exact, case)["out"]
        assert np.all(exact["out"] == 0) and np.all(bound == 0), case.id


def test_ftz_reads_f32_subnormal_inputs_as_zero():
    """x of order 1e-37 (inv ~ 1/sqrt(eps)), one element a quarter of the smallest normal: with
    `ftz` the subnormal elements contribute nothing, without it their share is visible."""
    case = _case(n=64)
    inputs = make_inputs(case)
    sub = float(np.finfo(np.float32).tiny) / 4
    x = round_to(inputs["x"].astype(np.float64) * 1e-37, "f32")
    x[7] = np.float32(sub)
    flushed = np.where(np.abs(x) < np.finfo(np.float32).tiny, np.float32(0), x)
    with_ftz, _ = case.spec.reference(dict(inputs, x=x), case.replace(ftz=1))
    zeroed, _ = case.spec.reference(dict(inputs, x=flushed), case)
    kept, _ = case.spec.reference(dict(inputs, x=x), case)
    assert np.array_equal(with_ftz["out"], zeroed["out"])
    assert not np.array_equal(kept["out"], zeroed["out"])


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_bounds_are_never_looser_than_the_seed(dtype):
    """The seed's tolerances relative to the output's size (`SEED_REL_TOL`): the derived bound,
    relative to each gate case's output RMS, stays under them (worst here: f32 ~1.1e-3 of
    5e-3, f16 ~2.0e-3 of 2e-2, bf16 ~1.4e-2 of 2e-2: an outlier case's largest output)."""
    checked = 0
    for case in (c for c in gate_cases(OP) if c.dtype == dtype):
        inputs = make_inputs(case)
        exact, _ = case.spec.reference(inputs, case)
        rms = float(np.sqrt(np.mean(exact["out"] ** 2)))
        if rms == 0:
            continue
        bound = case.spec.tolerance(inputs, exact, case)["out"]
        assert bound.max() / rms <= SEED_REL_TOL[dtype], case.id
        checked += 1
    assert checked >= 40


def test_bound_separates_the_f32_normed_from_the_T_rounded_one():
    """The contract's rounding point matters: rounding x * nw * inv to bf16 before the GEMV (the
    two-kernel / mx.fast.rms_norm path) leaves the bound on most bf16 gate cases."""
    from oracle.rms_qgemv import normed_activation
    from oracle.quant import dequantize

    outside, cases = 0, [c for c in gate_cases(OP) if c.dtype == "bf16" and c.dist == "normal"]
    for case in cases:
        inputs = make_inputs(case)
        exact, ref = case.spec.reference(inputs, case)
        bound = case.spec.tolerance(inputs, exact, case)["out"]
        normed, _ = normed_activation(inputs, case)
        d = case.dims
        w_hat = dequantize(inputs["w"], inputs["scales"], inputs["biases"], d["bits"],
                           d["group_size"])
        rounded = round_to(w_hat @ round_to(normed, "bf16").astype(np.float64), "bf16")
        outside += int(np.any(np.abs(rounded.astype(np.float64) - exact["out"]) > bound))
    assert outside >= 0.75 * len(cases)  # all 24 here


# --- CPU impls --------------------------------------------------------------------------------

@pytest.mark.parametrize("impl_id", ["torch:norm_dequant_linear", "mlx:fast_rms_norm_qmm"])
def test_cpu_impls_pass_every_gate_case_and_reject_every_violation(impl_id):
    impl = gpu_impls.impls()[impl_id]
    be = gpu_impls.backend(impl.backend)
    ok, why = impl.available(be)
    if not ok:
        pytest.skip(why)
    work = plan([impl])
    assert sum(w.expect == "valid" for w in work) >= 50
    bad = [(w.case.id, w.case.short(), r["status"], r["message"])
           for w in work for r in [check(w, be)] if is_failure(r)]
    assert not bad, bad[:3]


def test_mlx_half_dtypes_leave_the_contract():
    """Why mlx:fast_rms_norm_qmm is f32 only: with its dtype limit lifted, it fails bf16 gate
    cases (mx.fast.rms_norm rounds the normed activation to T; quantized_matmul in bf16 does
    not accumulate in f32). If MLX changes this, the test says to widen the contract."""
    import dataclasses

    from gpu_impls.contract import Contract

    impl = gpu_impls.impls()["mlx:fast_rms_norm_qmm"]
    be = gpu_impls.backend("mlx")
    if not impl.available(be)[0]:
        pytest.skip("mlx not available")
    lifted = dataclasses.replace(impl, contract=Contract(invariants=impl.contract.invariants))
    cases = [c for c in gate_cases(OP) if c.dtype == "bf16" and c.dist == "normal"][:6]
    assert any(check(Work(lifted, c, "valid"), be)["status"] == "fail" for c in cases)


# --- CUDA contracts (pure Python: no device) -------------------------------------------------

def test_fast_contracts_carry_the_seed_invariants():
    impls = gpu_impls.impls()
    for impl_id, bits in (("cuda:ffai_rms_norm_qgemv_fast", 4),
                          ("cuda:ffai_rms_norm_qgemv_int8_fast", 8)):
        names = {inv.name for inv in impls[impl_id].contract.invariants}
        assert {f"bits == {bits}", "group_size == 64", "in % 512 == 0",
                "out % 8 == 0"} <= names, impl_id
    assert "bits == 4" in {inv.name for inv in impls[CUDA_IMPLS[0]].contract.invariants}


@pytest.mark.parametrize("impl_id", CUDA_IMPLS)
def test_cuda_contracts_reject_each_violation_naming_this_ops_fallbacks(impl_id):
    impl = gpu_impls.impls()[impl_id]
    work = violating_cases(impl)
    assert len(work) == len(impl.contract.invariants)
    for w in work:
        with pytest.raises(ContractError) as err:
            impl.contract.check(impl.id, w.case)
        assert err.value.invariant == w.invariant
        assert "dequant_gemv" not in err.value.fix, err.value.fix


@pytest.mark.parametrize("impl_id", CUDA_IMPLS[1:])
def test_fast_contracts_admit_the_fast_shapes_only(impl_id):
    impl = gpu_impls.impls()[impl_id]
    bits = 8 if "int8" in impl_id else 4
    shapes = {(c.dims["out"], c.dims["in"]) for c in gate_cases(OP)
              if c.dims["bits"] == bits and c.dims["group_size"] == 64
              and impl.contract.admits(c)}
    assert shapes == {(8, 512), (16, 1024)}
    launch = impl.contract.check(impl.id, _case(out=16, n=1024, bits=bits, group=64))
    assert launch.grid == (2, 1, 1) and launch.block == (64, 1, 1)


def test_scalar_launch_is_one_128_thread_block_per_row():
    impl = gpu_impls.impls()[CUDA_IMPLS[0]]
    launch = impl.contract.check(impl.id, _case(out=12, n=768, group=128))
    assert launch.grid == (12, 1, 1) and launch.block == (128, 1, 1)


# --- mutants ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mutant_rms_qgemv_round_normed", "mutant_rms_qgemv_drop_eps"])
def test_cpu_mutants_go_red(name):
    gpu_impls.load_plugin(str(MUTANTS))
    impl = gpu_impls.impls()[f"torch:{name}"]
    rows = [check(w, gpu_impls.backend("torch")) for w in plan([impl], invalid=False)]
    failed = {(r["dtype"], r["dist"]) for r in rows if r["status"] == "fail"}
    assert failed, f"{impl.id} passed every case"
    if name.endswith("round_normed"):  # caught in both half dtypes
        assert {dtype for dtype, _ in failed} == {"f16", "bf16"}


def test_cuda_mutants_are_registered_for_every_seed_port():
    """They need a GPU to run (tests/test_gpu.py); their registration needs none."""
    gpu_impls.load_plugin(str(MUTANTS))
    impls = gpu_impls.impls()
    for prefix in ("mutant_rms_qgemv", "mutant_rms_qgemv_fast", "mutant_rms_qgemv_int8"):
        for bug in ("nibble_order", "group_off_by_one", "drop_bias", "skip_last_group",
                    "drop_eps"):
            assert f"cuda:{prefix}_{bug}" in impls
