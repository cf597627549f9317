"""f32 NumPy transcriptions of kparity's own CUDA kernels' arithmetic, loop for loop: what the
kernel computes on a CPU, to hold its declared order (`Impl.numerics`) to its source and to
measure the error a real run of that order makes (scripts/bound_tightness.py). An FMA is the
float64 value of a*b + c (exact product of two f32 values) rounded to f32: a double rounding
that can differ from the hardware's single one in a tie, too rarely to move a median."""

from __future__ import annotations

import numpy as np

F32 = np.float32


def fma(a, b, c) -> np.ndarray:
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64)
            + np.asarray(c, np.float64)).astype(F32)


def kp_qgemv(q: np.ndarray, scales: np.ndarray, biases: np.ndarray, x: np.ndarray,
             bits: int, warps: int) -> np.ndarray:
    """kp_qgemv.cu for codes q [out, in] (ints), scales and biases [out, groups] and x [in] as
    f32 values; the f32 output before the store."""
    out, n = q.shape
    codes = 128 // bits
    chunks, group = n // codes, n // scales.shape[1]
    qc = q.astype(F32).reshape(out, chunks, codes)
    xc = x.astype(F32).reshape(chunks, codes)
    a = np.zeros((4, out, chunks), F32)  # chunk_dot's 4 chains, all chunks at once
    for j in range(4):
        for m in range(4):
            for k in ((8 * j + 2 * m, 8 * j + 2 * m + 1) if bits == 4 else (4 * j + m,)):
                a[m] = fma(qc[:, :, k], xc[:, k], a[m])
    dot = ((a[0] + a[1]).astype(F32) + (a[2] + a[3]).astype(F32)).astype(F32)
    xs = np.zeros(chunks, F32)
    for k in range(codes):
        xs = (xs + xc[:, k]).astype(F32)
    chunk_group = np.arange(chunks) * codes // group
    s = scales.astype(F32)[:, chunk_group]
    b = biases.astype(F32)[:, chunk_group]
    threads = 32 * warps
    acc = np.zeros((out, threads), F32)
    for c0 in range(0, chunks, threads):
        for t in range(min(threads, chunks - c0)):
            c = c0 + t
            acc[:, t] = fma(s[:, c], dot[:, c], fma(b[:, c], xs[c], acc[:, t]))
    warp = acc.reshape(out, warps, 32)
    for offset in (16, 8, 4, 2, 1):
        warp = (warp + warp[:, :, np.arange(32) ^ offset]).astype(F32)
    total = warp[:, 0, 0]
    for w in range(1, warps):
        total = (total + warp[:, w, 0]).astype(F32)
    return total


def kp_rms_norm_sum_of_squares(x: np.ndarray, items: int, tpr: int, vec: int) -> np.float32:
    """kp_rms_norm.cu's `kp_row` and `row_sum`, transcribed loop for loop in f32 (one row).
    Each square is rounded before its add; nvcc (default --fmad=true) may fuse `acc += f * f`
    into an FMA, which changes bits but not the order (the bound charges the square's rounding
    either way)."""
    vecs = len(x) // vec
    acc = np.zeros((tpr, 4), dtype=F32)
    for i in range(items):
        for t in range(tpr):
            j = t + i * tpr
            f = x[j * vec:(j + 1) * vec] if j < vecs else np.zeros(vec, F32)
            for k in range(vec):
                acc[t, k % 4] = F32(acc[t, k % 4] + F32(f[k] * f[k]))
    v = ((acc[:, 0] + acc[:, 1]).astype(F32) + (acc[:, 2] + acc[:, 3]).astype(F32)).astype(F32)
    width = min(tpr, 32)
    offset = width // 2
    while offset:  # __shfl_xor_sync: lane l adds lane l ^ offset's value
        v = (v + v[np.arange(tpr) ^ offset]).astype(F32)
        offset //= 2
    partial = v[::32] if tpr > 32 else v[:1]  # lane 0 of each warp parks its partial
    total = partial[0]
    for p in partial[1:]:
        total = F32(total + p)
    return total


def warp_of_vectors_dot(t: np.ndarray, per_lane: int) -> np.float32:
    """gdn_step.cu / ssm_step.cu (hpn): lane l's products t at n = (32 j + l) W + w summed from 0
    in (j, w) order, then `warp_sums`: v += shfl_xor(v, offset) for offset 16 .. 1."""
    w_ = 4 if per_lane % 4 == 0 else 2 if per_lane % 2 == 0 else 1
    lanes = np.zeros(32, F32)
    for j in range(per_lane // w_):
        for w in range(w_):
            lanes = (lanes + t[(j * 32 + np.arange(32)) * w_ + w]).astype(F32)
    for offset in (16, 8, 4, 2, 1):
        lanes = (lanes + lanes[np.arange(32) ^ offset]).astype(F32)
    return lanes[0]


def ssm_hnp_dot(t: np.ndarray, npl: int, warps: int = 4) -> np.float32:
    """ssm_step.cu (hnp) y's sum over n: thread (warp, lane) with row group rg = lane / 4 sums
    n = rg + 8 warp + 32 i (i from 0, in order), lanes 16, 8, 4 apart meet by xor shuffle, then
    `sum = 0; sum += partial[wp]` over the warps."""
    part = np.zeros((warps, 32), F32)
    lane = np.arange(32)
    for i in range(npl):
        for wp in range(warps):
            part[wp] = (part[wp] + t[lane // 4 + 8 * wp + 32 * i]).astype(F32)
    for offset in (16, 8, 4):
        part = (part + part[:, lane ^ offset]).astype(F32)
    total = F32(0)
    for wp in range(warps):
        total = F32(total + part[wp, 0])
    return total


def conv_out(bias: np.ndarray, w: np.ndarray, win: np.ndarray) -> np.ndarray:
    """conv1d.cu's `conv_out` per channel: acc = bias, then acc += w_j * win_j for j in order
    (nvcc fuses each into an FMA)."""
    acc = bias.astype(F32)
    for j in range(w.shape[-1]):
        acc = fma(w[..., j], win[..., j], acc)
    return acc


def kp_qmm(q: np.ndarray, scales: np.ndarray, biases: np.ndarray, x: np.ndarray,
           bits: int) -> np.ndarray:
    """kp_qmm.cu for codes q [out, in], scales and biases [out, groups], x [m, in] as f32
    values: w = fma(q, s, b) per code; lane l of 8 runs acc = fma(w, x, acc) over its chunks
    c = step * 8 + l < in / codes (a partial last step: the lanes past the row add nothing),
    codes in order; then the 8 lanes by xor butterfly (4, 2, 1)."""
    out, n = q.shape
    codes = 128 // bits
    group = n // scales.shape[1]
    g = np.arange(n) // group
    w = fma(q.astype(F32), scales.astype(F32)[:, g], biases.astype(F32)[:, g])  # [out, in]
    xf = x.astype(F32)
    acc = np.zeros((x.shape[0], out, 8), F32)
    chunks = n // codes
    for step in range(-(-chunks // 8)):
        lanes = np.arange(8)[step * 8 + np.arange(8) < chunks]
        for k in range(codes):
            d = (step * 8 + lanes) * codes + k  # each live lane's code k of this step
            acc[..., lanes] = fma(w[None, :, d], xf[:, None, d], acc[..., lanes])
    for offset in (4, 2, 1):
        acc = (acc + acc[..., np.arange(8) ^ offset]).astype(F32)
    return acc[..., 0]


def kp_fp4_gemv(q: np.ndarray, block_scales: np.ndarray, ts: float, x: np.ndarray, fmt: str,
                warps: int) -> np.ndarray:
    """kp_fp4.cu's GEMV for E2M1 values q [out, in], the blocks' scales [out, in / block] as f32
    values, the tensor scale ts and x [m, in]: y [m, out] before the store."""
    out, n = q.shape
    chunks, threads = n // 32, 32 * warps
    qf, xf, s = q.astype(F32), x.astype(F32), block_scales.astype(F32)
    m = x.shape[0]
    acc = np.zeros((m, out, threads), F32)
    for c0 in range(0, chunks, threads):
        for t in range(min(threads, chunks - c0)):
            c = c0 + t
            d = []
            for h in range(2):
                a = [np.zeros((m, out), F32), np.zeros((m, out), F32)]
                for k in range(0, 16, 2):
                    for p in range(2):
                        i = c * 32 + h * 16 + k + p
                        a[p] = fma(qf[None, :, i], xf[:, None, i], a[p])
                d.append((a[0] + a[1]).astype(F32))
            if fmt == "nvfp4":
                for h in range(2):
                    acc[..., t] = fma(s[None, :, 2 * c + h], d[h], acc[..., t])
            else:
                acc[..., t] = fma(s[None, :, c], (d[0] + d[1]).astype(F32), acc[..., t])
    warp = acc.reshape(m, out, warps, 32)
    for offset in (16, 8, 4, 2, 1):
        warp = (warp + warp[..., np.arange(32) ^ offset]).astype(F32)
    total = warp[..., 0, 0]
    for w in range(1, warps):
        total = (total + warp[..., w, 0]).astype(F32)
    return (total * F32(ts)).astype(F32)


def kp_sdpa_score(q: np.ndarray, k: np.ndarray, scale: float, vec: int,
                  epl: int = 16) -> np.ndarray:
    """kp_sdpa_decode.cu pass 1's score of one query row q [D] against key rows k [n, D] (f32
    values; `vec` elements of T a 16-byte vector): qs = q * scale; lane `sub` of the key's LPK
    holds vectors sub + i * LPK, runs dot = fma(qs, kf, dot) over its EPL elements, then the
    LPK lanes add by xor butterfly."""
    d = q.shape[-1]
    lanes = 1 << max(0, (-(-d // epl) - 1).bit_length())
    qs = (q.astype(F32) * F32(scale)).astype(F32)
    kf = k.astype(F32)
    dot = np.zeros((k.shape[0], lanes), F32)
    for i in range(epl // vec):
        for e in range(vec):
            idx = (i * lanes + np.arange(lanes)) * vec + e
            ok = idx < d
            take = np.where(ok, idx, 0)
            dot = fma(np.where(ok, qs[take], 0), np.where(ok, kf[:, take], 0), dot)
    o = lanes // 2
    while o:
        dot = (dot + dot[:, np.arange(lanes) ^ o]).astype(F32)
        o //= 2
    return dot[:, 0]
