"""The RMSNorm family oracles (oracle/norms.py): closed forms, an independent torch float64
formulation, MLX's own kernel as a witness for the rounding="normed" convention, the guard that
derived bounds are never looser than the seeds' tolerances, and a property test that the torch
CPU baselines pass the oracle on fuzzed valid cases.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from cases.distributions import DISTRIBUTIONS, DOMAIN
from cases.generate import Work, gate_cases
from cases.model import Case, make_inputs
from cases.strategies import valid_case
from gpu_impls import backend, impls
from oracle.dtypes import FLOAT_DTYPES, round_to, ulp_distance
from oracle.norms import SEED_NUMERICS, SEED_TOL
from oracle.spec import registry
from runners.correctness import check, run_impl

BF16 = ml_dtypes.bfloat16
NORM_OPS = sorted(name for name, spec in registry().items() if spec.family == "norms")


def eps32(case) -> float:
    """The oracle reads eps as float32, as the kernels' eps buffer holds it."""
    return float(np.float32(case.params["eps"]))


def oracle(case: Case, inputs: dict) -> tuple[dict, dict, dict]:
    spec = case.spec
    exact, ref = spec.reference(inputs, case)
    return exact, ref, spec.tolerance(inputs, exact, case)


def f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


# --- closed forms --------------------------------------------------------------------------------

@pytest.mark.parametrize("weight_offset", [0, 1])
def test_constant_rows_closed_form(weight_offset):
    """x_r = c: mean(x^2) = c^2, so out = c * rsqrt(c^2 + eps) * (w + offset). c = 1e-3 puts c^2
    at eps, where dropping eps (or adding it outside the sqrt) changes the result by ~30%."""
    c = np.array([0.5, -3.0, 1e-3, 7.25, -2.0 ** -20], dtype=np.float32)
    n = 64
    case = Case.make("rms_norm", {"rows": len(c), "n": n}, "f32",
                     params={"eps": 1e-6, "weight_offset": weight_offset})
    w = np.linspace(-0.5, 1.5, n).astype(np.float32)
    x = np.repeat(c[:, None], n, axis=1)
    exact, _, _ = oracle(case, {"x": x, "w": w})
    c64 = f64(c)[:, None]
    expected = c64 / np.sqrt(c64 * c64 + eps32(case)) * (f64(w) + weight_offset)
    np.testing.assert_allclose(exact["out"], expected, rtol=1e-14, atol=0)
    # c = 1e-3: c / sqrt(2 c^2) = 1/sqrt(2), not 1.
    assert exact["out"][2, -1] / (1.5 + weight_offset) == pytest.approx(1 / math.sqrt(2), rel=1e-3)


def test_constant_rows_gate_case_closed_form():
    """The same closed form on a gate case drawn with the constant_rows distribution (bf16)."""
    case = next(c for c in gate_cases("rms_norm")
                if c.dist == "constant_rows" and c.dtype == "bf16" and c.params["rounding"] == "once")
    inputs = make_inputs(case)
    exact, _, _ = oracle(case, inputs)
    cval = f64(inputs["x"])[:, :1]
    expected = cval / np.sqrt(cval * cval + eps32(case)) * (
        f64(inputs["w"]) + case.params["weight_offset"])
    np.testing.assert_allclose(exact["out"], expected, rtol=1e-14, atol=0)


@pytest.mark.parametrize("op", NORM_OPS)
def test_zero_rows_give_exact_zero(op):
    """Every third row is zero: the oracle output there is exactly 0 (rms_inv: exactly
    eps^-1/2), and the other rows are nonzero."""
    case = next(c for c in gate_cases(op) if c.dist == "zero_rows" and c.dtype == "bf16")
    inputs = make_inputs(case)
    exact, _, _ = oracle(case, inputs)
    for t in case.spec.outputs:
        out = exact[t.name]
        if op == "rms_inv":
            zero = np.arange(out.shape[0]) % 3 == 0
            np.testing.assert_array_equal(out[zero], 1.0 / math.sqrt(eps32(case)))
            assert np.all(out[~zero] < 10.0)
            continue
        rows = out.reshape(-1, out.shape[-1])
        zero = np.arange(rows.shape[0]) % 3 == 0
        assert np.all(rows[zero] == 0.0), t.name
        assert np.mean(rows[~zero] != 0.0) > 0.99, t.name


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_zero_rows_bound_admits_only_zero_in_half_dtypes(dtype):
    """On zero rows the bound is below the smallest subnormal of T: any stored nonzero value
    (at least one subnormal) fails."""
    case = next(c for c in gate_cases("rms_norm") if c.dist == "zero_rows" and c.dtype == dtype)
    inputs = make_inputs(case)
    _, _, bound = oracle(case, inputs)
    smallest = float(ml_dtypes.finfo(round_to(np.zeros(1), dtype).dtype).smallest_subnormal)
    assert np.all(bound["out"][::3] < smallest)
    assert np.all(bound["out"][1] > 0)


def test_zero_rows_bound_is_exactly_zero():
    """The module docstring: 'All-zero rows give bound 0: out must be exactly 0' (f32)."""
    case = next(c for c in gate_cases("rms_norm") if c.dist == "zero_rows" and c.dtype == "f32")
    _, _, bound = oracle(case, make_inputs(case))
    assert np.all(bound["out"][::3] == 0.0)


@pytest.mark.parametrize("rounding, weight_offset, dtype", [
    ("once", 0, "bf16"), ("normed", 0, "bf16"), ("once", 1, "f16"), ("normed", 0, "f32")])
def test_per_head_is_rms_norm_on_reshaped_rows(rounding, weight_offset, dtype):
    """rms_norm_per_head on [b, t, h, d] equals rms_norm on [b*t*h, d] with the same weight,
    bit for bit, for outputs and bounds."""
    dims = {"batch": 2, "tokens": 3, "heads": 4, "head_dim": 96}
    params = {"rounding": rounding, "weight_offset": weight_offset, "eps": 1e-6}
    head = Case.make("rms_norm_per_head", dims, dtype, "normal", seed=9, params=params)
    flat = Case.make("rms_norm", {"rows": 24, "n": 96}, dtype, "normal", params=params)
    inputs = make_inputs(head)
    e_head, r_head, b_head = oracle(head, inputs)
    e_flat, r_flat, b_flat = oracle(flat, {"x": inputs["x"].reshape(24, 96), "w": inputs["w"]})
    assert e_head["out"].shape == (2, 3, 4, 96)
    np.testing.assert_array_equal(e_head["out"].reshape(24, 96), e_flat["out"])
    np.testing.assert_array_equal(b_head["out"].reshape(24, 96), b_flat["out"])
    assert r_head["out"].reshape(24, 96).tobytes() == r_flat["out"].tobytes()
    # each head is normalised on its own: scaling one head's input leaves the others unchanged
    x2 = inputs["x"].copy()
    x2[0, 0, 0] = (f64(x2[0, 0, 0]) * 4).astype(x2.dtype)
    e2, _, _ = oracle(head, {"x": x2, "w": inputs["w"]})
    np.testing.assert_array_equal(e2["out"][0, 0, 1:], e_head["out"][0, 0, 1:])
    np.testing.assert_allclose(e2["out"][0, 0, 0], e_head["out"][0, 0, 0], rtol=1e-6)


def test_add_rms_norm_normalises_the_unrounded_sum():
    """s = a + b with a = 1, b = 3*2^-9 in the first element: s rounds (bf16) to 1 + 2^-7.
    Normalising the exact s gives bf16 [1 + 2^-7, 1, 1, 1]; normalising T(s) would give
    [1 + 2^-7, 1 - 2^-8, 1 - 2^-8, 1 - 2^-8]. The oracle must match the first."""
    case = Case.make("add_rms_norm", {"rows": 1, "n": 4}, "bf16")
    a = np.ones((1, 4), dtype=BF16)
    b = np.array([[3 * 2.0 ** -9, 0, 0, 0]], dtype=BF16)
    w = np.ones(4, dtype=BF16)
    exact, ref, _ = oracle(case, {"a": a, "b": b, "w": w})

    s = np.array([[1 + 3 * 2.0 ** -9, 1.0, 1.0, 1.0]])
    unrounded = s / np.sqrt(np.mean(s * s) + eps32(case))
    s_t = f64(round_to(s, "bf16"))
    from_rounded = s_t / np.sqrt(np.mean(s_t * s_t) + eps32(case))
    # preconditions: the construction does separate the two conventions
    assert s_t[0, 0] == 1 + 2.0 ** -7
    assert not np.array_equal(f64(round_to(unrounded, "bf16")), f64(round_to(from_rounded, "bf16")))

    np.testing.assert_allclose(exact["normed_out"], unrounded, rtol=1e-15, atol=0)
    np.testing.assert_array_equal(f64(ref["normed_out"]), [[1 + 2.0 ** -7, 1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(f64(ref["residual_out"]), s_t)
    np.testing.assert_array_equal(exact["residual_out"], s)


def test_gated_mixer_norm_large_positive_gate_is_norm_times_z():
    """silu(z) = z for z >> 0 (sigmoid(40) rounds to 1 in float64): out = rms_norm(y) * z."""
    case = Case.make("gated_mixer_norm", {"rows": 3, "n": 256}, "bf16", seed=4,
                     params={"eps": 1e-5})
    inputs = make_inputs(case)
    rng = np.random.default_rng(0)
    z = round_to(rng.uniform(40.0, 60.0, (3, 256)), "bf16")
    exact, _, _ = oracle(case, {**inputs, "z": z})
    plain_case = Case.make("rms_norm", {"rows": 3, "n": 256}, "f32", params={"eps": 1e-5})
    plain, _, _ = oracle(plain_case, {"x": inputs["y"], "w": inputs["w"].astype(np.float32)})
    np.testing.assert_allclose(exact["out"], plain["out"] * f64(z), rtol=1e-15, atol=0)


def test_gated_mixer_norm_gate_limits():
    """silu(0) = 0 exactly, silu(-50) ~ -1e-20 (no overflow to NaN), silu(2) = 2*sigmoid(2)."""
    case = Case.make("gated_mixer_norm", {"rows": 1, "n": 3}, "f32")
    y = np.array([[1.0, 1.0, 1.0]], dtype=np.float32)
    z = np.array([[0.0, -50.0, 2.0]], dtype=np.float32)
    w = np.ones(3, dtype=np.float32)
    exact, _, _ = oracle(case, {"y": y, "z": z, "w": w})
    inv = 1 / math.sqrt(1 + eps32(case))
    assert exact["out"][0, 0] == 0.0
    assert exact["out"][0, 1] == pytest.approx(inv * -50 / (1 + math.exp(50)), rel=1e-12)
    assert exact["out"][0, 2] == pytest.approx(inv * 2 / (1 + math.exp(-2)), rel=1e-14)


def test_rms_inv_against_direct_formula():
    """inv = 1 / sqrt(mean(x^2) + eps), with fsum for the mean and eps read as float32: on a zero
    row it is float32(1e-6)^-1/2 = 1000.0000012626..., not 1000."""
    case = Case.make("rms_inv", {"rows": 5, "n": 300}, "f32", "zero_rows", seed=3)
    inputs = make_inputs(case)
    exact, ref, _ = oracle(case, inputs)
    x = f64(inputs["x"])
    eps = float(np.float32(1e-6))
    expected = [1 / math.sqrt(math.fsum(v * v for v in row) / 300 + eps) for row in x]
    np.testing.assert_allclose(exact["inv"], expected, rtol=1e-15, atol=0)
    assert exact["inv"][0] == 1 / math.sqrt(eps) != 1000.0
    assert ref["inv"].dtype == np.float32 and exact["inv"].shape == (5,)


# --- an independent formulation: torch float64 -------------------------------------------------

def _spread_sample() -> list[Case]:
    """One rms_norm gate case per (dtype, distribution), alternating the rounding convention and
    walking through the presets so n varies; plus two Gemma (weight_offset=1) cases."""
    cs = gate_cases("rms_norm")
    out = []
    for i, (dtype, dist) in enumerate((d, s) for d in FLOAT_DTYPES for s in DISTRIBUTIONS):
        group = [c for c in cs if c.dtype == dtype and c.dist == dist
                 and c.params["rounding"] == ("once", "normed")[i % 2]]
        out.append(group[(3 * i) % len(group)])
    out += [c for c in cs if c.params["weight_offset"] == 1 and c.dist == "normal"][:2]
    return out


TORCH64_SAMPLE = _spread_sample()


@pytest.mark.parametrize("case", TORCH64_SAMPLE,
                         ids=[f"{c.short()} {c.params['rounding']}" for c in TORCH64_SAMPLE])
def test_rms_norm_matches_torch_float64(case):
    """F.rms_norm on float64 tensors (one rounding: x*r*w; "normed": w * T(x*r)) agrees with the
    oracle's exact output to 1e-12 relative."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    inputs = make_inputs(case)
    exact, _, _ = oracle(case, inputs)
    x = torch.from_numpy(f64(inputs["x"]))
    w = torch.from_numpy(f64(inputs["w"])) + case.params["weight_offset"]
    n = x.shape[-1]
    if case.params["rounding"] == "once":
        y = F.rms_norm(x, (n,), w, eps32(case)).numpy()
    else:
        # The intermediate rounding to T goes through ml_dtypes/NumPy: torch's CPU float64 ->
        # float16 cast rounds via float32 (double rounding), which lands on the other neighbour
        # where x*r sits just past a midpoint (3 of 14336 elements in one f16 gate case).
        normed = F.rms_norm(x, (n,), None, eps32(case)).numpy()
        y = w.numpy() * f64(round_to(normed, case.dtype))
    np.testing.assert_allclose(exact["out"], y, rtol=1e-12, atol=0)


def test_torch64_sample_is_spread():
    """The sample covers every dtype, distribution and both rounding conventions."""
    assert {c.dtype for c in TORCH64_SAMPLE} == set(FLOAT_DTYPES)
    assert {c.dist for c in TORCH64_SAMPLE} == set(DISTRIBUTIONS)
    assert {c.params["rounding"] for c in TORCH64_SAMPLE} == {"once", "normed"}
    assert len({c.dims["n"] for c in TORCH64_SAMPLE}) >= 5


# --- MLX's kernel: the rounding="normed" witness ------------------------------------------------

def _mlx_cases(dtype: str) -> list[Case]:
    cs = [c for c in gate_cases("rms_norm") if c.dtype == dtype
          and c.params["rounding"] == "normed"
          and c.dist in ("normal", "outlier_rows", "tiny", "f16_overflow")]
    return cs[::7][:4]


MLX_CASES = _mlx_cases("bf16") + _mlx_cases("f16") + _mlx_cases("f32")[:2]


def _run_fast_rms_norm(case):
    impl = impls()["mlx:fast_rms_norm"]
    inputs = make_inputs(case)
    return impl, inputs, run_impl(impl, backend("mlx"), case, inputs)["out"]


@pytest.mark.mlx
@pytest.mark.parametrize("case", MLX_CASES, ids=[c.short() for c in MLX_CASES])
def test_mlx_fast_rms_norm_matches_normed_oracle(case):
    """mx.fast.rms_norm (MLX CPU) is within the rounding="normed" oracle's bound everywhere and,
    for f16/bf16, bit-identical to the rounded oracle on all but a few boundary elements."""
    impl, inputs, out = _run_fast_rms_norm(case)
    _, ref, _ = oracle(case, inputs)
    row = check(Work(impl, case, "valid"), backend("mlx"))
    assert row["status"] == "pass", row["message"]
    if case.dtype != "f32":
        same = np.mean(ulp_distance(out, ref["out"], case.dtype) == 0)
        assert same > 0.95, f"only {same:.3f} bit-identical"


@pytest.mark.mlx
@pytest.mark.parametrize("case", _mlx_cases("bf16"), ids=[c.short() for c in _mlx_cases("bf16")])
def test_mlx_fast_rms_norm_is_not_the_once_convention(case):
    """The same kernel against the one-rounding oracle: in bf16 more than 10% of elements differ
    (rounding x*inv to T before the weight multiply is visible), and the check fails."""
    impl, inputs, out = _run_fast_rms_norm(case)
    once = case.replace(rounding="once")
    _, ref_once, _ = oracle(once, inputs)
    mismatch = np.mean(ulp_distance(out, ref_once["out"], "bf16") != 0)
    assert mismatch > 0.10, f"only {mismatch:.3f} differ from the once oracle"
    spec = once.spec
    exact, _ = spec.reference(inputs, once)
    bound = spec.tolerance(inputs, exact, once)["out"]
    assert np.any(np.abs(f64(out) - exact["out"]) > bound)


# --- the seed-tolerance guard ----------------------------------------------------------------------

def test_seed_tolerances_cover_every_norm_op():
    assert set(SEED_TOL) == set(NORM_OPS)
    assert all(set(v) == set(FLOAT_DTYPES) for v in SEED_TOL.values())


GUARD_KNOWN_LOOSE: set = set()  # (op, dtype) pairs whose bound is known looser than the seed


def _guard_params():
    for op in NORM_OPS:
        for dtype in FLOAT_DTYPES:
            for ftz in (0, 1):
                marks = [pytest.mark.xfail(strict=True, reason="bound looser than the seed where "
                                           "residual + normed cancels")] \
                    if (op, dtype) in GUARD_KNOWN_LOOSE else []
                yield pytest.param(op, dtype, ftz, marks=marks, id=f"{op}-{dtype}-ftz{ftz}")


def _guard_ratio(case: Case, scale_key: str | None = None) -> float:
    """max over elements of bound / (SEED_TOL * max(1, |exact|[, scale])), the bound for the
    seed kernels' class of reduction (`SEED_NUMERICS`: 32 lanes or more)."""
    inputs = make_inputs(case)
    exact = case.spec.reference(inputs, case)[0]
    bound = case.spec.bounds(inputs, exact, case, SEED_NUMERICS)
    worst = 0.0
    for t in case.spec.outputs:
        finite = np.isfinite(exact[t.name])  # NaN/inf outputs (nonfinite inputs) have no bound
        mag = np.maximum(1.0, np.abs(exact[t.name]))
        if scale_key:
            mag = np.maximum(mag, exact[scale_key])
        with np.errstate(invalid="ignore"):  # inf / inf on the masked elements
            ratio = np.broadcast_to(bound[t.name], mag.shape) / (SEED_TOL[case.op][case.dtype]
                                                                 * mag)
        worst = max(worst, float(np.max(ratio[finite], initial=0.0)))
    return worst


@pytest.mark.parametrize("op, dtype, ftz", list(_guard_params()))
def test_derived_bounds_never_looser_than_seed(op, dtype, ftz, tier_cases):
    """For every gate case of the run's tier (and under FTZ, as on CuPy), the derived bound of
    a kernel of the seeds' class (32 lanes or more) at each element is at most the seed's
    absolute tolerance scaled to the output's magnitude, max(1, |exact|). Measured over every
    gate case: the largest ratio is 0.22 (rms_norm_per_head bf16); the commit tier's cases
    reach 0.19 there, at 60 % of the cost."""
    # past the f32 domain (`f32_overflow`) the contract admits 0 as well as y: no seed tolerance
    cases = tier_cases(c for c in gate_cases(op) if c.dtype == dtype and c.dist not in DOMAIN)
    assert cases
    offenders = []
    for case in cases:
        if ftz:
            case = case.replace(ftz=1)
        ratio = _guard_ratio(case)
        if not ratio <= 1.0:
            offenders.append(f"{case.id} {case.short()}: bound/seed = {ratio:.3g}")
    assert not offenders, "\n".join(offenders[:10])


# --- property: the torch CPU baselines pass on fuzzed valid cases --------------------------------

TORCH_IMPLS = sorted(i for i, impl in impls().items()
                     if impl.backend == "torch" and impl.available(backend("torch"))[0])


# Known gaps, each left out of the fuzz by name (a blanket non-strict xfail on four impls, for
# issue 27's subnormal bf16 gap, hid every failure of theirs; under the nightly profile, 1000
# draws, that gap no longer shows, while failures it did not name did):
# - attention on nonfinite data, the impls that call torch's SDPA: its CPU kernel returns 0
#   where a NaN score should make the head's output NaN at some shapes (torch 2.13; over the
#   gate's shapes at 3 seeds each, torch:sdpa_split_kv failed 10 of 96 nonfinite cases and
#   torch:sdpa_varlen 12 of 12; the eager impls pass every one and stay in the fuzz). A torch
#   finding: the cases are in the contract (NaN and inf only in slots every reader attends:
#   oracle/attention.py `finite_unattended`; before it, fuzzed cases also put them in slots a
#   window, a sink or another sequence leaves unattended, which the contract leaves open).
TORCH_SDPA = {"torch:sdpa", "torch:sdpa_split_kv", "torch:paged_sdpa", "torch:paged_split_kv",
              "torch:sdpa_varlen"}
KNOWN_GAPS = {
    "attention: torch's CPU SDPA reads a NaN score as 0": lambda impl, case: (
        impl.id in TORCH_SDPA and case.dist == "nonfinite"),
}
FUZZ_PARAMS = TORCH_IMPLS


@pytest.mark.parametrize("impl_id", FUZZ_PARAMS)
@given(data=st.data())
def test_torch_impls_pass_on_fuzzed_valid_cases(impl_id, data):
    """Any case an impl's contract admits (fuzzed dims, dtype, distribution, seed) passes the
    oracle on torch CPU. A report-only speed baseline computes another function (e.g. weights
    rounded to T), so it only has to run: any status but `error`."""
    impl = impls()[impl_id]
    case = data.draw(valid_case(impl), label="case")
    assume(not any(gap(impl, case) for gap in KNOWN_GAPS.values()))
    row = check(Work(impl, case, "valid"), backend("torch"))
    expected = {"pass", "fail"} if impl.report_only else {"pass"}
    assert row["status"] in expected, (
        f"{impl_id} on case {case.id} ({case.short()}, params {case.params}): {row['status']}: "
        f"{row['message']}\nrepro: put the case below in a list in FILE, then kparity check "
        f"--cases FILE --impl {impl_id}\ncase: {case.to_json()}")
