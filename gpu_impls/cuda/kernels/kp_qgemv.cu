// kp_qgemv<T, BITS, ROWS>: kparity's own quantized GEMV (M = 1) over MLX's affine layout, built
// to stream the packed weights at the HBM limit. Same math and layout as dequant_gemv.cu:
//     out[r] = sum_d (q[r,d] * s[r,g] + b[r,g]) * x[d]         g = d / group_size
// in f32, one rounding to T at the store, computed per 16-byte chunk by the algebraic split
//     sum_{d in chunk} (q s + b) x = s * sum q x + b * sum x   (a chunk never straddles a group)
//
// Layout. A row's packed words are CHUNKS = in * BITS / 128 chunks of 16 bytes, CODES = 128 / BITS
// codes each (32 for int4, 16 for int8). A block of WARPS warps (blockDim.x = 32 * WARPS,
// WARPS in 1..4, chosen by the launcher) owns ROWS consecutive rows and splits K: thread t takes
// chunks t, t + blockDim.x, ... of each row, so at every step the block reads 512 * WARPS
// contiguous bytes per row (coalesced LDG.128). The matching CODES values of x (4 16-byte loads
// for int4 bf16) are read once per step and shared by the ROWS rows. The next step's weight
// chunks, with their scales and biases, are loaded before the current step's math (software
// pipelining: the scale and bias of a chunk sit in a different HBM line than its codes, so an
// unprefetched group load would stall every step for a full memory latency). Splitting K over
// more warps gives out / ROWS blocks of fewer steps each (short rows: 1 warp and several steps
// to pipeline; long rows and few of them: more warps, so every SM gets work). The warps' partial sums meet in shared memory, added in warp
// order (deterministic). Rows past `out` load row 0 and store nothing.
//
// Codes to f32 without I2F (16 conversions per clock per SM on sm_90: 4.2e12/s on an H100,
// short of the ~6e12 int4 codes/s that 3 TB/s brings): a byte c placed under the exponent of 2^23 (0x4B000000 | c, one PRMT) is the float
// 2^23 + c exactly, and subtracting 2^23 gives c. int4 splits a word into even and odd nibbles
// first (w & 0x0F0F0F0F, (w >> 4) & 0x0F0F0F0F: byte m = code 2m, 2m + 1), int8 reads the bytes
// directly. Per code: about 1.4 integer ops, one FADD and one FFMA.
//
// Error: per lane, each chunk's sum q x is 4 interleaved f32 chains of CODES / 4 FMAs and sum x
// one chain of CODES adds; a thread's total is a chain of in / (128 CODES) chunk terms, then a
// 5-level butterfly and 3 warp adds. So the longest chain is under in / 32 + CODES + 8
// roundings, well inside the
// oracle's budget eps32 * (in / 8 + 5) * sum (|q s| + |b|) |x| (oracle/gemv.py).
//
// DISPATCH INVARIANTS (gpu_impls/cuda/kp_gemv.py): BITS in (4, 8); in % CODES == 0 (whole
// chunks: a row stays 16-byte aligned); group_size % CODES == 0 (a chunk has one scale and bias);
// in % group_size == 0; 16-byte aligned w and x.
//
// Test-only mutants (tests/mutants.py): KPARITY_MUTANT_NIBBLE_ORDER (even and odd nibbles
// swapped), KPARITY_MUTANT_DROP_BIAS, KPARITY_MUTANT_GROUP_OFF_BY_ONE (a chunk takes the next
// group's scale and bias when it ends a group), KPARITY_MUTANT_SKIP_LAST_GROUP (the chunks of
// the last group are skipped).
#include "common.cuh"

#define KPQ_BLOCK 128

// Timing diagnostics only (scripts/kp_variants.py, wrong results): the scale and bias loads, or
// the x loads, served from the first line of their array (L1 hits) instead of their own.
#ifdef KPARITY_DIAG_NO_GROUP_LOADS
#define KPQ_GROUP_AT(base, g) ((g) & 63)
#else
#define KPQ_GROUP_AT(base, g) ((base) + (g))
#endif
#ifdef KPARITY_DIAG_NO_X_LOADS
#define KPQ_X_AT(i) ((i) & 3)
#else
#define KPQ_X_AT(i) (i)
#endif

namespace kpq {

__device__ __forceinline__ float byte_as_float(unsigned word, unsigned selector) {
    // bytes: [word.byte(m), 0x00, 0x00, 0x4B] -> 2^23 + byte, exact; minus 2^23
    return __uint_as_float(__byte_perm(word, 0x4B000000u, selector)) - 8388608.0f;
}

// sum_k q_k * xf[k] over one chunk's codes (4 interleaved chains).
template <int BITS>
__device__ __forceinline__ float chunk_dot(const uint4 chunk, const float* xf) {
#ifdef KPARITY_DIAG_LOAD_ONLY
    // Diagnostic only (scripts/kp_variants.py, wrong results): the same loads, almost no math,
    // to time this kernel's memory pattern without its per-code instructions.
    return __uint_as_float(((chunk.x ^ chunk.y ^ chunk.z ^ chunk.w) & 0x007FFFFFu) | 0x3F800000u)
           * xf[0];
#endif
    const unsigned words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if constexpr (BITS == 4) {  // word j: codes 8j .. 8j + 7
            unsigned even = words[j] & 0x0F0F0F0Fu, odd = (words[j] >> 4) & 0x0F0F0F0Fu;
#ifdef KPARITY_MUTANT_NIBBLE_ORDER
            const unsigned t = even; even = odd; odd = t;
#endif
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                const unsigned sel = 0x7540u | (unsigned)m;
                a[m] = fmaf(byte_as_float(even, sel), xf[8 * j + 2 * m], a[m]);
                a[m] = fmaf(byte_as_float(odd, sel), xf[8 * j + 2 * m + 1], a[m]);
            }
        } else {  // BITS == 8, word j: codes 4j .. 4j + 3
#pragma unroll
            for (int m = 0; m < 4; ++m)
                a[m] = fmaf(byte_as_float(words[j], 0x7540u | (unsigned)m), xf[4 * j + m], a[m]);
        }
    }
    return (a[0] + a[1]) + (a[2] + a[3]);
}

}  // namespace kpq

template <typename T, int BITS, int ROWS>
__global__ void __launch_bounds__(KPQ_BLOCK)
kp_qgemv(const uint4* __restrict__ w, const typename T::storage* __restrict__ scales,
         const typename T::storage* __restrict__ biases,
         const typename T::storage* __restrict__ x, typename T::storage* __restrict__ out,
         int out_dim, int in_dim, int group_size) {
    static_assert(BITS == 4 || BITS == 8, "kp_qgemv: int4 or int8");
    typedef Vec<T> V;
    constexpr int CODES = 128 / BITS;     // codes per 16-byte chunk
    constexpr int XV = CODES / V::N;      // 16-byte vectors of x per chunk
    constexpr int MAX_WARPS = KPQ_BLOCK / 32;
    const int t = threadIdx.x;
    const int threads = blockDim.x;  // 32 * warps, warps in 1..MAX_WARPS: they split K
    const int row0 = blockIdx.x * ROWS;
    const int chunks = in_dim / CODES;
    const int groups = in_dim / group_size;
    const int chunks_per_group = group_size / CODES;
#ifdef KPARITY_MUTANT_SKIP_LAST_GROUP
    const int used = chunks - chunks_per_group;
#else
    const int used = chunks;
#endif
    const uint4* xv = reinterpret_cast<const uint4*>(x);

    // Programmatic dependent launch (common.cuh, gemv.py): let the next kernel's blocks be
    // scheduled now, and wait for the kernels before this one to finish before any load.
    // (Also tried: an L2 prefetch of the block's weight rows before the wait, to overlap them
    // with the previous kernel's tail; on an H100 it made llama3-8b-up 20.3 us instead of 19.0,
    // and 23.4 us launched without PDL: benchmarks/HISTORY.md, h100-2026-11-23-pdl.)
    pdl_launch_dependents();
    pdl_wait();

    size_t wrow[ROWS], grow[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int row = row0 + r < out_dim ? row0 + r : 0;
        wrow[r] = (size_t)row * chunks;
        grow[r] = (size_t)row * groups;
    }

    // Group of chunk c (and the mutant moving each group's last chunk into the next group).
    auto group_of = [&](int c) {
        int g = c / chunks_per_group;
#ifdef KPARITY_MUTANT_GROUP_OFF_BY_ONE
        if ((c + 1) % chunks_per_group == 0 && g + 1 < groups) g += 1;
#endif
        return g;
    };
    typedef typename T::storage S;
    float acc[ROWS];
    uint4 next[ROWS];
    S next_s[ROWS], next_b[ROWS];  // the next chunk's scale and bias, in flight with it
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        acc[r] = 0.0f;
        const bool any = t < used;
        next[r] = any ? w[wrow[r] + t] : make_uint4(0u, 0u, 0u, 0u);
        next_s[r] = any ? scales[KPQ_GROUP_AT(grow[r], group_of(t))] : S(0);
        next_b[r] = any ? biases[KPQ_GROUP_AT(grow[r], group_of(t))] : S(0);
    }
    for (int c = t; c < used; c += threads) {
        uint4 cur[ROWS];
        S cur_s[ROWS], cur_b[ROWS];
        const bool more = c + threads < used;
        const int g_next = group_of(more ? c + threads : c);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            cur[r] = next[r];
            cur_s[r] = next_s[r];
            cur_b[r] = next_b[r];
            if (more) {  // the next step's loads, in flight during this step's math
                next[r] = w[wrow[r] + c + threads];
                next_s[r] = scales[KPQ_GROUP_AT(grow[r], g_next)];
                next_b[r] = biases[KPQ_GROUP_AT(grow[r], g_next)];
            }
        }
        float xf[CODES];
        float xsum = 0.0f;
#pragma unroll
        for (int v = 0; v < XV; ++v) {
            float f[V::N];
            V::unpack(xv[KPQ_X_AT((size_t)c * XV + v)], f);
#pragma unroll
            for (int k = 0; k < V::N; ++k) {
                xf[v * V::N + k] = f[k];
                xsum += f[k];
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float s = T::load(&cur_s[r], 0);
            const float dot = kpq::chunk_dot<BITS>(cur[r], xf);
#ifdef KPARITY_MUTANT_DROP_BIAS
            acc[r] = fmaf(s, dot, acc[r]);
#else
            const float b = T::load(&cur_b[r], 0);
            acc[r] = fmaf(s, dot, fmaf(b, xsum, acc[r]));
#endif
        }
    }
    // Each warp's partial per row (butterfly), then the WARPS partials in warp order.
    __shared__ float partial[MAX_WARPS][ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        float v = acc[r];
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
        if ((t & 31) == 0) partial[t / 32][r] = v;
    }
    __syncthreads();
    if (t < ROWS && row0 + t < out_dim) {
        float v = partial[0][t];
        for (int j = 1; j < threads / 32; ++j) v += partial[j][t];
        T::store(out, row0 + t, v);
    }
}
