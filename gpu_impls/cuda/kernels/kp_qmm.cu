// kp_qmm<T, BITS, MT>: kparity's own quantized matmul over M = 1..32 activation rows, MLX's affine
// layout, the "qmm_t" form of metaltile-std's mt_qmm family (src/mlx/quantized.rs):
//     out[m, r] = sum_d (q[r,d] * s[r,g] + b[r,g]) * x[m,d]         g = d / group_size
// in f32, one rounding to T at the store. The weight is read from memory once for all M rows.
//
// Layout. A row of W is in * BITS / 128 chunks of 16 bytes, CODES = 128 / BITS codes each (32 for
// int4, 16 for int8). A block of 256 threads owns ROWS = 32 consecutive rows, TPR = 8 threads per
// row (thread t: row t / 8, lane t % 8). K is walked in steps of TILE = TPR * CODES codes: at each
// step the block stages x[0:M, tile] in shared memory as f32 (exact widening), then every lane
// loads the one 16-byte chunk of its row that the step covers (the 8 lanes of a row read 128
// contiguous bytes; the next step's chunk is loaded before this step's math), dequantizes it once,
// w = fmaf(q, s, b) per code (a chunk lies inside one group), and multiplies it into all M rows of
// x: acc[m] = fmaf(w, x[m, d], acc[m]) for d in the chunk in order. At the end the 8 lanes of a row
// are summed by an xor butterfly (offsets 4, 2, 1) and lane l stores the rows m = l mod 8.
// Shared x: a lane's CODES values sit in a segment padded by 4 floats, so the 8 lanes' 16-byte
// reads fall in 8 disjoint bank quads (the 4 rows of a warp read each segment as a broadcast).
// MT, the accumulators per thread, is M rounded up to a power of two (1..32); rows m >= M are
// neither staged nor accumulated nor stored. Rows past `out` read row 0 and store nothing.
//
// BATCH INVARIANT (Impl.batch_invariant): row m of an M-row launch equals the 1-row launch on x[m]
// bit for bit. The value stored for (m, r) is lane l's chain of fmaf over its chunks c = l, l + 8,
// ... in increasing order and the codes of each chunk in order, with w = fmaf(q, s, b) from r's
// codes, scales and biases only, then the fixed butterfly over the 8 lanes. Which chunks a lane
// takes depends on the lane and K only (TPR, TILE and the block are compile-time constants, not
// chosen by M); x[m, d] enters exactly (f32 widening); no sum ever mixes two rows m; MT only sets
// how many chains a thread carries, each chain's instructions are the same in every instance
// (explicit fmaf, no contraction left to the compiler). So neither M, MT nor the other rows of x
// can change a bit of row m.
//
// Error: a lane's chain is in / 8 roundings long, plus the q*s+b rounding per term and 3 butterfly
// levels: inside the oracle's budget eps32 * (in / 8 + 5) * sum (|q s| + |b|) |x| (oracle/qmm.py).
//
// Cost: every code costs one FMA per x row after one dequantizing FMA, so past M ~ 4 the kernel is
// bound by f32 FMA throughput, not by the weight's bytes (an MMA kernel is the next step there).
//
// A partial last step (in % TILE != 0: SmolLM2's 576 = 2 steps of 256 int4 codes and 2 chunks):
// its x tile is staged only up to in, and a lane whose chunk c lies past the row's in / CODES
// chunks loads and adds nothing there (its chain is one chunk shorter; the butterfly adds its
// exact partial as before). Every other lane's chain is unchanged, so the order stays a function
// of the lane and K only.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/qmm.py): BITS in (4, 8); 1 <= M <= 32; the MLX layout
// (group_size in 32/64/128 is a multiple of CODES, so a chunk has one scale and bias and a row
// whole chunks; in % group_size == 0); 16-byte aligned w and x (checked by the wrapper).
//
// Test-only mutants (tests/test_gpu_invariance.py): KPARITY_MUTANT_M_DEPENDENT_SUM sums the 8 lanes
// in another order when M > 1: still within the oracle's bound, no longer batch invariant;
// KPARITY_MUTANT_NO_PARTIAL_STEP drops a partial last step (the kernel before it took one).
#include "common.cuh"

#define KPM_BLOCK 256  // threads per block
#define KPM_TPR 8      // threads (lanes) per row: they split K
#define KPM_ROWS (KPM_BLOCK / KPM_TPR)
#define KPM_PAD 4      // floats after each lane's segment of staged x (bank spread)

namespace kpm {

// A byte c under the exponent of 2^23 is the float 2^23 + c exactly (one PRMT); minus 2^23 is c.
__device__ __forceinline__ float code_of_byte(unsigned word, int byte) {
    return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7540u | (unsigned)byte)) - 8388608.0f;
}

// w[k] = q_k * s + b for the CODES codes of one 16-byte chunk, one fmaf each.
template <int BITS>
__device__ __forceinline__ void dequant_chunk(const uint4 chunk, float s, float b,
                                              float (&w)[128 / BITS]) {
    const unsigned words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if constexpr (BITS == 4) {  // word j: codes 8j .. 8j + 7; byte i of `low` is code 8j + 2i
            const unsigned low = words[j] & 0x0F0F0F0Fu, high = (words[j] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                w[8 * j + 2 * i] = fmaf(code_of_byte(low, i), s, b);
                w[8 * j + 2 * i + 1] = fmaf(code_of_byte(high, i), s, b);
            }
        } else {  // BITS == 8, word j: codes 4j .. 4j + 3
#pragma unroll
            for (int i = 0; i < 4; ++i) w[4 * j + i] = fmaf(code_of_byte(words[j], i), s, b);
        }
    }
}

}  // namespace kpm

template <typename T, int BITS, int MT>
__global__ void __launch_bounds__(KPM_BLOCK)
kp_qmm(const uint4* __restrict__ w, const typename T::storage* __restrict__ scales,
       const typename T::storage* __restrict__ biases, const typename T::storage* __restrict__ x,
       typename T::storage* __restrict__ out, int m_rows, int out_dim, int in_dim,
       int group_size) {
    static_assert(BITS == 4 || BITS == 8, "kp_qmm: int4 or int8");
    static_assert(MT >= 1 && MT <= 32, "kp_qmm: 1..32 accumulators per thread");
    typedef Vec<T> V;
    constexpr int CODES = 128 / BITS;         // codes per 16-byte chunk
    constexpr int TILE = KPM_TPR * CODES;     // codes of K per step
    constexpr int SEG = CODES + KPM_PAD;      // floats per lane segment of staged x
    __shared__ __align__(16) float xs[MT][KPM_TPR * SEG];

    const int t = threadIdx.x;
    const int lane = t % KPM_TPR;
    const int row = blockIdx.x * KPM_ROWS + t / KPM_TPR;
    const bool live = row < out_dim;
    const size_t wrow = live ? (size_t)row : 0;  // rows past `out` read row 0, store nothing
    const uint4* wr = w + wrow * (size_t)(in_dim / CODES);
    const size_t grow = wrow * (size_t)(in_dim / group_size);
    const int chunks = in_dim / CODES;                // whole 16-byte chunks of a row
#ifdef KPARITY_MUTANT_NO_PARTIAL_STEP
    const int steps = chunks / KPM_TPR;  // the codes of a partial last step never summed
#else
    const int steps = (chunks + KPM_TPR - 1) / KPM_TPR;  // the last one may be partial
#endif
    const int chunks_per_group = group_size / CODES;

    float acc[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m] = 0.0f;

    uint4 next = lane < chunks ? wr[lane] : make_uint4(0, 0, 0, 0);
    for (int step = 0; step < steps; ++step) {
        __syncthreads();  // the previous step's readers are done with xs
        const int tile_vecs = min(TILE, in_dim - step * TILE) / V::N;  // a partial last tile
        for (int i = t; i < m_rows * tile_vecs; i += KPM_BLOCK) {
            const int m = i / tile_vecs, k = (i % tile_vecs) * V::N;  // k: code in the tile
            float f[V::N];
            V::unpack(*reinterpret_cast<const uint4*>(x + (size_t)m * in_dim
                                                      + (size_t)step * TILE + k), f);
            float* dst = &xs[m][(k / CODES) * SEG + k % CODES];  // a vector stays in one segment
#pragma unroll
            for (int j = 0; j < V::N; ++j) dst[j] = f[j];
        }
        __syncthreads();

        const int c = step * KPM_TPR + lane;  // this lane's chunk of the row
        const uint4 cur = next;
        if (c + KPM_TPR < chunks) next = wr[c + KPM_TPR];  // in flight during the math
        if (c >= chunks) continue;  // past the row (a partial last step): nothing to add
        const int g = c / chunks_per_group;
        float wf[CODES];
        kpm::dequant_chunk<BITS>(cur, T::load(scales, grow + g), T::load(biases, grow + g), wf);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (m < m_rows) {
                const float* xm = &xs[m][lane * SEG];
#pragma unroll
                for (int k = 0; k < CODES; k += 4) {
                    const float4 xv = *reinterpret_cast<const float4*>(xm + k);
                    acc[m] = fmaf(wf[k], xv.x, acc[m]);
                    acc[m] = fmaf(wf[k + 1], xv.y, acc[m]);
                    acc[m] = fmaf(wf[k + 2], xv.z, acc[m]);
                    acc[m] = fmaf(wf[k + 3], xv.w, acc[m]);
                }
            }
        }
    }

    // The 8 lanes of a row (aligned groups of 8 in the warp: xor offsets < 8 stay inside one).
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#ifdef KPARITY_MUTANT_M_DEPENDENT_SUM
        if (m_rows > 1) {
            for (int offset = 1; offset < KPM_TPR; offset <<= 1)
                acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], offset);
            continue;
        }
#endif
#pragma unroll
        for (int offset = KPM_TPR / 2; offset > 0; offset >>= 1)
            acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], offset);
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m < m_rows && m % KPM_TPR == lane && live)
            T::store(out, (size_t)m * out_dim + row, acc[m]);
    }
}
