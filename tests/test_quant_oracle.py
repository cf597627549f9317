"""The affine-quantization oracle (`oracle/quant.py`): bit layout, round trips, and both
quantizers, MLX's checked bit for bit against `mx.quantize` on MLX CPU."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest

from oracle.dtypes import FLOAT_DTYPES, round_to, spacing, storage_dtype
from oracle.quant import (BITS, GROUP_SIZES, dequantize, n_bins, pack, quantize_minmax,
                          quantize_mlx, unpack)


def _weights(rng, shape, dtype):
    """Normal weights with the awkward groups planted: all-negative, all-zero, constant, and
    an outlier column."""
    w = rng.standard_normal(shape) * 0.05
    w[:, 200] *= 40.0          # outlier column
    w[0, :128] = -np.abs(w[0, :128])  # whole groups at every group size
    w[1, :128] = 0.0
    w[2, :128] = 0.375
    return round_to(w, dtype).astype(storage_dtype(dtype))


@pytest.mark.parametrize("bits", BITS)
def test_pack_unpack_round_trip(bits):
    rng = np.random.default_rng(bits)
    k = 96 if bits in (3, 5, 6) else 64
    codes = rng.integers(0, n_bins(bits) + 1, size=(5, k))
    words = pack(codes, bits)
    assert words.dtype == np.uint32 and words.shape == (5, k * bits // 32)
    assert np.array_equal(unpack(words, bits, k), codes)


def test_bit_layout_is_lsb_first():
    codes = np.arange(8).reshape(1, 8)               # int4: nibble i = code i
    assert pack(codes, 4)[0, 0] == 0x76543210
    assert pack(np.array([[1, 2, 3, 4]]), 8)[0, 0] == 0x04030201
    # 3 bits: code 10 sits at bits 30..32, straddling words 0 and 1
    codes = np.zeros((1, 32), dtype=int)
    codes[0, 10] = 0b101
    words = pack(codes, 3)
    assert words[0, 0] == (1 << 30) and words[0, 1] == 1


def test_bad_shapes_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="multiple of 32"):
        pack(np.zeros((1, 40), dtype=int), 3)
    with pytest.raises(ValueError, match="bits in"):
        pack(np.zeros((1, 32), dtype=int), 7)
    with pytest.raises(ValueError, match="group_size"):
        quantize_mlx(np.zeros((1, 96), np.float32), 4, 64, "f32")


@pytest.mark.parametrize("dtype, bits, group_size", list(product(FLOAT_DTYPES, BITS,
                                                                   GROUP_SIZES)))
def test_quantize_mlx_matches_mx_quantize_bit_for_bit(dtype, bits, group_size):
    mx = pytest.importorskip("mlx.core")
    w = _weights(np.random.default_rng(bits * 1000 + group_size), (8, 384), dtype)
    wm = (mx.array(w.view(np.uint16)).view(mx.bfloat16) if dtype == "bf16" else mx.array(w))
    wq, s, b = mx.quantize(wm, group_size=group_size, bits=bits)

    def host(a):
        return (np.array(a.view(mx.uint16)).view(storage_dtype("bf16")) if dtype == "bf16"
                else np.array(a))
    words, scales, biases = quantize_mlx(w, bits, group_size, dtype)
    assert np.array_equal(np.array(wq), words), "packed codes differ"
    assert np.array_equal(host(s).astype(np.float64), scales.astype(np.float64))
    assert np.array_equal(host(b).astype(np.float64), biases.astype(np.float64))
    # mx.dequantize rounds s*q + b in T (or f32): within one T ulp of the operands' magnitude
    # of the exact value (near-cancelling s*q + b makes a ULP count near 0 meaningless)
    deq = host(mx.dequantize(wq, s, b, group_size=group_size, bits=bits)).astype(np.float64)
    q = unpack(words, bits, w.shape[-1]).astype(np.float64)
    sq = q * np.repeat(scales.astype(np.float64), group_size, axis=-1)
    bb = np.repeat(biases.astype(np.float64), group_size, axis=-1)
    ulp = spacing(np.abs(sq) + np.abs(bb), dtype)
    assert np.all(np.abs(deq - dequantize(words, scales, biases, bits, group_size)) <= ulp)


@pytest.mark.parametrize("quantize", [quantize_mlx, quantize_minmax])
@pytest.mark.parametrize("dtype, bits", list(product(FLOAT_DTYPES, BITS)))
def test_round_trip_error_is_within_one_step(quantize, dtype, bits):
    """|w - dequant(quant(w))| <= |s| + n_bins * ulp_T(s)/2 + ulp_T(b)/2 per group: half a step
    from rounding the code (a whole step bounds it with MLX's own test), plus storing s and b in
    T (the scale's error is multiplied by the code, up to n_bins; it dominates for bf16 at 8
    bits). Zero groups come back exactly 0."""
    gs = 64
    w = _weights(np.random.default_rng(bits), (6, 256), dtype)
    words, scales, biases = quantize(w, bits, gs, dtype)
    codes = unpack(words, bits, 256)
    assert codes.max() <= n_bins(bits)
    w_hat = dequantize(words, scales, biases, bits, gs)
    s64, b64 = scales.astype(np.float64), biases.astype(np.float64)
    bound = (np.abs(s64) + n_bins(bits) * spacing(s64, dtype) / 2 + spacing(b64, dtype) / 2)
    bound = np.repeat(bound, gs, axis=-1)
    err = np.abs(w.astype(np.float64) - w_hat)
    assert np.all(err <= bound + 1e-6), float((err - bound).max())
    assert np.all(w_hat[1, :128] == 0.0)


def test_minmax_bias_is_the_group_minimum_and_rounds_half_up():
    w = np.array([[0.0, 1.0, 2.0, 3.0, 1.5, 0.5] + [0.0] * 26], dtype=np.float32)
    words, scales, biases = quantize_minmax(w, 2, 32, "f32")
    assert biases[0, 0] == 0.0 and scales[0, 0] == pytest.approx(1.0)
    assert list(unpack(words, 2, 32)[0, :6]) == [0, 1, 2, 3, 2, 1]  # 1.5 -> 2, 0.5 -> 1
