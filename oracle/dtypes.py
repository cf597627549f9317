"""Storage dtypes and the few floating-point facts tolerances are derived from.

Names are kparity's: "f32", "f16", "bf16" for activations; "e4m3", "e5m2" (fp8), "e2m1" (fp4)
and "ue8m0" (MX block scales) for narrow storage; "u32"/"i32"/"i64"/"u8" for packed codes and
indices. `DTYPES` lists them all: every dtype a tensor, a case or a role may name is checked
against it (`check_dtype`). Narrow and bf16 storage comes from `ml_dtypes`; e2m1 is stored one
value per byte here (`ml_dtypes.float4_e2m1fn`), and `pack_e2m1` / `unpack_e2m1` convert to and
from kernel storage, two codes per byte. `round_to` rounds a float64 value to
nearest, ties to even (RNE), in ONE step, the rounding GPU stores use (`__float2bfloat16_rn`,
`cvt.rn.f16.f32`, Metal's `bfloat(x)`). ml_dtypes' own `astype` from float64 goes through float32
first and so rounds twice: `1 + 2^-8 + 2^-30` becomes bf16 1.0 that way, RNE gives 1.0078125.

Formats without infinity follow ml_dtypes' conversion (measured on ml_dtypes 0.6.0) where a value
rounds past max finite: e4m3 -> NaN (0x7F / 0xFF, sign kept; ±inf too), ue8m0 -> NaN (0xFF),
e2m1 -> ±6 (it saturates; it has no NaN either, so a NaN input raises instead of becoming ±0 as
ml_dtypes' bit cast does). `round_to(..., saturate=True)` instead clamps every overflow, ±inf
included, to ±max finite in every format (CUDA's fp8 conversions take `__NV_SATFINITE` for
out-of-range values); NaN stays NaN. ml_dtypes 0.6.0 also casts float32 subnormals in
(2^-127, 1.5 * 2^-127) to ue8m0 2^-126, not the nearest 2^-127; round_to gives 2^-127.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

FLOAT_DTYPES = ("f32", "f16", "bf16")        # activation dtypes: every op runs on these
NARROW_FLOATS = ("e4m3", "e5m2", "e2m1", "ue8m0")  # quantized storage and block scales


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point storage format.

    A finite nonzero value is (-1)^s * 2^(E - bias) * 1.f (normal, E >= 1) or
    (-1)^s * 2^(1 - bias) * 0.f (subnormal, E = 0), f having `mantissa_bits` bits; ue8m0 has no
    sign, no mantissa, no zero and no subnormals: every field E < 255 is 2^(E - 127).
    """
    name: str
    dtype: np.dtype           # the ml_dtypes / NumPy dtype of one element (e2m1: one per byte)
    bits: int                 # bits per element in kernel memory (e2m1: 4, packed two per byte)
    exponent_bits: int
    mantissa_bits: int
    bias: int
    signed: bool
    has_inf: bool
    nan: str | None           # "ieee": exponent all ones, mantissa != 0; "s1111111": only
                              # S.1111.111 (e4m3fn); "0xff": only 0xFF (ue8m0); None: no NaN
    has_zero: bool
    overflow: str             # what a value rounding past max_finite becomes: "inf" / "nan" /
                              # "saturate" (±max_finite)
    max_finite: float
    tiny: float               # smallest positive normal
    smallest_subnormal: float  # = tiny where there are no subnormals

    @property
    def eps(self) -> float:
        """Spacing of 1.0 to the next value up: 2^-mantissa_bits."""
        return 2.0 ** -self.mantissa_bits

    @property
    def beyond_max(self) -> float:
        """The grid point above max finite were the exponent unbounded, max + 2^(E_max - m)
        (f16 2^16, e4m3 480, e2m1 8, ue8m0 2^128): an RNE result equal to it overflows, so the
        overflow threshold is the midpoint (max + beyond_max) / 2, itself a tie."""
        return self.max_finite + 2.0 ** (np.floor(np.log2(self.max_finite)) - self.mantissa_bits)

    @property
    def uint(self) -> np.dtype:
        """Same-width unsigned integer view of one stored element."""
        return np.dtype({1: np.uint8, 2: np.uint16, 4: np.uint32}[self.dtype.itemsize])


def _fmt(name, dtype, bits, e, m, bias, *, signed=True, inf=True, nan="ieee", zero=True,
         overflow="inf", max_finite, tiny, sub) -> FloatFormat:
    return FloatFormat(name, np.dtype(dtype), bits, e, m, bias, signed, inf, nan, zero, overflow,
                       float(max_finite), float(tiny), float(sub))


FLOAT_FORMATS: dict[str, FloatFormat] = {f.name: f for f in (
    # IEEE binary32 / binary16: max (2 - 2^-m) * 2^(2^e - 2 - bias), tiny 2^(1 - bias).
    _fmt("f32", np.float32, 32, 8, 23, 127,
         max_finite=(2 - 2.0 ** -23) * 2.0 ** 127, tiny=2.0 ** -126, sub=2.0 ** -149),
    _fmt("f16", np.float16, 16, 5, 10, 15, max_finite=65504.0, tiny=2.0 ** -14, sub=2.0 ** -24),
    # bfloat16: float32's exponent, 7 mantissa bits.
    _fmt("bf16", ml_dtypes.bfloat16, 16, 8, 7, 127,
         max_finite=(2 - 2.0 ** -7) * 2.0 ** 127, tiny=2.0 ** -126, sub=2.0 ** -133),
    # OCP fp8 E4M3 ("fn": finite): no inf, E = 15 holds normals up to 1.110b * 2^8 = 448,
    # S.1111.111 is NaN. Overflow -> NaN as ml_dtypes converts.
    _fmt("e4m3", ml_dtypes.float8_e4m3fn, 8, 4, 3, 7, inf=False, nan="s1111111",
         overflow="nan", max_finite=448.0, tiny=2.0 ** -6, sub=2.0 ** -9),
    # OCP fp8 E5M2: IEEE-like, max 1.11b * 2^15 = 57344.
    _fmt("e5m2", ml_dtypes.float8_e5m2, 8, 5, 2, 15, max_finite=57344.0, tiny=2.0 ** -14,
         sub=2.0 ** -16),
    # OCP MX fp4 E2M1: values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; no inf, no NaN; overflow saturates.
    _fmt("e2m1", ml_dtypes.float4_e2m1fn, 4, 2, 1, 1, inf=False, nan=None, overflow="saturate",
         max_finite=6.0, tiny=1.0, sub=0.5),
    # OCP MX scale E8M0: unsigned powers of two 2^-127 .. 2^127, 0xFF is NaN, no zero.
    _fmt("ue8m0", ml_dtypes.float8_e8m0fnu, 8, 8, 0, 127, signed=False, inf=False, nan="0xff",
         zero=False, overflow="nan", max_finite=2.0 ** 127, tiny=2.0 ** -127, sub=2.0 ** -127),
)}

_INT_STORAGE = {
    "u32": np.dtype(np.uint32),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
}

DTYPES = (*FLOAT_FORMATS, *_INT_STORAGE)  # every dtype name kparity knows


def is_dtype(name: str) -> bool:
    return name in FLOAT_FORMATS or name in _INT_STORAGE


def is_float(name: str) -> bool:
    """A floating-point format (rounding, spacing and ULPs apply), not an integer dtype."""
    return name in FLOAT_FORMATS


def check_dtype(name: str, what: str = "dtype") -> str:
    """`name` if it is a dtype kparity knows, else ValueError naming `what` and the valid names."""
    if not isinstance(name, str) or not is_dtype(name):
        raise ValueError(f"{what}: unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return name


def dtype_name(np_dtype) -> str | None:
    """The kparity name of a NumPy / ml_dtypes storage dtype (None if it is none of them): what a
    backend reads off a host array to pick its device dtype."""
    np_dtype = np.dtype(np_dtype)
    return next((name for name in DTYPES if storage_dtype(name) == np_dtype), None)


# NumPy converts float64 to these in one correctly rounded (RNE) step; tests/test_rounding.py
# checks it against an exact reference. Every other format goes through `_round_rne`.
_NUMPY_ROUNDS_ONCE = ("f32", "f16")


def storage_dtype(name: str) -> np.dtype:
    if name in FLOAT_FORMATS:
        return FLOAT_FORMATS[name].dtype
    try:
        return _INT_STORAGE[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}") from None


def float_format(name: str) -> FloatFormat:
    try:
        return FLOAT_FORMATS[name]
    except KeyError:
        storage_dtype(name)  # raises for names that are not dtypes at all
        raise ValueError(f"{name!r} is not a floating-point format") from None


def _round_rne(x: np.ndarray, fmt: FloatFormat, saturate: bool) -> np.ndarray:
    """float64 -> float64 values of `fmt`, rounded to nearest, ties to even, in one step.

    With |x| = f * 2^e, f in [0.5, 1) (np.frexp, exact), the leading bit is 2^(e-1) and the
    format's spacing there is the quantum q = 2^(e - 1 - m), floored at the smallest subnormal
    (below tiny the spacing stops shrinking). |x| / q is exact (q is a power of two; the
    quotient is below 2^(m+1), or a subnormal-range |x| scaled up), so np.rint(|x| / q) * q is
    RNE: the integer multiple of q nearest |x|, the even one on a tie. A tie between the top
    of a binade and the next power of two ends on the even multiple too (2^(m+1), the power
    of two).
    Rounding is done as if the exponent were unbounded, so overflow is then |r| > max finite
    (IEEE 754's rule): for f16, 65520 = 2047.5 * 32 ties to 2048 * 32 = 2^16 -> inf, while for
    e4m3, 464 = 14.5 * 32 ties to 14 * 32 = 448 and stays finite.
    With no mantissa bits (ue8m0) every tie 1.5 * 2^k goes up to 2^(k+1) (rint(1.5) = 2), as
    ml_dtypes does.
    """
    x = np.asarray(x, dtype=np.float64)
    mag = np.abs(x)
    _, e = np.frexp(mag)
    q_exp = np.maximum(e - 1 - fmt.mantissa_bits, int(np.log2(fmt.smallest_subnormal)))
    with np.errstate(invalid="ignore"):  # NaN / inf pass through rint and ldexp unchanged
        r = np.ldexp(np.rint(np.ldexp(mag, -q_exp)), q_exp)
        overflow_to = {"inf": np.inf, "nan": np.nan, "saturate": fmt.max_finite}[
            "saturate" if saturate else fmt.overflow]
        r = np.where(r > fmt.max_finite, overflow_to, r)
    if not fmt.signed:
        # ue8m0: no zero, so every positive value below 2^-127 has 2^-127 as its nearest; zero,
        # negatives and NaN have no representation at all -> NaN (as ml_dtypes casts them).
        return np.where(x > 0, np.maximum(r, fmt.tiny), np.nan)
    return np.copysign(r, x)  # keeps -0.0 and the sign of an overflowed value


def _round_rne_bits(x: np.ndarray, fmt: FloatFormat, saturate: bool) -> np.ndarray:
    """`_round_rne` for a signed format with a mantissa, on float64's bits (~5x faster: the
    bounds round every interval end to bf16 this way).

    Where |x| is a normal of `fmt`, its quantum is float64's last kept bit once the low
    s = 52 - m bits go: adding 2^(s-1) - 1 plus the kept part's lowest bit, then clearing the
    low s bits, is RNE (a tie goes up exactly when the kept part is odd; a carry out of the
    mantissa steps the exponent, as the next binade's first value). Below fmt's tiny the quantum
    is its smallest subnormal (a power of two), so rint(x / sub) * sub is exact RNE. Infinity's
    low bits are 0 (nothing carries); NaN and overflow are set as `_round_rne` sets them.
    """
    shape = np.shape(x)
    x = np.asarray(x, dtype=np.float64, order="C").reshape(-1)  # 1-D: 0-d ops give scalars
    s = np.uint64(52 - fmt.mantissa_bits)
    bits = x.view(np.uint64)
    kept = bits >> s
    kept &= np.uint64(1)
    kept += bits
    kept += (np.uint64(1) << (s - np.uint64(1))) - np.uint64(1)
    kept >>= s
    kept <<= s
    r = kept.view(np.float64)  # a fresh array: written in place below
    mag = np.abs(x)
    small = mag < fmt.tiny
    if small.any():
        r[small] = np.rint(x[small] / fmt.smallest_subnormal) * fmt.smallest_subnormal
    with np.errstate(invalid="ignore"):
        over = np.abs(r) > fmt.max_finite
    if over.any():
        overflow_to = {"inf": np.inf, "nan": np.nan, "saturate": fmt.max_finite}[
            "saturate" if saturate else fmt.overflow]
        r[over] = np.copysign(overflow_to, x[over])
    nan = np.isnan(mag)
    if nan.any():
        r[nan] = x[nan]
    return r.reshape(shape)


def round_to(x: np.ndarray, name: str, *, saturate: bool = False) -> np.ndarray:
    """Round values (taken as float64) to dtype `name`, RNE in one step, returned in that dtype.

    Overflow (a value whose RNE result, exponent unbounded, exceeds max finite) gives ±inf, or
    for formats without inf what ml_dtypes gives (e4m3, ue8m0: NaN; e2m1: ±6), or ±max finite
    with `saturate`. NaN stays NaN (e2m1 has no NaN: ValueError); signed zeros are kept.
    Integer names keep NumPy's `astype`.
    """
    if name not in FLOAT_FORMATS:
        return np.asarray(x).astype(storage_dtype(name))
    fmt = FLOAT_FORMATS[name]
    x = np.asarray(x, dtype=np.float64)
    if fmt.nan is None and np.isnan(x).any():
        raise ValueError(f"{name} has no NaN; {np.isnan(x).sum()} NaN input(s)")
    if name in _NUMPY_ROUNDS_ONCE and not saturate:
        with np.errstate(over="ignore"):  # finite -> inf is the IEEE overflow result
            return x.astype(fmt.dtype)
    rne = _round_rne_bits if fmt.signed and fmt.mantissa_bits > 0 else _round_rne
    return rne(x, fmt, saturate).astype(fmt.dtype)  # exact: values are representable


def eps(name: str) -> float:
    """Machine epsilon: spacing of 1.0 to the next value (f32 2^-23, f16 2^-10, bf16 2^-7)."""
    return float_format(name).eps


def tiny(name: str) -> float:
    """Smallest positive normal."""
    return float_format(name).tiny


def smallest_subnormal(name: str) -> float:
    return float_format(name).smallest_subnormal


def max_finite(name: str) -> float:
    return float_format(name).max_finite


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
    """Map stored values to integers whose order and differences count representable values
    (ULPs): sign-magnitude bits -> two's complement, with +0 and -0 both 0."""
    fmt = float_format(name)
    bits = np.ascontiguousarray(x).view(fmt.uint).astype(np.int64)
    if not fmt.signed:
        return bits
    sign = np.int64(1) << (fmt.bits - 1)
    return np.where(bits & sign, -(bits & (sign - 1)), bits)


def ulp_distance(a: np.ndarray, b: np.ndarray, name: str) -> np.ndarray:
    """How many representable `name` values lie between a and b (0 = bit-identical up to ±0)."""
    return np.abs(ordered_bits(round_to(a, name), name) - ordered_bits(round_to(b, name), name))


def from_ordered(ordered: np.ndarray, name: str) -> np.ndarray:
    """Inverse of `ordered_bits`, as float64. One step past ±max finite gives ±beyond_max, so
    the overflow threshold counts as a rounding boundary (not for e2m1, which saturates: no
    boundary there); further steps (inf, NaN, wrapped codes) give ±inf: no boundary."""
    fmt = float_format(name)
    top = int(ordered_bits(round_to(np.array([fmt.max_finite]), name), name)[0])
    bottom = -top if fmt.signed else 0
    if fmt.signed:
        sign = np.int64(1) << (fmt.bits - 1)
        bits = np.where(ordered < 0, (-ordered) | sign, ordered)
    else:
        bits = ordered
    bits = np.clip(bits, 0, np.iinfo(fmt.uint).max).astype(fmt.uint)
    values = bits.view(fmt.dtype).astype(np.float64)
    past = np.inf if fmt.overflow == "saturate" else fmt.beyond_max
    values = np.where(ordered == top + 1, past, np.where(ordered > top + 1, np.inf, values))
    if fmt.signed:
        return np.where(ordered == bottom - 1, -past,
                        np.where(ordered < bottom - 1, -np.inf, values))
    return np.where(ordered < bottom, -np.inf, values)


def rounding_margin(values: np.ndarray, name: str) -> np.ndarray:
    """Distance from each float64 value to the nearest rounding boundary of `name` (the midpoints
    between consecutive representable values). Where it is below a kernel's own arithmetic noise,
    the kernel may legitimately round to the other neighbour."""
    v = np.asarray(values, dtype=np.float64)
    r = round_to(v, name)
    ordered = ordered_bits(r, name)
    r64 = r.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        up = from_ordered(ordered + 1, name)
        down = from_ordered(ordered - 1, name)
        margin = np.minimum(np.abs(v - 0.5 * (r64 + up)), np.abs(v - 0.5 * (r64 + down)))
    return np.where(np.isfinite(margin), margin, np.inf)


# --- packed storage ---------------------------------------------------------------------------

E2M1 = FLOAT_FORMATS["e2m1"].dtype


def pack_e2m1(values: np.ndarray) -> np.ndarray:
    """e2m1 values [..., n] (`ml_dtypes.float4_e2m1fn`, one per byte) -> uint8 [..., n / 2], two
    4-bit codes per byte along the last axis, low nibble first: byte j = code[2j] | code[2j+1] << 4
    (how CUDA's `__nv_fp4x2_e2m1` and torch's `float4_e2m1fn_x2` store FP4). n must be even."""
    values = np.asarray(values)
    if values.dtype != E2M1:
        raise ValueError(f"pack_e2m1 takes e2m1 values (ml_dtypes.float4_e2m1fn), got "
                         f"{values.dtype}; round first: round_to(x, 'e2m1')")
    if values.ndim == 0 or values.shape[-1] % 2:
        raise ValueError(f"pack_e2m1: the last axis must have an even length (two codes per "
                         f"byte), got shape {values.shape}")
    codes = np.ascontiguousarray(values).view(np.uint8) & 0x0F
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., m] of two e2m1 codes per byte (low nibble first) -> e2m1 values [..., 2m]
    (`ml_dtypes.float4_e2m1fn`): the inverse of `pack_e2m1`."""
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:
        raise ValueError(f"unpack_e2m1 takes uint8 bytes, got {packed.dtype}")
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    return np.ascontiguousarray(codes).view(E2M1)
