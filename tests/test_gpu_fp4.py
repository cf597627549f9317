"""The FP4 CUDA impls on the GPU (issue 31, `gpu_impls/cuda/fp4.py`), beyond the gate
(tests/test_gpu.py runs all three over their ops' gate cases):

* `cuda:kp_fp4_dequantize` on every code byte (both nibbles of every value: 0x8 is -0, 0x7 /
  0xF the largest magnitudes) under every UE4M3 scale byte 0..0x7E (0 and the subnormals 1..7
  included) and every E8M0 byte that keeps 6 x scale finite in f32 (0: 2^-127, whose products
  are f32 subnormals), at tensor scales 1, a 24-bit one and an f32 subnormal (gs_dec of a
  tensor with amax < 7.9e-36: the non-FTZ path);
* `cuda:kp_fp4_gemv` at N = K = 2048 (bf16 x, both formats), at every M (1..4, both instances),
  a single chunk, 4 warps with a partial last step, rows past `out`; hand-built weights of
  extreme codes with subnormal UE4M3 scales, with E8M0 scale bytes 0..2 on a whole row (the
  block scale an f32 subnormal) and with a subnormal tensor scale, where an FTZ kernel returns 0;
* `cuda:kp_fp4_quantize`: every rule and dtype at a shape where the amax kernel runs several
  blocks and the tensor's amax sits in the last element; quantize then dequantize equals the
  oracle's round trip;
* the mutants (tests/mutants.py FP4_CUDA_MUTANTS) red where the gate shows them (E2M1 ties,
  normal data) while the real kernel passes the same case.

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run.
"""

from __future__ import annotations

import numpy as np
import pytest

from cases.generate import Work
from cases.model import Case, make_inputs
from oracle.dtypes import storage_dtype
from runners.correctness import check_op, run_impl
from tests.gpu_helpers import assert_passes, cuda_backend as _cuda, impl as _impl

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]
RULES = {"nvfp4": ("exact",), "mxfp4": ("ocp", "ceil")}
FIRST_RULE = {"nvfp4": "exact", "mxfp4": "ocp"}
TINY_TS = np.float32(2.0 ** -130)  # an f32 subnormal tensor scale


def _case(op: str, dims: dict, dtype: str, fmt: str, dist="normal", rule=None) -> Case:
    return Case.make(op, dims, dtype, dist, params={"format": fmt,
                                                    "scale_rule": rule or FIRST_RULE[fmt]},
                     label="gpu")


def _passes_on(impl_id: str, case: Case, inputs: dict):
    """`impl_id` passes `case` on the hand-built `inputs` (the oracle computed on them)."""
    row = check_op(Work(_impl(impl_id), case, "valid"), _cuda(), inputs=inputs)
    assert row["status"] == "pass", f"{row['status']} {impl_id} on {case.short()}: " \
                                    f"{row['message']}"


# --- kp_fp4_dequantize ----------------------------------------------------------------------------

def _every_code_and_scale(fmt: str) -> dict:
    """Codes: each row every byte 0..255; scales: UE4M3 bytes 0..0x7E (NVFP4) or E8M0 bytes
    0..252 (MXFP4: 6 x 2^125 is f32's largest finite product), cycling over the blocks."""
    block = {"nvfp4": 16, "mxfp4": 32}[fmt]
    rows, cols = 16, 512
    codes = np.tile(np.arange(256, dtype=np.uint8), (rows, 1))
    count = 0x7F if fmt == "nvfp4" else 253
    scales = (np.arange(rows * cols // block) % count).astype(np.uint8).reshape(rows, -1)
    return {"codes": codes, "scales": scales}


@pytest.mark.parametrize("ts", [np.float32(1.0), np.float32(0.3712953), TINY_TS],
                         ids=["ts1", "ts24bit", "ts_subnormal"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_dequantize_every_code_and_scale_byte(dtype, fmt, ts):
    """Exact up to the final rounding (f32: the correctly rounded f32, subnormals included)."""
    inputs = {**_every_code_and_scale(fmt), "tensor_scale": np.array([ts], dtype=np.float32)}
    _passes_on("cuda:kp_fp4_dequantize",
               _case("fp4_dequantize", {"rows": 16, "cols": 512}, dtype, fmt), inputs)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_dequantize_f16_overflow_and_subnormals(fmt):
    """f16 x_hat: E8M0 bytes 100..140 (f16's subnormals, its overflow to inf) and every UE4M3
    byte at tensor scales that reach both ends of f16's range."""
    inputs = _every_code_and_scale(fmt)
    if fmt == "mxfp4":
        inputs["scales"] = (100 + inputs["scales"] % 41).astype(np.uint8)
    for ts in (np.float32(2.0 ** -20), np.float32(40.0)):
        _passes_on("cuda:kp_fp4_dequantize",
                   _case("fp4_dequantize", {"rows": 16, "cols": 512}, "f16", fmt),
                   {**inputs, "tensor_scale": np.array([ts], dtype=np.float32)})


@pytest.mark.nightly  # the models' shapes: the nightly tier (the gate and the every-code test stay)
@pytest.mark.parametrize("dist", ["normal", "tiny", "one_outlier", "e2m1_ties", "scale_edges"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_dequantize_model_shapes(fmt, dist):
    """Weights quantized by each rule (the op's inputs) at rows that do not fill a block of
    threads, and at the bench shape."""
    for rule in RULES[fmt]:
        for dims in ({"rows": 7, "cols": 96}, {"rows": 1856, "cols": 2688}):
            assert_passes("cuda:kp_fp4_dequantize",
                          _case("fp4_dequantize", dims, "bf16", fmt, dist, rule))


# --- kp_fp4_gemv ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_gemv_2048_square(fmt, dtype):
    assert_passes("cuda:kp_fp4_gemv",
                  _case("fp4_gemv", {"m": 1, "out": 2048, "in": 2048}, dtype, fmt))


# (m, out, in): every M (instances MAXM 1 and 4); one chunk; out not a multiple of 4 (rows
# past out); 2 warps; 4 warps with a partial last step (1025 chunks); the bench shapes
GEMV_SHAPES = ((1, 5, 32), (2, 9, 64), (3, 17, 160), (4, 6, 256), (1, 33, 11520),
               (2, 8, 32800),
               *(pytest.param(s, marks=pytest.mark.nightly, id="x".join(map(str, s)))
                 for s in ((1, 1856, 2688), (4, 2880, 2880))))  # bench shapes: nightly


@pytest.mark.parametrize("shape", GEMV_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gemv_shapes(shape, fmt):
    m, out, k = shape
    for dtype in ("f32", "bf16"):
        assert_passes("cuda:kp_fp4_gemv",
                      _case("fp4_gemv", {"m": m, "out": out, "in": k}, dtype, fmt))


@pytest.mark.parametrize("dist", ["outlier_rows", "zero_rows", "e2m1_ties", "scale_edges",
                                  "one_outlier"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gemv_distributions(fmt, dist):
    assert_passes("cuda:kp_fp4_gemv",
                  _case("fp4_gemv", {"m": 3, "out": 37, "in": 512}, "bf16", fmt, dist))


def _gemv_inputs(case: Case, codes, scales, ts) -> dict:
    x = make_inputs(case)["x"]
    return {"codes": np.ascontiguousarray(codes, dtype=np.uint8),
            "scales": np.ascontiguousarray(scales, dtype=np.uint8),
            "tensor_scale": np.array([ts], dtype=np.float32), "x": x}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gemv_extreme_codes_and_subnormal_scales(dtype):
    """Every code byte (max magnitudes, -0) against UE4M3 scale bytes 0..0x7E (1..7: the
    subnormals, normal in f32) and E8M0 bytes 0..252."""
    out, k = 16, 512
    for fmt in ("nvfp4", "mxfp4"):
        case = _case("fp4_gemv", {"m": 2, "out": out, "in": k}, dtype, fmt)
        w = _every_code_and_scale(fmt)
        if fmt == "mxfp4":  # a finite y in f32: bytes up to 2^(e-127) K 6 |x| < 3.4e38
            w["scales"] = (w["scales"] % 200).astype(np.uint8)
        _passes_on("cuda:kp_fp4_gemv", case, _gemv_inputs(case, w["codes"], w["scales"], 1.0))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gemv_subnormal_scales_reach_y(fmt):
    """Rows whose every block scale is E8M0 2^-127..2^-125 (f32 subnormals at byte 0), or an
    NVFP4 tensor scale 2^-130: y is a normal f32 of order 2^-118, which a kernel reading the
    scale with FTZ returns as 0."""
    out, k = 8, 256
    case = _case("fp4_gemv", {"m": 1, "out": out, "in": k}, "f32", fmt)
    rng = np.random.default_rng(31)
    codes = rng.integers(0, 256, (out, k // 2), dtype=np.uint8)
    block = {"nvfp4": 16, "mxfp4": 32}[fmt]
    if fmt == "mxfp4":
        scales, ts = rng.integers(0, 3, (out, k // block)).astype(np.uint8), 1.0
    else:
        scales, ts = rng.integers(0x30, 0x7F, (out, k // block)).astype(np.uint8), TINY_TS
    inputs = _gemv_inputs(case, codes, scales, ts)
    _passes_on("cuda:kp_fp4_gemv", case, inputs)
    y = run_impl(_impl("cuda:kp_fp4_gemv"), _cuda(), case, inputs)["y"]
    assert np.all(np.abs(y.astype(np.float64)) > 0), y


# --- kp_fp4_quantize ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quantize_amax_in_the_last_element_over_many_blocks(fmt, dtype):
    """rows 64 x cols 2048: the amax kernel's 64 (16-bit x) or 128 (f32) blocks of 256 threads
    cover the tensor; its amax planted in the last element (the last block's last vector)."""
    for rule in RULES[fmt]:
        case = _case("fp4_quantize", {"rows": 64, "cols": 2048}, dtype, fmt, rule=rule)
        x = make_inputs(case)["x"].astype(np.float64)
        x[-1, -1] = -50.0 * np.max(np.abs(x))
        _passes_on("cuda:kp_fp4_quantize", case, {"x": x.astype(storage_dtype(dtype))})


@pytest.mark.parametrize("dist", ["normal", "tiny", "one_outlier", "e2m1_ties", "scale_edges",
                                  "zero_rows"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quantize_then_dequantize_is_the_oracle_round_trip(fmt, dist):
    """The quantizer's outputs, dequantized by kp_fp4_dequantize, within dequantize's bound of
    the oracle's round trip (its codes and scales are bit-exact, so this is dequantize on
    the quantizer's own bytes)."""
    be = _cuda()
    for rule in RULES[fmt]:
        for dtype in ("f32", "bf16"):
            dims = {"rows": 5, "cols": 256}
            case = _case("fp4_quantize", dims, dtype, fmt, dist, rule)
            row = check_op(Work(_impl("cuda:kp_fp4_quantize"), case, "valid"), be)
            assert row["status"] == "pass", row["message"]
            q = run_impl(_impl("cuda:kp_fp4_quantize"), be, case, make_inputs(case))
            _passes_on("cuda:kp_fp4_dequantize",
                       _case("fp4_dequantize", dims, dtype, fmt, dist, rule), q)


# --- the mutants ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mutant, fmt, dist", [
    ("mutant_kp_fp4_ties_away", "nvfp4", "e2m1_ties"),
    ("mutant_kp_fp4_ties_away", "mxfp4", "e2m1_ties"),
    ("mutant_kp_fp4_unscaled_block_max", "nvfp4", "normal")])
def test_quantize_mutants_go_red_where_the_kernel_passes(mutant, fmt, dist):
    for dtype in ("f32", "bf16"):
        case = _case("fp4_quantize", {"rows": 3, "cols": 64}, dtype, fmt, dist)
        row = check_op(Work(_impl(f"cuda:{mutant}"), case, "valid"), _cuda())
        assert row["status"] == "fail", f"{mutant} passed {case.short()}"
        assert_passes("cuda:kp_fp4_quantize", case)
