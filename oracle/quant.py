"""Affine quantization as MLX lays it out (MLX `mlx/ops.cpp`: `affine_quantize`,
`pack_and_quantize`; `mlx/backend/cpu/quantized.cpp`): quantizers, packing, dequantization. The
ground every quantized-GEMV oracle stands on.

Layout. W [..., K] is quantized in groups of G consecutive elements along K (G in {32, 64, 128});
each group has a scale s and a bias b stored in T (the activation dtype), and codes
q in [0, 2^bits - 1]:

    w_hat = s * q + b                                       (dequantize; kernels accumulate in f32)

Codes are packed LSB-first into uint32 words: each row of K codes is one little-endian bit
stream, code k at bit offset k * bits. For bits 2, 4, 8 that is "32/bits codes per word, code 0
in the lowest bits" (int4: nibble 0 = bits 0..3); for 3, 5, 6 a code may straddle two words. A
row takes K * bits / 32 words, so K * bits must be a multiple of 32.

Quantizers (the seeds use two; a kernel that only *consumes* codes does not care which):

* `quantize_mlx`: upstream MLX on CPU (`mx.quantize`, mode "affine"), in f32. The larger-magnitude
  extreme of the group is represented exactly:
      s = max((max - min) / n_bins, 1e-7); edge = min if |min| > |max| else max (s negated)
      q0 = rint(edge / s); if q0 != 0: s = edge / q0, b = edge; else b = 0
      q = clip(rint((w - b) / s), 0, n_bins); s and b rounded to T after q is computed.
* `quantize_minmax`: metaltile's `mt_affine_quantize_int*` (`src/mlx/quantized.rs`):
  s = (max - min) / n_bins (1 when below 1e-7), b = min,
  q = trunc(clip((w - b) * (1/s) + 0.5, 0, n_bins)) (round half up).
"""

from __future__ import annotations

import numpy as np

from oracle.dtypes import round_to

BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)


def n_bins(bits: int) -> int:
    return (1 << bits) - 1


def _check(k: int, bits: int, group_size: int | None = None) -> None:
    if bits not in BITS:
        raise ValueError(f"bits={bits}: MLX affine quantization has bits in {BITS}")
    if (k * bits) % 32:
        raise ValueError(f"K={k} codes of {bits} bits do not fill whole uint32 words "
                         f"(K * bits % 32 == {(k * bits) % 32}); K must be a multiple of "
                         f"{32 // np.gcd(32, bits)}")
    if group_size is not None and k % group_size:
        raise ValueError(f"K={k} is not a multiple of group_size={group_size}")


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """codes [..., K] (integers in [0, 2^bits)) -> uint32 [..., K * bits / 32], LSB-first."""
    codes = np.asarray(codes)
    k = codes.shape[-1]
    _check(k, bits)
    if codes.size and (codes.min() < 0 or codes.max() > n_bins(bits)):
        raise ValueError(f"codes outside [0, {n_bins(bits)}] for bits={bits}")
    if 32 % bits == 0:  # 32/bits whole codes per word, code 0 lowest (a model's worth in seconds)
        shifts = np.arange(0, 32, bits, dtype=np.uint32)
        per_word = codes.reshape(*codes.shape[:-1], k * bits // 32, 32 // bits)
        return np.bitwise_or.reduce(per_word.astype(np.uint32) << shifts, axis=-1)
    # bit j of code i sits at stream position i * bits + j
    stream = ((codes[..., :, None].astype(np.uint32) >> np.arange(bits, dtype=np.uint32)) & 1)
    stream = stream.reshape(*codes.shape[:-1], k * bits // 32, 32).astype(np.uint64)
    words = (stream << np.arange(32, dtype=np.uint64)).sum(axis=-1)
    return words.astype(np.uint32)


def unpack(words: np.ndarray, bits: int, k: int) -> np.ndarray:
    """uint32 [..., K * bits / 32] -> codes [..., K] as uint8, the inverse of `pack`."""
    _check(k, bits)
    words = np.asarray(words, dtype=np.uint32)
    if words.shape[-1] != k * bits // 32:
        raise ValueError(f"{words.shape[-1]} words per row, expected K * bits / 32 = "
                         f"{k * bits // 32}")
    if 32 % bits == 0:  # 32/bits whole codes per word, code 0 lowest (8x less memory)
        shifts = np.arange(0, 32, bits, dtype=np.uint32)
        codes = (words[..., :, None] >> shifts) & np.uint32(n_bins(bits))
        return codes.reshape(*words.shape[:-1], k).astype(np.uint8)
    stream = (words[..., :, None] >> np.arange(32, dtype=np.uint32)) & 1
    stream = stream.reshape(*words.shape[:-1], k, bits)
    return (stream << np.arange(bits, dtype=np.uint32)).sum(axis=-1).astype(np.uint8)


def _groups(w: np.ndarray, group_size: int) -> np.ndarray:
    return np.asarray(w).reshape(*np.shape(w)[:-1], np.shape(w)[-1] // group_size, group_size)


def quantize_mlx(w: np.ndarray, bits: int, group_size: int, dtype: str):
    """(packed uint32, scales, biases) as `mx.quantize(w, group_size, bits)` on MLX's CPU;
    `w` holds values of `dtype`; scales and biases come back in `dtype`."""
    _check(np.shape(w)[-1], bits, group_size)
    g = _groups(np.asarray(w).astype(np.float32), group_size)
    nb = np.float32(n_bins(bits))
    wmax, wmin = g.max(axis=-1), g.min(axis=-1)
    s = np.maximum((wmax - wmin) / nb, np.float32(1e-7)).astype(np.float32)
    side = np.abs(wmin) > np.abs(wmax)
    s = np.where(side, s, -s).astype(np.float32)
    edge = np.where(side, wmin, wmax).astype(np.float32)
    q0 = np.rint(edge / s)
    nonzero = q0 != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(nonzero, edge / q0, s).astype(np.float32)
    b = np.where(nonzero, edge, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((g - b[..., None]) / s[..., None]), 0, nb).astype(np.uint8)
    codes = q.reshape(np.shape(w))
    return pack(codes, bits), round_to(s, dtype), round_to(b, dtype)


def quantize_minmax(w: np.ndarray, bits: int, group_size: int, dtype: str):
    """(packed uint32, scales, biases) as metaltile's `mt_affine_quantize_int*`."""
    _check(np.shape(w)[-1], bits, group_size)
    g = _groups(np.asarray(w).astype(np.float32), group_size)
    nb = np.float32(n_bins(bits))
    wmax, wmin = g.max(axis=-1), g.min(axis=-1)
    s = ((wmax - wmin) / nb).astype(np.float32)
    s = np.where(s < np.float32(1e-7), np.float32(1.0), s).astype(np.float32)
    inv = (np.float32(1.0) / s).astype(np.float32)
    v = (g - wmin[..., None]) * inv[..., None] + np.float32(0.5)
    q = np.trunc(np.clip(v, 0, nb)).astype(np.uint8)
    codes = q.reshape(np.shape(w))
    return pack(codes, bits), round_to(s, dtype), round_to(wmin, dtype)


def dequantize(words: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int,
               group_size: int) -> np.ndarray:
    """w_hat = s * q + b in float64 (exact: every term is a T or a small integer)."""
    k = np.shape(scales)[-1] * group_size
    q = _groups(unpack(words, bits, k), group_size)  # [..., groups, G], the scale's axis added
    s = np.asarray(scales).astype(np.float64)[..., None]
    b = np.asarray(biases).astype(np.float64)[..., None]
    return (q * s + b).reshape(*q.shape[:-2], k)
