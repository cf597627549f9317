"""oracle.dtypes: rounding, ULP spacing, ULP distance and rounding margins at known points.

Every tolerance kparity derives is built from these four functions, so each is pinned here to
exact values (powers of two), not to a round trip through itself.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from oracle.dtypes import round_to, rounding_margin, spacing, storage_dtype, ulp_distance

# (dtype, mantissa bits): 1 + 2^-(m+1) is the tie between 1 and its upper neighbour.
MANTISSA = {"bf16": 7, "f16": 10, "f32": 23}


def f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


# --- round_to ------------------------------------------------------------------------------------

def test_round_to_returns_storage_dtype():
    """Rounded arrays must carry the storage dtype (bf16 is ml_dtypes.bfloat16, not float32)."""
    assert round_to(np.array([1.0]), "bf16").dtype == np.dtype(ml_dtypes.bfloat16)
    assert round_to(np.array([1.0]), "f16").dtype == np.float16
    assert round_to(np.array([1.0]), "f32").dtype == np.float32


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_round_to_ties_to_even(dtype):
    """1 + half an ULP is a tie: RNE keeps 1.0 (even mantissa); 1 + 3/2 ULP rounds *up* to the
    even neighbour 1 + 2 ULP. Truncation or round-half-up would give different answers."""
    ulp = 2.0 ** -MANTISSA[dtype]
    got = f64(round_to(np.array([1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), -(1 + 3 * ulp / 2)]),
                       dtype))
    np.testing.assert_array_equal(got, [1.0, 1 + 2 * ulp, -1.0, -(1 + 2 * ulp)])


def test_round_to_bf16_concrete_values():
    """The brief's examples, spelled out: 1 + 2^-8 -> 1.0 and 1 + 3*2^-8 -> 1 + 2^-6."""
    got = f64(round_to(np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20]), "bf16"))
    np.testing.assert_array_equal(got, [1.0, 1.015625, 1.0078125])


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_round_to_f16_overflow_and_subnormal_ties():
    """65519 rounds to f16 max 65504; 65520 is the tie to 2^16, which RNE takes (-> inf).
    2^-25 (half the smallest subnormal) ties to 0; 3*2^-26 rounds to 2^-24."""
    got = f64(round_to(np.array([65519.0, 65520.0, 2.0 ** -25, 3 * 2.0 ** -26]), "f16"))
    np.testing.assert_array_equal(got, [65504.0, np.inf, 0.0, 2.0 ** -24])


# --- spacing -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, values, expected", [
    ("bf16", [1.0, 1.5, 1.99, 2.0, 0.999, -3.0], [2 ** -7, 2 ** -7, 2 ** -7, 2 ** -6, 2 ** -8, 2 ** -6]),
    ("f16", [1.0, 2.0, -3.0, 1000.0, 65504.0], [2 ** -10, 2 ** -9, 2 ** -9, 0.5, 32.0]),
    ("f32", [1.0, 2.0, 0.75, -1024.0], [2 ** -23, 2 ** -22, 2 ** -24, 2 ** -13]),
])
def test_spacing_normal_values(dtype, values, expected):
    """ULP of normal values: 2^(exponent - mantissa bits)."""
    np.testing.assert_array_equal(spacing(np.array(values), dtype), expected)


def test_spacing_binade_edge_takes_upper_gap():
    """At 1.0 the gap below is 2^-24 (f32) but spacing reports the upper gap 2^-23, so a
    half-ULP bound is safe on both sides."""
    assert spacing(np.array([1.0]), "f32")[0] == 2.0 ** -23
    assert float(np.nextafter(np.float32(1.0), np.float32(0.0))) == 1.0 - 2.0 ** -24


def test_spacing_subnormal_and_zero():
    """Subnormals and zero have the smallest-subnormal spacing (f16 2^-24, f32 2^-149)."""
    np.testing.assert_array_equal(spacing(np.array([0.0, 2.0 ** -15, 2.0 ** -14]), "f16"),
                                  [2.0 ** -24, 2.0 ** -24, 2.0 ** -24])
    np.testing.assert_array_equal(spacing(np.array([0.0, 1e-40]), "f32"),
                                  [2.0 ** -149, 2.0 ** -149])


def test_spacing_clamps_past_max_finite():
    """A finite value past the dtype's max gets the spacing at max (f16: 32), not a huge one."""
    assert spacing(np.array([70000.0]), "f16")[0] == 32.0


# --- ulp_distance --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_ulp_distance_signed_zeros_equal(dtype):
    """+0 and -0 differ in bits but are the same value: distance 0."""
    assert ulp_distance(np.array([0.0]), np.array([-0.0]), dtype)[0] == 0


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_ulp_distance_adjacent_is_one(dtype):
    """Neighbouring representable values are 1 apart, on both sides of a binade edge and for
    negative values."""
    ulp = 2.0 ** -MANTISSA[dtype]
    a = np.array([1.0, 1.0, -1.0, 1.5])
    b = np.array([1.0 + ulp, 1.0 - ulp / 2, -(1.0 + ulp), 1.5 + ulp])
    np.testing.assert_array_equal(ulp_distance(a, b, dtype), [1, 1, 1, 1])


def test_ulp_distance_counts_many():
    """Distances count every representable value in between: bf16 [1, 2) holds 128 values,
    f32 1 -> 1 + 5 ULP is 5."""
    assert ulp_distance(np.array([1.0]), np.array([2.0]), "bf16")[0] == 128
    assert ulp_distance(np.array([1.0]), np.array([1.0 + 5 * 2.0 ** -23]), "f32")[0] == 5


def test_ulp_distance_sign_crossing():
    """Across zero the count goes through zero once: smallest subnormals of opposite sign are
    2 apart; -1 and 1 are twice 1.0's bit pattern apart (bf16 0x3F80, f16 0x3C00)."""
    tiny_sub = 2.0 ** -24
    assert ulp_distance(np.array([tiny_sub]), np.array([-tiny_sub]), "f16")[0] == 2
    assert ulp_distance(np.array([-1.0]), np.array([1.0]), "bf16")[0] == 2 * 0x3F80
    assert ulp_distance(np.array([-1.0]), np.array([1.0]), "f16")[0] == 2 * 0x3C00


def test_ulp_distance_to_infinity():
    """inf is one step past the largest finite value."""
    assert ulp_distance(np.array([65504.0]), np.array([np.inf]), "f16")[0] == 1


def test_ulp_distance_rounds_inputs_first():
    """float64 inputs are rounded to the dtype before counting: 1 + 2^-9 is bf16 1.0."""
    assert ulp_distance(np.array([1.0 + 2.0 ** -9]), np.array([1.0]), "bf16")[0] == 0
    assert storage_dtype("bf16") == np.dtype(ml_dtypes.bfloat16)


# --- rounding_margin -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, values, expected", [
    # 1.0: the nearer boundary is below (1 - 2^-9 for bf16, the gap below 1 being half size).
    ("bf16", [1.0, -1.0], [2.0 ** -9, 2.0 ** -9]),
    # 1 + 3*2^-10 rounds to 1; the midpoint above is 1 + 2^-8: margin 2^-10.
    ("bf16", [1.0 + 3 * 2.0 ** -10], [2.0 ** -10]),
    # exactly on a midpoint: margin 0.
    ("bf16", [1.0 + 2.0 ** -8], [0.0]),
    # 65504 rounds to bf16 65536; the midpoint below is 65408.
    ("bf16", [65504.0], [96.0]),
    ("f16", [1.0], [2.0 ** -12]),
    # f16 max: the boundary above is at inf, the one below at 65488.
    ("f16", [65504.0], [16.0]),
    # zero: half the smallest subnormal.
    ("f16", [0.0], [2.0 ** -25]),
    ("f32", [0.0], [2.0 ** -150]),
    ("f32", [1.0 + 2.0 ** -23], [2.0 ** -24]),
])
def test_rounding_margin_known_points(dtype, values, expected):
    """Distance to the nearest rounding boundary at hand-computed points."""
    np.testing.assert_array_equal(rounding_margin(np.array(values), dtype), expected)


def test_rounding_margin_infinite_is_inf():
    """Non-finite inputs have no boundary nearby: margin inf (never 'may flip')."""
    assert rounding_margin(np.array([np.inf]), "f16")[0] == np.inf
