// The seeds' quantized GEMVs over MLX's affine layout (metaltile-std `src/ffai/dequant_gemv.rs`,
// `dequant_gemv_expert_indexed.rs`; the layout: `oracle/quant.py`), ported:
//   dequant_gemv<T, BITS>               ffai dequant_gemv_int{2,4,8} (pack-strided) and
//                                       _int{3,5,6} (element-strided bit stream)
//   dequant_gemv_int4_expert_indexed<T> the int4 scalar kernel on slab `expert_index` of stacked
//                                       weights (same body: bit-identical by construction)
//   dequant_gemv_int4_fast<T>           ffai dequant_gemv_int4_fast / MLX affine_qmv_fast
//
// Math: out[r] = sum_d (q[r,d] * s[r,g] + b[r,g]) * x[d], g = d / group_size, f32 inside, one
// rounding to T at the store. W [out, in] as uint32 words, codes LSB-first: a row is one
// little-endian bit stream, code d at bit d * BITS (for BITS 2, 4, 8: 32/BITS codes per word,
// code 0 in the lowest bits); scales and biases [out, in / group_size] in T; x [in] in T.
//
// Scalar kernels: one block of blockDim.x threads (a multiple of 32; the wrapper uses 64, as the
// seed's tests) per output row. Pack-strided (32 % BITS == 0): thread t takes words t,
// t + blockDim.x, ..., and the 32/BITS codes of each; element-strided (3, 5, 6): thread t takes
// codes t, t + blockDim.x, ..., each read across at most two words. Each term is dequantized
// (q * s + b) then multiplied by x and added to the thread's sum; `block_sum` combines.
// DISPATCH INVARIANTS (gpu_impls/cuda/gemv.py): in % group_size == 0, in * BITS % 32 == 0,
// blockDim.x % 32 == 0; grid = out rows.
//
// Fast kernel (int4, group_size 64): blocks of 64 threads = 2 warps x 4 rows = 8 rows; grid
// out / 8. A lane takes 16 consecutive codes (2 words) per step and a warp 512 codes, so
// in % 512 == 0 and out % 8 == 0 (no bounds checks). The algebraic split per step:
//     sum_i (q_i s + b) x_i = s * sum_i q_i x_i + b * sum_i x_i
// and "mask without shift": x is pre-scaled by 1, 1/16, 1/256, 1/4096 by nibble position within
// a 16-bit half word, so (h & 0x00f0) * x/16 = q * x with no shift (powers of two: exact).
//
// Test-only mutants (compiled in with -D by tests/mutants.py): KPARITY_MUTANT_NIBBLE_ORDER
// (codes within a word read in reverse order), KPARITY_MUTANT_GROUP_OFF_BY_ONE (the last code of
// each group takes the next group's scale and bias), KPARITY_MUTANT_DROP_BIAS (w = q * s),
// KPARITY_MUTANT_SKIP_LAST_GROUP (the last group of a row is never accumulated).
#include "common.cuh"
#include "quant.cuh"

namespace qg {

// Code d of a row whose words start at `row`: bits [d*BITS, d*BITS + BITS) of the stream.
template <int BITS>
__device__ __forceinline__ unsigned code_at(const unsigned* __restrict__ row, int d) {
    constexpr unsigned MASK = (1u << BITS) - 1u;
    unsigned bit = (unsigned)d * BITS;
#ifdef KPARITY_MUTANT_NIBBLE_ORDER
    if constexpr (32 % BITS == 0) {  // mutant: position k within its word read as PF - 1 - k
        constexpr unsigned PF = 32 / BITS;
        const unsigned k = (unsigned)d % PF;
        bit = ((unsigned)d - k + (PF - 1 - k)) * BITS;
    }
#endif
    const unsigned wi = bit >> 5, b = bit & 31u;
    unsigned v = row[wi] >> b;
    if (b + BITS > 32) v |= row[wi + 1] << (32 - b);  // straddles two words (BITS 3, 5, 6)
    return v & MASK;
}

// Group of code d (and the mutant that moves each group's last code into the next group).
__device__ __forceinline__ int group_of(int d, int group_size, int groups) {
#ifdef KPARITY_MUTANT_GROUP_OFF_BY_ONE
    const int g = (d + 1) / group_size;
    return g < groups ? g : groups - 1;
#else
    return d / group_size;
#endif
}

using quant::codes_used;
using quant::dequant;

// out_row = T(sum over the row), one block per row. Pointers are already at the row.
template <typename T, int BITS>
__device__ __forceinline__ void scalar_row(const unsigned* __restrict__ w,
                                           const typename T::storage* __restrict__ scales,
                                           const typename T::storage* __restrict__ biases,
                                           const typename T::storage* __restrict__ x,
                                           typename T::storage* __restrict__ out, int in_dim,
                                           int group_size) {
    const int groups = in_dim / group_size;
    const int used = codes_used(in_dim, group_size);
    float acc = 0.0f;
    if constexpr (32 % BITS == 0) {  // pack-strided: whole words per thread
        constexpr int PF = 32 / BITS;
        for (int p = threadIdx.x; p * PF < used; p += blockDim.x) {
#pragma unroll
            for (int k = 0; k < PF; ++k) {
                const int d = p * PF + k;
                const int g = group_of(d, group_size, groups);
                const float q = (float)code_at<BITS>(w, d);
                acc += dequant(q, T::load(scales, g), T::load(biases, g)) * T::load(x, d);
            }
        }
    } else {  // element-strided: the continuous bit stream
        for (int d = threadIdx.x; d < used; d += blockDim.x) {
            const int g = group_of(d, group_size, groups);
            const float q = (float)code_at<BITS>(w, d);
            acc += dequant(q, T::load(scales, g), T::load(biases, g)) * T::load(x, d);
        }
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) T::store(out, 0, acc);
}

}  // namespace qg

template <typename T, int BITS>
__global__ void dequant_gemv(const unsigned* __restrict__ w,
                             const typename T::storage* __restrict__ scales,
                             const typename T::storage* __restrict__ biases,
                             const typename T::storage* __restrict__ x,
                             typename T::storage* __restrict__ out, int in_dim, int group_size) {
    const size_t r = blockIdx.x;
    const size_t words = (size_t)in_dim * BITS / 32, groups = in_dim / group_size;
    qg::scalar_row<T, BITS>(w + r * words, scales + r * groups, biases + r * groups, x, out + r,
                            in_dim, group_size);
}

// Stacked weights [E, out, in/8], scales and biases [E, out, in/G]; expert_index is a 1-element
// device buffer. The kernel does not check it (as the seed); the wrapper does, before launch.
template <typename T>
__global__ void dequant_gemv_int4_expert_indexed(
        const unsigned* __restrict__ w, const typename T::storage* __restrict__ scales,
        const typename T::storage* __restrict__ biases, const typename T::storage* __restrict__ x,
        const unsigned* __restrict__ expert_index, typename T::storage* __restrict__ out,
        int in_dim, int group_size, int out_dim) {
    const size_t e = expert_index[0];
    const size_t r = blockIdx.x;
    const size_t words = (size_t)in_dim / 8, groups = in_dim / group_size;
    const size_t row = e * (size_t)out_dim + r;
    qg::scalar_row<T, 4>(w + row * words, scales + row * groups, biases + row * groups, x,
                         out + r, in_dim, group_size);
}

template <typename T>
__global__ void __launch_bounds__(64)
dequant_gemv_int4_fast(const unsigned* __restrict__ w,
                       const typename T::storage* __restrict__ scales,
                       const typename T::storage* __restrict__ biases,
                       const typename T::storage* __restrict__ x,
                       typename T::storage* __restrict__ out, int in_dim, int group_size) {
    constexpr int ROWS = 4;              // rows per warp
    constexpr int VPT = 16;              // codes per lane per step (2 words)
    constexpr int STEP = VPT * 32;       // codes per warp per step: in % 512 == 0
    const int lane = threadIdx.x & 31;
    const size_t row0 = ((size_t)blockIdx.x * 2 + threadIdx.x / 32) * ROWS;
    const size_t words = in_dim / 8, groups = in_dim / group_size;
    const int used = qg::codes_used(in_dim, group_size);
    float result[ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};

    for (int k0 = lane * VPT; k0 < used; k0 += STEP) {
        // x, pre-scaled by nibble position within each 16-bit half word; and its plain sum
        float xt[VPT];
        float xsum = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT; i += 4) {
            const float x0 = T::load(x, k0 + i), x1 = T::load(x, k0 + i + 1);
            const float x2 = T::load(x, k0 + i + 2), x3 = T::load(x, k0 + i + 3);
            xsum += x0 + x1 + x2 + x3;
            xt[i] = x0;
            xt[i + 1] = x1 * (1.0f / 16.0f);
            xt[i + 2] = x2 * (1.0f / 256.0f);
            xt[i + 3] = x3 * (1.0f / 4096.0f);
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const unsigned* wr = w + (row0 + r) * words + k0 / 8;
            const int g = qg::group_of(k0, group_size, (int)groups);
            const float s = T::load(scales, (row0 + r) * groups + g);
            const float b = T::load(biases, (row0 + r) * groups + g);
            float qdot = 0.0f;
#pragma unroll
            for (int h = 0; h < 4; ++h) {  // 4 half words of 4 nibbles
                unsigned hw = (wr[h / 2] >> (16 * (h % 2))) & 0xffffu;
#ifdef KPARITY_MUTANT_NIBBLE_ORDER
                hw = ((hw & 0xfu) << 12) | ((hw & 0xf0u) << 4) | ((hw >> 4) & 0xf0u) | (hw >> 12);
#endif
                qdot += xt[4 * h] * (float)(hw & 0x000fu) + xt[4 * h + 1] * (float)(hw & 0x00f0u)
                        + xt[4 * h + 2] * (float)(hw & 0x0f00u)
                        + xt[4 * h + 3] * (float)(hw & 0xf000u);
            }
#ifdef KPARITY_MUTANT_DROP_BIAS
            result[r] += s * qdot;
#else
            result[r] += s * qdot + b * xsum;
#endif
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        float v = result[r];
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
        if (lane == 0) T::store(out, row0 + r, v);
    }
}
