"""NVFP4 and MXFP4 block quantization (vLLM `tests/kernels/quantization/test_nvfp4_quant.py`,
TE `quantization_nvfp4.py`, MLX `ops.cpp` `fp_quantize`, llama.cpp `ggml-quants.c`, the OCP MX
v1.0 spec): `fp4_quantize`, `fp4_dequantize`.

E2M1 (FP4) magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} for codes 0-7, code = sign << 3 | magnitude;
two codes per byte, element 2j in the low nibble (vLLM, TE, CUDA's `__nv_fp4x2_e2m1`).

Formats (param `format`), x [R, K] in T quantized in blocks of `block` consecutive elements of K:

    nvfp4   block 16, UE4M3 block scale (u8 bits of float8_e4m3fn), f32 tensor scale
            gs_enc = f32(2688 / amax(|X|))   clamped to f32 max; 1 when amax = 0 (TE's rule)
            tensor_scale = gs_dec = f32(1 / gs_enc)               (the op's third output)
    mxfp4   block 32, E8M0 block scale (u8 biased exponent e + 127), no tensor scale
            (tensor_scale = 1)

Scale rules (param `scale_rule`: where the references disagree, each one is a named variant; every
step is an f32 operation, as the reference computes it):

    nvfp4 "exact" (vLLM `ref_nvfp4_quant`): s = gs_enc * (vmax * f32(1/6)); sf = e4m3(min(s, 448))
          RNE; enc = 1 / (sf * gs_dec) (0 where sf = 0); q = e2m1(clamp(x * enc, -6, 6)), RNE
    nvfp4 "mlx" (`mx.quantize(mode="nvfp4", global_scale=amax)`, ops.cpp's fallback, measured on
          MLX 0.32.4 CPU: see `mlx_nvfp4`): nearest-low E2M1 rounding
    mxfp4 "ocp" (OCP MX v1.0, llama.cpp): e = floor(log2 amax) - 2; q = e2m1(x / 2^e) RNE
    mxfp4 "ceil" (TE `cast_to_e8`, vLLM/TRT CUDA's cudaRoundPosInf): e = ceil(log2(f32(amax / 6)))
    mxfp4 "mlx" (`mx.quantize(mode="mxfp4")`, MLX 0.32.4 CPU): e = ceil(log2(f32(amax / 6))) as
          "ceil" (not the round(log2(amax / 6)) its ops.cpp fallback reads as: measured bit for
          bit, tests/test_fp4.py), with nearest-low E2M1
    (mxfp4: e clamped to [-127, 127]; an all-zero block gets e = -127, scale byte 0, except
    under "mlx", where it gets e = 0, byte 127, as MLX 0.32.4 stores it.)

E2M1 rounding of a scaled value v (saturating at ±6):
    "rne"          ties to the even code (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4),
                   the sign kept even where |v| rounds to 0 (-0.1 -> code 0x8), as
                   `cvt.rn.satfinite.e2m1x2.f32` does
    "nearest_low"  MLX's / llama.cpp's argmin over the signed LUT: ties to the lower magnitude
                   (0.75->0.5, 1.75->1.5, 3.5->3), and +0 (code 0) wherever |v| rounds to 0
The "mlx" rules round nearest_low, every other rule rne.

Dequantize: x_hat = e2m1(q) * scale * tensor_scale in float64, one rounding to T (an impl in f32
rounds the product with gs_dec once more: the bound charges half an f32 ULP and half a T ULP).
NaN and inf inputs are outside the domain: the references give NaN scales or undefined codes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from oracle.comparators import Exact
from oracle.dtypes import round_to, spacing
from oracle.spec import OpSpec, TensorSpec, register

MAGS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
BLOCK = {"nvfp4": 16, "mxfp4": 32}
RULES = {"nvfp4": ("exact", "mlx"), "mxfp4": ("ocp", "ceil", "mlx")}
ROUNDINGS = ("rne", "nearest_low", "half_away")  # half_away: the mutant's bug, no format's rule
F32 = np.float32
E4M3 = ml_dtypes.float8_e4m3fn


def rounding_of(rule: str) -> str:
    """The E2M1 rounding a scale rule implies: MLX's LUT argmin for "mlx", RNE otherwise."""
    return "nearest_low" if rule == "mlx" else "rne"


def e2m1_codes(v: np.ndarray, rounding: str = "rne") -> np.ndarray:
    """Scaled values v -> 4-bit codes (uint8), nearest magnitude, ties by `rounding`; |v| > 6
    saturates to 6. See the module docstring for the sign of a value rounding to 0."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding {rounding!r}; valid: {', '.join(ROUNDINGS)}")
    v = np.asarray(v, dtype=np.float64)
    a = np.minimum(np.abs(v), 6.0)
    dist = np.abs(a[..., None] - MAGS)
    best = dist.min(axis=-1, keepdims=True)
    tied = dist == best  # one or two (adjacent) candidates
    low = np.argmax(tied, axis=-1)  # the lower of the candidates
    two = tied.sum(axis=-1) > 1
    if rounding == "rne":
        mag = np.where(two & (low % 2 == 1), low + 1, low)  # the even code of the two
    elif rounding == "half_away":
        mag = np.where(two, low + 1, low)
    else:
        mag = low
    neg = np.signbit(v) if rounding != "nearest_low" else (np.signbit(v) & (mag > 0))
    return (mag + 8 * neg).astype(np.uint8)


def e2m1_values(codes: np.ndarray) -> np.ndarray:
    """4-bit codes -> float64 values (code 8 is -0)."""
    codes = np.asarray(codes).astype(np.int64)
    mag = MAGS[codes & 7]
    return np.where(codes & 8, -mag, mag)


def pack(codes: np.ndarray) -> np.ndarray:
    """codes [..., K] -> bytes [..., K/2]: element 2j in the low nibble."""
    codes = np.asarray(codes, dtype=np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack(packed: np.ndarray) -> np.ndarray:
    """bytes [..., K/2] -> codes [..., K], the inverse of `pack`."""
    packed = np.asarray(packed, dtype=np.uint8)
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def _blocks(x: np.ndarray, block: int) -> np.ndarray:
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


def _e4m3(s: np.ndarray) -> np.ndarray:
    """f32 scales -> float8_e4m3fn, RNE, after the references' clamp to 448 (no NaN)."""
    return np.minimum(s, F32(448)).astype(E4M3)


def tensor_encode(x: np.ndarray) -> np.float32:
    """gs_enc = f32(2688 / amax), clamped to f32's max (an amax below 2688 / 3.4e38 = 7.9e-36
    overflows it), 1 where amax is 0: TE's rule (vLLM's ref would give inf)."""
    amax = F32(np.max(np.abs(x))) if x.size else F32(0)
    if amax == 0:
        return F32(1)
    with np.errstate(over="ignore"):
        return np.minimum(F32(F32(2688) / amax), np.finfo(F32).max)


def nvfp4_exact(x: np.ndarray, rounding: str = "rne"):
    """(codes [R, K], scale bytes [R, K/16], gs_dec) by vLLM's `ref_nvfp4_quant` in f32."""
    x = np.asarray(x).astype(F32)
    gs_enc = tensor_encode(x)
    gs_dec = F32(F32(1) / gs_enc)
    xb = _blocks(x, 16)
    vmax = np.abs(xb).max(axis=-1)
    s = (gs_enc * (vmax * F32(F32(1) / F32(6)))).astype(F32)
    sf = _e4m3(s)
    sf32 = sf.astype(F32)
    with np.errstate(divide="ignore"):
        enc = np.where(sf32 == 0, F32(0), F32(1) / (sf32 * gs_dec)).astype(F32)
    scaled = np.clip((xb * enc[..., None]).astype(F32), F32(-6), F32(6))
    codes = e2m1_codes(scaled, rounding).reshape(x.shape)
    return codes, sf.view(np.uint8), gs_dec


def nvfp4_mlx(x: np.ndarray, dtype: str, rounding: str = "nearest_low"):
    """(codes, scale bytes, gs_dec) as `mx.quantize(x, mode="nvfp4", global_scale=amax)` on MLX
    0.32.4 CPU: vmax / 6 in T, times scale_encode = f32(2688 / amax) in f32, e4m3; the elements
    x * scale_encode / sf in f32, LUT argmin (tests/test_fp4.py pins it against MLX). Bit-exact
    for f32 x only: MLX rounds the half-precision element scaling at points not identified."""
    x64 = np.asarray(x).astype(np.float64)
    x = x64.astype(F32)
    gs_enc = tensor_encode(x)
    xb = _blocks(x, 16)
    vmax = round_to(np.abs(_blocks(x64, 16)).max(axis=-1) / 6, dtype).astype(F32)
    sf = _e4m3((vmax * gs_enc).astype(F32))
    sf32 = sf.astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = ((xb * gs_enc).astype(F32) / sf32[..., None]).astype(F32)
    scaled = np.where(sf32[..., None] == 0, F32(0), scaled)
    codes = e2m1_codes(scaled, rounding).reshape(x.shape)
    return codes, sf.view(np.uint8), F32(F32(1) / gs_enc)


def mx_exponent(amax: np.ndarray, rule: str) -> np.ndarray:
    """The unbiased E8M0 exponent per block, from the block's amax (f32), clamped to
    [-127, 127]; -127 for an all-zero block. Exact (frexp), not a float log2."""
    amax = np.asarray(amax, dtype=F32)
    if rule == "ocp":
        m, e = np.frexp(amax.astype(np.float64))  # amax = m 2^e, m in [0.5, 1)
        exp = e - 1 - 2  # floor(log2 amax) - emax(E2M1)
    else:
        y = (amax / F32(6)).astype(F32).astype(np.float64)
        m, e = np.frexp(y)
        if rule in ("ceil", "mlx"):
            exp = np.where(m == 0.5, e - 1, e)
        else:
            raise ValueError(f"mxfp4 scale_rule {rule!r}; valid: {', '.join(RULES['mxfp4'])}")
    zero = 0 if rule == "mlx" else -127  # MLX gives an all-zero block the scale 2^0
    return np.where(amax == 0, zero, np.clip(exp, -127, 127)).astype(np.int64)


def mxfp4(x: np.ndarray, rule: str, rounding: str):
    """(codes [R, K], scale bytes [R, K/32], 1): x / 2^e per block (exact), E2M1 by `rounding`."""
    x = np.asarray(x).astype(np.float64)
    xb = _blocks(x, 32)
    exp = mx_exponent(np.abs(xb).max(axis=-1), rule)
    scaled = xb / np.exp2(exp)[..., None]
    codes = e2m1_codes(scaled, rounding).reshape(x.shape)
    return codes, (exp + 127).astype(np.uint8), F32(1)


def quantize(x: np.ndarray, fmt: str, rule: str, dtype: str, rounding: str | None = None):
    """(codes [R, K] uint8, scale bytes [R, K/block] uint8, tensor_scale f32) by rule `rule`."""
    if rule not in RULES.get(fmt, ()):
        raise ValueError(f"format {fmt!r} with scale_rule {rule!r}; valid: "
                         + "; ".join(f"{f}: {', '.join(r)}" for f, r in RULES.items()))
    rounding = rounding or rounding_of(rule)
    if fmt == "mxfp4":
        return mxfp4(x, rule, rounding)
    if rule == "mlx":
        return nvfp4_mlx(x, dtype, rounding)
    return nvfp4_exact(x, rounding)


def scale_values(scales: np.ndarray, fmt: str) -> np.ndarray:
    """Scale bytes -> float64: e4m3 bits (nvfp4) or 2^(e - 127) (mxfp4), byte 255 NaN: E8M0's
    one NaN encoding (OCP MX v1.0 §5.4.1, as `oracle/dtypes.py`'s ue8m0 and ml_dtypes'
    float8_e8m0fnu decode it), not 2^128. `fp4_quantize` never writes it (e <= 127)."""
    scales = np.asarray(scales, dtype=np.uint8)
    if fmt == "nvfp4":
        return scales.view(E4M3).astype(np.float64)
    return np.where(scales == 255, np.nan, np.exp2(scales.astype(np.float64) - 127))


def dequantize(codes: np.ndarray, scales: np.ndarray, tensor_scale, fmt: str) -> np.ndarray:
    """x_hat [R, K] = e2m1(q) * scale * tensor_scale, float64 (exact)."""
    q = e2m1_values(unpack(codes))
    s = np.repeat(scale_values(scales, fmt), BLOCK[fmt], axis=-1)
    return q * s * float(np.asarray(tensor_scale, dtype=np.float64).reshape(-1)[0])


# --- ops -------------------------------------------------------------------------------------------

def _params(case) -> tuple[str, str]:
    return case.params["format"], case.params["scale_rule"]


def fp4_domain(case) -> None:
    fmt, rule = _params(case)
    if fmt not in BLOCK:
        raise ValueError(f"format {fmt!r}; valid: {', '.join(BLOCK)}")
    if rule not in RULES[fmt]:
        raise ValueError(f"{fmt} has scale_rule in {', '.join(RULES[fmt])}, not {rule!r}")
    if case.dist == "nonfinite":
        raise ValueError("FP4 quantization of NaN/inf is undefined in every reference (NaN "
                         "scales): use a finite distribution")


def fp4_quantize(inputs: dict, case) -> dict:
    fmt, rule = _params(case)
    codes, scales, ts = quantize(inputs["x"], fmt, rule, case.dtype)
    return {"codes": pack(codes).astype(np.float64), "scales": scales.astype(np.float64),
            "tensor_scale": np.array([ts], dtype=np.float64)}


def fp4_dequantize(inputs: dict, case) -> dict:
    fmt = case.params["format"]
    return {"x_hat": dequantize(inputs["codes"], inputs["scales"], inputs["tensor_scale"], fmt)}


def _dequant_tolerance(inputs: dict, exact: dict, case) -> dict:
    """Half an f32 ULP (the product with gs_dec in f32) plus half a T ULP (the store)."""
    x = exact["x_hat"]
    return {"x_hat": 0.5 * spacing(x, "f32") + 0.5 * spacing(x, case.dtype)}


TIES = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
EDGES = np.array([6 * 255 / 256, 6.0, 6 * 129 / 128, 4 * 255 / 256, 4.0, 4 * 129 / 128])


def plant(inputs: dict, case) -> dict:
    """The FP4 planted distributions on x (module docstring of cases/fp4.py):

    * `e2m1_ties`: blocks of ±t/2 for every tie point t and amax 3; nvfp4 also x[0, 0] = 5.25, so
      gs_enc = 2688/5.25 = 512, sf = 256 and the scaled values are exactly t (mxfp4: 2^e = 1/2).
    * `scale_edges`: each block's amax at (1 - 2^-8, 1, 1 + 2^-7) x 6 * 2^k and x 4 * 2^k,
      k = -2..3: where floor(log2 amax) and ceil(log2(amax/6)) change.
    * `one_outlier`: x[0, 0] x 1e4 (its block's and the tensor's amax), the last block all zero.
    """
    if case.dist not in ("e2m1_ties", "scale_edges", "one_outlier"):
        return inputs
    x = np.asarray(inputs["x"]).astype(np.float64).copy()
    block = BLOCK[case.params["format"]]
    xb = _blocks(x, block)
    n = xb.shape[0] * xb.shape[1]
    if case.dist == "e2m1_ties":
        vals = np.concatenate([TIES, -TIES]) / 2
        xb[...] = np.resize(vals, xb.shape)
        xb[..., -1] = 3.0
        if case.params["format"] == "nvfp4":
            x[0, 0] = 5.25
    elif case.dist == "scale_edges":
        xb *= 0.1
        amax = np.resize(EDGES, n) * np.exp2(np.arange(n) % 6 - 2)
        xb[..., 0] = amax.reshape(xb.shape[:2]) * np.where(np.arange(n) % 2, 1, -1).reshape(
            xb.shape[:2])
    else:
        x[0, 0] *= 1e4
        xb[-1, -1] = 0.0
    return {**inputs, "x": round_to(x, case.dtype)}


def _from_x(case, raw: dict) -> dict:
    """fp4_dequantize's inputs: the drawn x (planted as fp4_quantize's) quantized by the case's
    rule, as a checkpoint holds it. A case of partial blocks or of a format without that rule (a
    contract's violating case, never launched) gets zeros of the declared shapes."""
    if case.dims["cols"] % BLOCK[case.params["format"]] or case.spec.domain_error(case):
        d, p = case.dims, case.params
        return {"codes": np.zeros(CODES(d), np.uint8), "scales": np.zeros(_nblocks(d, p), np.uint8),
                "tensor_scale": np.ones(1, F32)}
    out = fp4_quantize(plant({"x": raw["x"]}, case), case)
    return {"codes": out["codes"].astype(np.uint8), "scales": out["scales"].astype(np.uint8),
            "tensor_scale": out["tensor_scale"].astype(F32)}


X = lambda d: (d["rows"], d["cols"])  # noqa: E731
CODES = lambda d: (d["rows"], d["cols"] // 2)  # noqa: E731


def _nblocks(d, p) -> tuple[int, int]:
    return (d["rows"], d["cols"] // BLOCK[p["format"]])


PARAMS = {"format": "nvfp4", "scale_rule": "exact", "ftz": 0}
PARAM_VALUES = {"format": tuple(BLOCK), "scale_rule": ("exact", "mlx", "ocp", "ceil")}
OUT = (TensorSpec("codes", CODES, role="u8", comparator=Exact()),
       TensorSpec("scales", _nblocks, role="u8", comparator=Exact()),
       TensorSpec("tensor_scale", lambda d: (1,), role="f32", comparator=Exact()))

register(OpSpec(
    name="fp4_quantize", family="fp4", dims=("rows", "cols"),
    inputs=(TensorSpec("x", X),), outputs=OUT, oracle=fp4_quantize,
    tolerance=lambda inputs, exact, case: {"codes": 0.0, "scales": 0.0, "tensor_scale": 0.0},
    bytes=lambda case: case.spec.io_bytes(case), flops=lambda case: 0,
    params=PARAMS, param_values=PARAM_VALUES, domain=fp4_domain, version=1, plant=plant,
    doc=__doc__, chain_input="x"))

register(OpSpec(
    name="fp4_dequantize", family="fp4", dims=("rows", "cols"),
    inputs=tuple(TensorSpec(t.name, t.shape, role=t.role, adversarial=False) for t in OUT),
    outputs=(TensorSpec("x_hat", X),), oracle=fp4_dequantize, tolerance=_dequant_tolerance,
    bytes=lambda case: case.spec.io_bytes(case), flops=lambda case: 0,
    params=PARAMS, param_values=PARAM_VALUES, domain=fp4_domain, version=1,
    make_inputs=_from_x, raw_inputs=(TensorSpec("x", X),), doc=fp4_dequantize.__doc__,
    chain_input="codes"))
