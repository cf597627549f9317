"""Storage dtypes and the few floating-point facts tolerances are derived from.

Names are kparity's: "f32", "f16", "bf16" for activations, "u32"/"i32" for packed codes and indices.
bf16 storage comes from `ml_dtypes`; every conversion rounds to nearest, ties to even (RNE), the
rounding GPU stores use (`__float2bfloat16_rn`, `cvt.rn.f16.f32`, Metal's `bfloat(x)`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT_DTYPES = ("f32", "f16", "bf16")

_STORAGE = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "u32": np.dtype(np.uint32),
    "i32": np.dtype(np.int32),
}
# Same-width unsigned integer views, for bit comparisons and ULP distances.
_BITS = {"f32": np.uint32, "f16": np.uint16, "bf16": np.uint16}


def storage_dtype(name: str) -> np.dtype:
    try:
        return _STORAGE[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; valid: {', '.join(_STORAGE)}") from None


def round_to(x: np.ndarray, name: str) -> np.ndarray:
    """Round float64 values to the storage dtype (RNE), returned in that dtype."""
    return np.asarray(x).astype(storage_dtype(name))


def eps(name: str) -> float:
    """Machine epsilon: spacing of 1.0 to the next value (f32 2^-23, f16 2^-10, bf16 2^-7)."""
    return float(ml_dtypes.finfo(storage_dtype(name)).eps)


def tiny(name: str) -> float:
    """Smallest positive normal."""
    return float(ml_dtypes.finfo(storage_dtype(name)).tiny)


def smallest_subnormal(name: str) -> float:
    return float(ml_dtypes.finfo(storage_dtype(name)).smallest_subnormal)


def max_finite(name: str) -> float:
    return float(ml_dtypes.finfo(storage_dtype(name)).max)


def spacing(values: np.ndarray, name: str) -> np.ndarray:
    """ULP of each value in dtype `name`: the gap from |v| rounded to `name` to the next one up.

    Exact for normal and subnormal values; at a binade edge it is the larger (upper) gap, which
    makes a half-ULP bound derived from it safe on both sides of the edge.
    """
    mag = np.abs(np.asarray(values, dtype=np.float64))
    mag = np.where(np.isfinite(mag), np.minimum(mag, max_finite(name)), 0.0)
    exponent = np.floor(np.log2(np.maximum(mag, tiny(name))))
    return np.maximum(np.exp2(exponent) * eps(name), smallest_subnormal(name))


def ordered_bits(x: np.ndarray, name: str) -> np.ndarray:
    """Map floats to integers whose order and differences count representable values (ULPs)."""
    bits = np.ascontiguousarray(x).view(_BITS[name]).astype(np.int64)
    width = 8 * np.dtype(_BITS[name]).itemsize
    sign = np.int64(1) << (width - 1)
    return np.where(bits & sign, -(bits & (sign - 1)), bits)


def ulp_distance(a: np.ndarray, b: np.ndarray, name: str) -> np.ndarray:
    """How many representable `name` values lie between a and b (0 = bit-identical up to ±0)."""
    a = np.asarray(a).astype(storage_dtype(name))
    b = np.asarray(b).astype(storage_dtype(name))
    return np.abs(ordered_bits(a, name) - ordered_bits(b, name))


def _from_ordered(ordered: np.ndarray, name: str) -> np.ndarray:
    width = 8 * np.dtype(_BITS[name]).itemsize
    sign = np.int64(1) << (width - 1)
    bits = np.where(ordered < 0, (-ordered) | sign, ordered).astype(_BITS[name])
    return bits.view(storage_dtype(name)).astype(np.float64)


def rounding_margin(values: np.ndarray, name: str) -> np.ndarray:
    """Distance from each float64 value to the nearest rounding boundary of `name` (the midpoints
    between consecutive representable values). Where it is below a kernel's own arithmetic noise,
    the kernel may legitimately round to the other neighbour."""
    v = np.asarray(values, dtype=np.float64)
    r = round_to(v, name)
    ordered = ordered_bits(r, name)
    r64 = r.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        up = _from_ordered(ordered + 1, name)
        down = _from_ordered(ordered - 1, name)
        margin = np.minimum(np.abs(v - 0.5 * (r64 + up)), np.abs(v - 0.5 * (r64 + down)))
    return np.where(np.isfinite(margin), margin, np.inf)
