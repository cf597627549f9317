"""oracle.metrics.compare on hand-built arrays: every metric checked against a value worked out
by hand, including the NaN/Inf rules that make an unwritten (NaN-poisoned) element fail."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from oracle.metrics import compare

BF16 = ml_dtypes.bfloat16


def f32(*v) -> np.ndarray:
    return np.array(v, dtype=np.float32)


def test_nan_where_oracle_finite_fails():
    """An output NaN where the oracle is finite (an element the kernel never wrote) is a
    nonfinite mismatch with infinite budget, even though the finite elements are exact."""
    ref = f32(1.0, 2.0, 3.0)
    m = compare(f32(1.0, np.nan, 3.0), ref, ref.astype(np.float64), np.full(3, 1e-6), "f32")
    assert m["nonfinite_mismatch"] == 1
    assert m["budget"] == math.inf
    assert m["worst_index"] == 1
    assert m["frac_within"] == pytest.approx(2 / 3)


def test_finite_output_where_oracle_nan_is_mismatch():
    """The other direction: the oracle says NaN and the kernel returned a number."""
    ref = f32(np.nan, 1.0)
    m = compare(f32(0.5, 1.0), ref, ref.astype(np.float64), np.full(2, 1e-6), "f32")
    assert m["nonfinite_mismatch"] == 1
    assert m["budget"] == math.inf


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract")
def test_matching_nonfinite_values_pass():
    """+inf/-inf/NaN in the same places as the oracle are not errors: budget 0."""
    ref = f32(np.inf, -np.inf, np.nan, 1.0)
    m = compare(ref.copy(), ref, ref.astype(np.float64), np.array([0.0, 0.0, 0.0, 1e-6]), "f32")
    assert m["nonfinite_mismatch"] == 0
    assert m["budget"] == 0.0
    assert m["max_abs"] == 0.0
    assert m["frac_within"] == 1.0


def test_opposite_infinities_mismatch():
    """+inf where the oracle has -inf is wrong, though both are 'inf'."""
    ref = f32(-np.inf, 1.0)
    m = compare(f32(np.inf, 1.0), ref, ref.astype(np.float64), np.full(2, 1e-6), "f32")
    assert m["nonfinite_mismatch"] == 1
    assert m["budget"] == math.inf


def test_one_ulp_bf16_error_exceeds_half_ulp_bound():
    """Exact 1.0, output one bf16 ULP up (1 + 2^-7), bound half an ULP (2^-8): budget exactly 2,
    one ULP, nothing within the bound."""
    ref = np.array([1.0, 1.0], dtype=BF16)
    out = np.array([1.0078125, 1.0], dtype=BF16)
    m = compare(out, ref, np.array([1.0, 1.0]), np.full(2, 2.0 ** -8), "bf16")
    assert m["budget"] == 2.0
    assert m["max_ulp"] == 1
    assert m["frac_within"] == 0.5
    assert m["worst_index"] == 0
    assert m["worst_out"] == 1.0078125
    assert m["max_abs"] == 2.0 ** -7


def test_budget_is_measured_against_exact_not_rounded_ref():
    """A perfect store (out == ref) still uses part of the budget: |ref - exact| / bound."""
    ref = np.array([1.0], dtype=BF16)
    m = compare(ref.copy(), ref, np.array([1.001]), np.array([2.0 ** -8]), "bf16")
    assert m["budget"] == pytest.approx(0.001 / 2.0 ** -8)
    assert m["max_ulp"] == 0 and m["max_abs"] == 0.0


def test_max_ulp_counts_the_largest_distance():
    """ULP errors of 3, 0 and 7 (including one on a negative value) give max_ulp 7."""
    ref = np.array([1.0, 2.0, -0.5], dtype=np.float16)
    out = (ref.view(np.uint16) + np.array([3, 0, 7], dtype=np.uint16)).view(np.float16)
    m = compare(out, ref, ref.astype(np.float64), np.full(3, 1.0), "f16")
    assert m["max_ulp"] == 7
    assert m["max_abs"] == pytest.approx(7 * 2.0 ** -11)


@pytest.mark.parametrize("out, ref, cosine, nmse", [
    ([0.0, 1.0], [1.0, 0.0], 0.0, 2.0),           # orthogonal
    ([6.0, 8.0], [3.0, 4.0], 1.0, 1.0),           # parallel, twice as long
    ([-3.0, -4.0], [3.0, 4.0], -1.0, 4.0),        # opposite
    ([1.0, 0.0], [1.0, 1.0], 1 / math.sqrt(2), 0.5),
    ([0.0, 0.0], [3.0, 4.0], 0.0, 1.0),           # nothing written (zeros) against signal
])
def test_cosine_and_nmse(out, ref, cosine, nmse):
    """cosine = <o, r> / (|o||r|), nmse = sum (o - r)^2 / sum r^2, on small vectors."""
    r = np.array(ref, dtype=np.float32)
    m = compare(np.array(out, dtype=np.float32), r, r.astype(np.float64), np.full(2, 1e-3), "f32")
    assert m["cosine"] == pytest.approx(cosine, abs=1e-12)
    assert m["nmse"] == pytest.approx(nmse, rel=1e-12)


def test_zero_vs_zero():
    """An all-zero output against an all-zero oracle (zero rows) is perfect: cosine 1, nmse 0,
    budget 0 even with a zero bound."""
    z = np.zeros(4, dtype=np.float32)
    m = compare(z.copy(), z, np.zeros(4), np.zeros(4), "f32")
    assert (m["cosine"], m["nmse"], m["budget"], m["nonfinite_mismatch"]) == (1.0, 0.0, 0.0, 0)


def test_nonzero_where_bound_is_zero_fails():
    """Zero rows have bound 0: any nonzero output there has infinite budget."""
    z = np.zeros(2, dtype=np.float32)
    m = compare(f32(0.0, 1e-30), z, np.zeros(2), np.zeros(2), "f32")
    assert m["budget"] == math.inf
    assert m["worst_index"] == 1


def test_max_rel_uses_floor():
    """max_rel divides by max(|ref|, 1e-3 * rms(ref)): an error of 0.01 on a zero next to 1000
    is relative to 1e-3 * rms([1000, 0]) = 1/sqrt(2)."""
    ref = f32(1000.0, 0.0)
    m = compare(f32(1000.0, 0.01), ref, ref.astype(np.float64), np.full(2, 1.0), "f32")
    assert m["max_rel"] == pytest.approx(float(np.float32(0.01)) * math.sqrt(2), rel=1e-6)


def test_shape_mismatch_raises():
    """An output with the wrong element count is an error, not a silent broadcast."""
    with pytest.raises(ValueError, match="3 elements"):
        compare(f32(1.0, 2.0, 3.0), f32(1.0, 2.0), np.zeros(2), np.zeros(2), "f32")


def test_inf_may_be_nan_accepts_only_nan_for_an_oracle_infinity():
    """OpSpec.inf_may_be_nan (the GEMV family's split form): NaN where the oracle has ±inf is
    allowed; NaN where it is finite, a number where it is NaN, or the other infinity are not."""
    ref = np.array([np.inf, -np.inf, 1.0, np.nan, np.inf])
    out = np.array([np.nan, np.nan, np.nan, 2.0, -np.inf])
    bound = np.full(5, 0.1)
    strict = compare(out, ref, ref, bound, "f32")
    loose = compare(out, ref, ref, bound, "f32", inf_may_be_nan=True)
    assert strict["nonfinite_mismatch"] == 5
    assert loose["nonfinite_mismatch"] == 3 and loose["budget"] == np.inf
    ok = compare(np.array([np.nan, np.inf]), np.array([np.inf, np.inf]),
                 np.array([np.inf, np.inf]), np.full(2, 0.1), "f32", inf_may_be_nan=True)
    assert ok["nonfinite_mismatch"] == 0 and ok["budget"] == 0.0
