// The seed's fused RMSNorm + quantized GEMV kernels (metaltile-std `src/ffai/rms_norm_qgemv.rs`),
// ported with their geometry:
//   ffai_rms_norm_qgemv<T>            int4, one block per output row (grid out, TPG 128)
//   ffai_rms_norm_qgemv_fast<T>       int4, 8 rows per block of 64 threads, mask without shift
//   ffai_rms_norm_qgemv_int8_fast<T>  int8, the same geometry, bytes extracted by shifts
//
// Math, f32 inside, one rounding to T at the store:
//   inv    = rsqrt(sum_d x_d^2 / in + eps)                  over the whole x (phase 1)
//   n_d    = x_d * nw_d * inv                               the seed's order; never rounded to T
//   out[r] = sum_d (q[r,d] * s[r,g] + b[r,g]) * n_d         g = d / group_size (phase 2)
// Layout (MLX affine, `oracle/quant.py`): W [out, in * BITS / 32] uint32, codes LSB-first (int4:
// nibble 0 = bits 0..3; int8: byte 0 = bits 0..7); scales, biases [out, in / group_size] in T;
// x, norm_weight [in] in T; out [out] in T.
//
// Phase 1 is the same in every kernel: the whole block squares a strided share of x and
// `block_sum`s it (the seed's `mt_rms_inv_scalar`), so each block recomputes inv for its rows.
//
// Scalar kernel (seed `ffai_rms_norm_qgemv`): pack-strided, thread t takes words t, t + TPG, ...
// of its row, loads the word's group scale and bias once, and accumulates dequantize-then-dot
// terms (q * s + b) * n_d. DISPATCH INVARIANTS (gpu_impls/cuda/rms_qgemv.py): bits == 4,
// in % group_size == 0 (group_size >= 32, so a word never straddles groups), blockDim.x a
// multiple of 32 (the wrapper launches 128, as the seed's tests and bench); grid = out rows.
//
// Fast kernels (seed `_fast`, `_int8_fast`; MLX `affine_qmv_fast` geometry): 64 threads = 2 warps
// x 4 rows = 8 rows per block, grid out / 8. A lane takes 16 consecutive codes per step (2 words
// int4, 4 words int8) and a warp 512 codes, with one scale and bias per lane step, and the
// algebraic split  sum_i (q_i s + b) n_i = s * sum_i q_i n_i + b * sum_i n_i.  int4 uses "mask
// without shift": n is pre-scaled by 1, 1/16, 1/256, 1/4096 by nibble position within each
// 16-bit half word, so (h & 0x00f0) * n/16 = q * n (powers of two: exact for normal values);
// int8 extracts each byte with a shift and a mask (the seed's int8 kernel does not pre-scale).
// DISPATCH INVARIANTS: group_size == 64, in % 512 == 0, out % 8 == 0 (no bounds checks).
//
// Test-only mutants (compiled in with -D by tests/mutants.py): KPARITY_MUTANT_NIBBLE_ORDER
// (codes within each word read in reverse order), KPARITY_MUTANT_GROUP_OFF_BY_ONE (scalar: each
// group's last code takes the next group's scale and bias; fast: the lane step that ends a group
// does), KPARITY_MUTANT_DROP_BIAS (w = q * s), KPARITY_MUTANT_SKIP_LAST_GROUP (a row's last
// group is never accumulated), KPARITY_MUTANT_DROP_EPS (in common.cuh's rms_inv).
#include "common.cuh"
#include "rms_math.cuh"
#include "quant.cuh"

namespace rq {

constexpr int FAST_ROWS = 4;    // rows per warp (2 warps per block)
constexpr int FAST_VPT = 16;    // codes per lane per step
constexpr int FAST_STEP = 512;  // codes per warp per step: FAST_VPT * 32

// Word i of a row's codes; the mutant reverses the order of the codes within the word.
template <int BITS>
__device__ __forceinline__ unsigned load_codes(const unsigned* __restrict__ w, size_t i) {
    unsigned v = w[i];
#ifdef KPARITY_MUTANT_NIBBLE_ORDER
    if constexpr (BITS == 8) {
        v = __byte_perm(v, 0u, 0x0123);  // bytes 3 2 1 0
    } else {  // nibbles 7 .. 0: halves, then bytes within halves, then nibbles within bytes
        v = (v >> 16) | (v << 16);
        v = ((v & 0xff00ff00u) >> 8) | ((v & 0x00ff00ffu) << 8);
        v = ((v & 0xf0f0f0f0u) >> 4) | ((v & 0x0f0f0f0fu) << 4);
    }
#endif
    return v;
}

// Phase 1: inv = rsqrt(sum x^2 / in + eps), the same bits in every thread of the block.
template <typename T>
__device__ __forceinline__ float inv_rms(const typename T::storage* __restrict__ x, int in_dim,
                                         float eps) {
    float ssq = 0.0f;
    for (int d = threadIdx.x; d < in_dim; d += blockDim.x) {
        const float v = T::load(x, d);
        ssq += v * v;
    }
    return rms_inv(block_sum(ssq), in_dim, eps);
}

// n_d = x_d * nw_d * inv in f32, in the seed's order.
template <typename T>
__device__ __forceinline__ float normed_at(const typename T::storage* __restrict__ x,
                                          const typename T::storage* __restrict__ nw, int d,
                                          float inv) {
    return T::load(x, d) * T::load(nw, d) * inv;
}

using quant::codes_used;
using quant::dequant;

// The group of a fast-kernel lane step starting at code k0 (its 16 codes lie in one group of
// 64); the mutant gives the step that ends a group the next group's scale and bias.
__device__ __forceinline__ int step_group(int k0, int group_size, int groups) {
#ifdef KPARITY_MUTANT_GROUP_OFF_BY_ONE
    const int g = (k0 + FAST_VPT) / group_size;
    return g < groups ? g : groups - 1;
#else
    return k0 / group_size;
#endif
}

// sum_i q_i * n_i over one row's 16 codes from word `wr[0]` on, summed in the seed's order.
// int4: `n` is pre-scaled by nibble position, and the masked, unshifted nibbles multiply it.
template <int BITS>
__device__ __forceinline__ float qdot(const unsigned* __restrict__ wr,
                                      const float (&n)[FAST_VPT]) {
    float acc = 0.0f;
    if constexpr (BITS == 4) {
        const unsigned word[2] = {load_codes<4>(wr, 0), load_codes<4>(wr, 1)};
#pragma unroll
        for (int h = 0; h < 4; ++h) {  // 4 half words of 4 nibbles
            const unsigned hw = word[h / 2] >> (16 * (h % 2));
#pragma unroll
            for (int j = 0; j < 4; ++j) acc += (float)(hw & (0xfu << (4 * j))) * n[4 * h + j];
        }
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) {  // 4 words of 4 bytes
            const unsigned word = load_codes<8>(wr, k);
#pragma unroll
            for (int j = 0; j < 4; ++j) acc += (float)((word >> (8 * j)) & 0xffu) * n[4 * k + j];
        }
    }
    return acc;
}

// The fast kernels' body: 8 rows per 64-thread block, BITS 4 or 8.
template <typename T, int BITS>
__device__ __forceinline__ void fast_rows(const typename T::storage* __restrict__ x,
                                         const typename T::storage* __restrict__ nw,
                                         const unsigned* __restrict__ w,
                                         const typename T::storage* __restrict__ scales,
                                         const typename T::storage* __restrict__ biases,
                                         typename T::storage* __restrict__ out, float eps,
                                         int in_dim, int group_size) {
    constexpr int PF = 32 / BITS;  // codes per word
    const int lane = threadIdx.x & 31;
    const size_t row0 = ((size_t)blockIdx.x * 2 + threadIdx.x / 32) * FAST_ROWS;
    const size_t words = in_dim / PF;
    const int groups = in_dim / group_size;
    const float inv = inv_rms<T>(x, in_dim, eps);
    const int used = codes_used(in_dim, group_size);
    float acc[FAST_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};

    for (int k0 = lane * FAST_VPT; k0 < used; k0 += FAST_STEP) {
        // the lane's 16 normalised values, their plain sum (the split's bias term), and for
        // int4 the pre-scale by 16^-(position within the half word)
        float n[FAST_VPT];
        float nsum = 0.0f;
#pragma unroll
        for (int i = 0; i < FAST_VPT; ++i) {
            const float v = normed_at<T>(x, nw, k0 + i, inv);
            nsum += v;
            n[i] = BITS == 4 ? v * (1.0f / (float)(1u << (4 * (i % 4)))) : v;
        }
        const int g = step_group(k0, group_size, groups);
#pragma unroll
        for (int r = 0; r < FAST_ROWS; ++r) {
            const size_t row = row0 + r;
            const float s = T::load(scales, row * groups + g);
#ifdef KPARITY_MUTANT_DROP_BIAS
            acc[r] = acc[r] + s * qdot<BITS>(w + row * words + k0 / PF, n);
#else
            const float b = T::load(biases, row * groups + g);
            acc[r] = acc[r] + s * qdot<BITS>(w + row * words + k0 / PF, n) + b * nsum;
#endif
        }
    }
#pragma unroll
    for (int r = 0; r < FAST_ROWS; ++r) {
        float v = acc[r];
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
        if (lane == 0) T::store(out, row0 + r, v);
    }
}

}  // namespace rq

template <typename T>
__global__ void ffai_rms_norm_qgemv(const typename T::storage* __restrict__ x,
                                    const typename T::storage* __restrict__ norm_weight,
                                    const unsigned* __restrict__ w,
                                    const typename T::storage* __restrict__ scales,
                                    const typename T::storage* __restrict__ biases,
                                    typename T::storage* __restrict__ out, float eps, int in_dim,
                                    int group_size) {
    constexpr int PF = 8;  // int4 codes per word
    const size_t row = blockIdx.x;
    const int groups = in_dim / group_size;
    const unsigned* wr = w + row * (size_t)(in_dim / PF);
    const typename T::storage* sr = scales + row * groups;
    const typename T::storage* br = biases + row * groups;
    const float inv = rq::inv_rms<T>(x, in_dim, eps);
    const int used_words = rq::codes_used(in_dim, group_size) / PF;

    float acc = 0.0f;
    for (int p = threadIdx.x; p < used_words; p += blockDim.x) {
        const int d0 = p * PF;
        const int g = d0 / group_size;  // the whole word's group: group_size % 8 == 0
        const float s = T::load(sr, g), b = T::load(br, g);
        const unsigned packed = rq::load_codes<4>(wr, p);
#pragma unroll
        for (int k = 0; k < PF; ++k) {
            float sk = s, bk = b;
#ifdef KPARITY_MUTANT_GROUP_OFF_BY_ONE
            if ((d0 + k + 1) % group_size == 0 && g + 1 < groups) {
                sk = T::load(sr, g + 1);
                bk = T::load(br, g + 1);
            }
#endif
            const float q = (float)((packed >> (4 * k)) & 0xfu);
            acc += rq::dequant(q, sk, bk) * rq::normed_at<T>(x, norm_weight, d0 + k, inv);
        }
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) T::store(out, row, acc);
}

template <typename T>
__global__ void __launch_bounds__(64)
ffai_rms_norm_qgemv_fast(const typename T::storage* __restrict__ x,
                         const typename T::storage* __restrict__ norm_weight,
                         const unsigned* __restrict__ w,
                         const typename T::storage* __restrict__ scales,
                         const typename T::storage* __restrict__ biases,
                         typename T::storage* __restrict__ out, float eps, int in_dim,
                         int group_size) {
    rq::fast_rows<T, 4>(x, norm_weight, w, scales, biases, out, eps, in_dim, group_size);
}

template <typename T>
__global__ void __launch_bounds__(64)
ffai_rms_norm_qgemv_int8_fast(const typename T::storage* __restrict__ x,
                              const typename T::storage* __restrict__ norm_weight,
                              const unsigned* __restrict__ w,
                              const typename T::storage* __restrict__ scales,
                              const typename T::storage* __restrict__ biases,
                              typename T::storage* __restrict__ out, float eps, int in_dim,
                              int group_size) {
    rq::fast_rows<T, 8>(x, norm_weight, w, scales, biases, out, eps, in_dim, group_size);
}
