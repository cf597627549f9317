"""FP4 (NVFP4, MXFP4) oracle: the E2M1 table and its tie rules, packing, each format's scale rule,
MLX's `mx.quantize` FP4 modes bit for bit against the "mlx" variants, and the two mutants red on
the gate (`oracle/fp4.py`, `cases/fp4.py`, `tests/mutants.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cases.model import Case, make_inputs
from oracle import fp4
from oracle.dtypes import pack_e2m1, round_to
from verbs.cli import main

MUTANTS = str(Path(__file__).with_name("mutants.py"))
TIES = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def test_e2m1_ties_rne_and_nearest_low():
    """E2M1 RNE (vLLM's `cast_to_fp4`, TE's `cast_to_fp4x2`, PTX `cvt.rn.satfinite.e2m1x2.f32`)
    sends 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4; MLX's argmin sends every tie
    to the lower magnitude; half-away to the upper."""
    values = lambda c: fp4.e2m1_values(c)  # noqa: E731
    assert list(values(fp4.e2m1_codes(TIES, "rne"))) == [0, 1, 1, 2, 2, 4, 4]
    assert list(values(fp4.e2m1_codes(TIES, "nearest_low"))) == [0, .5, 1, 1.5, 2, 3, 4]
    assert list(values(fp4.e2m1_codes(TIES, "half_away"))) == [.5, 1, 1.5, 2, 3, 4, 6]
    assert list(values(fp4.e2m1_codes([7.0, -100.0], "rne"))) == [6, -6]  # saturates


def test_e2m1_rne_agrees_with_ml_dtypes():
    """An independent RNE: ml_dtypes' float4_e2m1fn cast (saturating) on random and tie values."""
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.standard_normal(4000) * 3, TIES, -TIES, TIES + 1e-9, TIES - 1e-9])
    ours = fp4.e2m1_values(fp4.e2m1_codes(v, "rne"))
    ref = round_to(np.clip(v, -6, 6), "e2m1").astype(np.float64)
    np.testing.assert_array_equal(ours, ref)


def test_sign_of_a_value_rounding_to_zero():
    """RNE keeps the sign (-0.1 -> 0x8, as the hardware cvt); MLX's argmin gives +0."""
    assert list(fp4.e2m1_codes([-0.1, -0.0, -0.75], "rne")) == [8, 8, 10]
    assert list(fp4.e2m1_codes([-0.1, -0.0, -0.75], "nearest_low")) == [0, 0, 9]


def test_packing_element_2j_is_the_low_nibble():
    codes = np.array([[1, 2, 3, 15]], dtype=np.uint8)
    assert list(fp4.pack(codes)[0]) == [0x21, 0xF3]
    np.testing.assert_array_equal(fp4.unpack(fp4.pack(codes)), codes)
    v = round_to(fp4.e2m1_values(codes), "e2m1")  # the dtypes module's packing agrees
    np.testing.assert_array_equal(pack_e2m1(v), fp4.pack(codes))


def test_nvfp4_exact_scales_and_round_trip():
    """sf = e4m3(gs_enc vmax / 6) with gs_enc = 2688 / amax: the tensor's largest block gets
    sf = 448, and x_hat is within half a code step of x (E2M1 steps <= 2 x 0.25 of the scale)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    codes, scales, gs_dec = fp4.nvfp4_exact(x)
    sf = fp4.scale_values(scales, "nvfp4")
    amax = np.abs(x).max()
    assert np.isclose(gs_dec, amax / 2688, rtol=1e-6)
    assert sf.max() == 448.0
    x_hat = fp4.dequantize(fp4.pack(codes), scales, gs_dec, "nvfp4")
    step = np.repeat(sf * gs_dec, 16, axis=-1)  # one unit of the E2M1 grid in x's units
    assert np.all(np.abs(x_hat - x) <= step * 1.0 + 1e-6 * amax)  # largest gap (4 -> 6) / 2


def test_mxfp4_rules_part_where_the_references_do():
    """amax 7: OCP floor(log2 7) - 2 = 0 (7 saturates to 6), ceil(log2(7/6)) = 1 (7/2 -> 4);
    amax 6: both 0; amax 7.2 = 6 x 1.2: MLX's scale is ceil's (measured), not round's (0)."""
    for amax, ocp, ceil in ((7.0, 0, 1), (6.0, 0, 0), (4.0, 0, 0), (7.2, 0, 1), (0.0, -127, -127)):
        assert fp4.mx_exponent(np.array([amax]), "ocp")[0] == ocp
        assert fp4.mx_exponent(np.array([amax]), "ceil")[0] == ceil
    assert fp4.mx_exponent(np.array([0.0]), "mlx")[0] == 0


def test_e2m1_ties_case_plants_exact_ties():
    """The e2m1_ties gate case: every scaled value of the tie blocks is exactly a tie point."""
    case = Case.make("fp4_quantize", {"rows": 1, "cols": 32}, "bf16", "e2m1_ties")
    x = make_inputs(case)["x"].astype(np.float64)
    gs_enc = fp4.tensor_encode(x.astype(np.float32))
    assert gs_enc == 512 and x[0, 0] == 5.25
    scaled = np.abs(x[0, 16:]) * 2  # block 1: sf = 256, enc = gs_enc / sf = 2
    assert set(scaled[:-1]) == set(TIES) and scaled[-1] == 6


@pytest.fixture(scope="module")
def mx():
    return pytest.importorskip("mlx.core")


def _mlx_codes(mx, x, fmt: str, dtype: str):
    t = {"f32": mx.float32, "bf16": mx.bfloat16, "f16": mx.float16}[dtype]
    xa = mx.array(x.astype(np.float32)).astype(t)
    kw = {"global_scale": mx.max(mx.abs(xa)).astype(mx.float32)} if fmt == "nvfp4" else {}
    words, scales = mx.quantize(xa, mode=fmt, **kw)
    words = np.array(words)
    codes = (words[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 15  # element i: bits 4i
    return codes.reshape(x.shape).astype(np.uint8), np.array(scales)


@pytest.mark.parametrize("fmt, dtypes", [("nvfp4", ("f32",)), ("mxfp4", ("f32", "bf16", "f16"))])
def test_mlx_quantize_is_bit_exact_to_the_mlx_rule(mx, fmt, dtypes):
    """MLX 0.32.4: nvfp4 (f32 x) and mxfp4 (every dtype) equal the "mlx" rules bit for bit, on
    normal data over four decades and on exact ties; the RNE rules do not (ties go low)."""
    rng = np.random.default_rng(2)
    ties = np.resize(np.concatenate([TIES, -TIES]) / 2, (2, 64))
    ties[:, 31::32] = 3.0
    for dtype in dtypes:
        for x in (rng.standard_normal((16, 128)) * 10.0 ** rng.integers(-2, 2, (16, 1)), ties):
            x = round_to(x, dtype).astype(np.float64)
            codes, scales = _mlx_codes(mx, x, fmt, dtype)
            ours, our_scales, _ = fp4.quantize(x, fmt, "mlx", dtype)
            np.testing.assert_array_equal(our_scales, scales)
            np.testing.assert_array_equal(ours, codes)
    rne_rule = {"nvfp4": "exact", "mxfp4": "ceil"}[fmt]
    assert (fp4.quantize(ties, fmt, rne_rule, "f32")[0] != _mlx_codes(mx, ties, fmt, "f32")[0]).any()


@pytest.mark.parametrize("mutant, dist", [("mutant_fp4_ties_away", "e2m1_ties"),
                                          ("mutant_fp4_unscaled_block_max", "normal")])
def test_each_fp4_mutant_fails_a_gate_case(tmp_path, mutant, dist, capsys):
    rc = main(["--plugin", MUTANTS, "--store", str(tmp_path), "check", "--impl",
               f"torch:{mutant}", "--preset", "nvfp4-exact", "--dtype", "f32",
               "--show-failures", "20"])
    out = capsys.readouterr().out
    assert rc == 1
    assert f"f32 {dist}" in out and f"--impl torch:{mutant}" in out


def test_fp4_gemv_block_scale_off_by_one_fails_a_gate_case(tmp_path, capsys):
    rc = main(["--plugin", MUTANTS, "--store", str(tmp_path), "check", "--impl",
               "torch:mutant_fp4_gemv_scale_off_by_one", "--preset", "mxfp4-ocp", "--dtype", "f32",
               "--show-failures", "5"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "fp4_gemv[" in out and "--impl torch:mutant_fp4_gemv_scale_off_by_one" in out


def test_fp4_gemv_nvfp4_tensor_scale_product_is_not_exact_in_f32():
    """The module docstring's claim: e2m1 x e4m3 is exact in f32, x the tensor scale is not."""
    from oracle.fp4_gemv import fp4_gemv
    case = Case.make("fp4_gemv", {"m": 1, "out": 8, "in": 64}, "f32", "normal",
                     params={"format": "nvfp4", "scale_rule": "exact"})
    inp = make_inputs(case)
    w = fp4.dequantize(inp["codes"], inp["scales"], np.float32(1), "nvfp4")
    assert np.array_equal(w.astype(np.float32).astype(np.float64), w)
    wt = w * float(inp["tensor_scale"][0])
    assert not np.array_equal(wt.astype(np.float32).astype(np.float64), wt)
    y = fp4_gemv(inp, case)["y"]
    np.testing.assert_allclose(y, np.asarray(inp["x"], np.float64) @ wt.T, rtol=1e-12)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_torch_dtype_dequantize_every_code_and_scale_byte(fmt):
    """torch:fp4_dequantize_dtypes reads the scales through torch.float8_e4m3fn / float8_e8m0fnu:
    every code byte under every UE4M3 byte 0..0x7E (0 and the subnormals 1..7) or E8M0 byte
    0..252 (0: 2^-127, an f32 subnormal; 6 x 2^125 f32's last finite product), f32 x_hat within
    the oracle's bound."""
    import gpu_impls
    from cases.generate import Work
    from runners.correctness import check_op

    rows, cols = 16, 512
    count = 0x7F if fmt == "nvfp4" else 253
    inputs = {"codes": np.tile(np.arange(256, dtype=np.uint8), (rows, 1)),
              "scales": (np.arange(rows * cols // fp4.BLOCK[fmt]) % count).astype(np.uint8)
              .reshape(rows, -1), "tensor_scale": np.array([0.37], dtype=np.float32)}
    case = Case.make("fp4_dequantize", {"rows": rows, "cols": cols}, "f32",
                     params={"format": fmt, "scale_rule": "exact" if fmt == "nvfp4" else "ocp"})
    row = check_op(Work(gpu_impls.impls()["torch:fp4_dequantize_dtypes"], case, "valid"),
                   gpu_impls.backend("torch"), inputs=inputs)
    assert row["status"] == "pass", row["message"]


def test_e8m0_scale_bytes_decode_as_ocp_mx_says():
    """E8M0 (OCP MX v1.0 §5.4.1): byte e is 2^(e - 127) for e = 0..254 and NaN for e = 255
    (its one NaN encoding, no inf). The FP4 path's decoding, `oracle/dtypes.py`'s ue8m0 and
    ml_dtypes' float8_e8m0fnu agree on all 256 bytes (before, the FP4 path gave 255 2^128)."""
    import ml_dtypes

    from oracle.dtypes import FLOAT_FORMATS

    every = np.arange(256, dtype=np.uint8)
    ours = fp4.scale_values(every, "mxfp4")
    expected = np.where(every == 255, np.nan, 2.0 ** (every.astype(np.float64) - 127))
    np.testing.assert_array_equal(ours, expected)
    assert np.isnan(ours[255]) and ours[0] == 2.0 ** -127 and ours[254] == 2.0 ** 127
    assert FLOAT_FORMATS["ue8m0"].dtype == ml_dtypes.float8_e8m0fnu and \
        FLOAT_FORMATS["ue8m0"].nan == "0xff"
    np.testing.assert_array_equal(
        ours, every.view(ml_dtypes.float8_e8m0fnu).astype(np.float64))
