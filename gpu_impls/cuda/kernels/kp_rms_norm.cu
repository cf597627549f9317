// kp_rms_norm<T, ITEMS, TPR>, kp_rms_norm_residual<...>, kp_add_rms_norm<...>: kparity's own
// RMSNorm family, one row body (`kp_row`, compile-time MODE) behind three thin kernels, built to
// stream at the HBM limit: one read of every input byte, one write of every output byte.
//
// Math (as the mt_ / ffai_ seeds; oracle/norms.py), per row of length n, f32 inside, one
// rounding to T at each store:
//   plain     inv = rsqrt(sum_i x_i^2 / n + eps)
//             out_i = T(x_i * inv * (w_i + weight_offset))
//   RESIDUAL  out_i = T(residual_i + x_i * inv * (w_i + weight_offset))
//   ADD       s_i = a_i + b_i (f32, kept unrounded in registers), inv from s,
//             residual_out_i = T(s_i), normed_out_i = T(s_i * inv * (w_i + weight_offset))
//
// Layout. A row is VECS = n / VEC 16-byte vectors, VEC = 16 / sizeof(T) elements (4 for f32,
// 8 for f16/bf16), loaded and stored as raw uint4 and (un)packed in registers. TPR threads
// (a power of two, 1..1024) share a row; thread t of the row owns vectors t + i*TPR for
// i < ITEMS, so at every i a warp touches consecutive 16-byte chunks (coalesced). The block is
// chosen by the launcher (blockDim.x: a multiple of TPR, at most MAX_BLOCK = max(TPR, 256))
// and holds RPB = blockDim.x / TPR rows; grid = ceil(rows / RPB). Threads of a row index
// >= rows still take part in the shuffles and the barrier but neither load nor store.
//
// Reduction. Each thread sums its squares into 4 independent accumulators (element k of a
// vector goes to accumulator k % 4), adds them pairwise, then the row's threads combine by a
// butterfly over lane offsets < min(TPR, 32) (a row never straddles a warp for TPR <= 32; every
// lane of the warp is live, so the full mask is right). For TPR > 32, lane 0 of each warp parks
// its partial in shared memory and every thread adds its row's TPR/32 partials in warp order.
// Deterministic, and every thread of a row holds the same bits. Error bound: the oracle's
// tolerance assumes the f32 sum of squares is split over L >= 4 partial sums, relative error
// <= (n/L + log2 L) * u; here L = 4 * TPR >= 4 for every n, even TPR = 1. The longest rounding
// chain is (ITEMS*VEC/4 - 1) sequential adds per accumulator (<= 7), 2 in-thread pairwise
// levels, log2(min(TPR, 32)) butterfly levels and TPR/32 - 1 warp-combine adds: for every valid
// (n, dtype) that is at most 0.9x the L = 4 budget n/4 + 2 (worst: TPR = 1, n = 32 bf16).
//
// DISPATCH INVARIANTS (derived from n and dtype alone in gpu_impls/cuda/kp_norms.py and checked
// by its contracts before any launch):
//   - n % VEC == 0: rows are whole 16-byte vectors, so every row starts 16-byte aligned (the
//     base pointers are too: the launcher checks) and no tail is left unprocessed.
//   - n >= VEC: at least one vector per row.
//   - n <= 4 * 1024 * VEC (16384 f32, 32768 f16/bf16): at most ITEMS = 4 vectors per thread
//     at TPR = 1024, so the row stays in registers.
//   - TPR = min(1024, next_pow2(ceil(VECS / target))) (below SMALL_WORK at most 256 while
//     ITEMS stays <= 4), ITEMS = ceil(VECS / TPR): the pair
//     picks the instantiation; blockDim.x is a multiple of TPR and at most MAX_BLOCK (the
//     launch bound it is compiled for).
// Belt and braces: every vector index is also bounds-checked against VECS (loads read 0, stores
// are skipped), so a mismatched (ITEMS, TPR) never touches memory outside its row.
//
// Why: 16-byte accesses are the widest a thread can issue (LDG.E.128 / STG.E.128), fewest
// instructions per byte. All ITEMS loads of x (and of residual / b, and of w) are issued before
// the first use, so each thread has up to 4 independent 16-byte loads in flight per input,
// which with >= 1024 resident threads per SM covers HBM latency. ITEMS and TPR are compile-time
// so the arrays are fully unrolled into registers (no local memory) and x is read once: it
// stays in registers between the sum of squares and the output (plain / RESIDUAL keep the raw
// packed bits, 4 registers per vector, and widen twice: cheaper than 8 live floats for 16-bit
// T, and an empty asm stops the compiler from keeping the widened copies instead; ADD keeps
// the f32 sum s, which must not be rounded). Short rows (head_dim 64..256) take
// several rows per block instead of a block of 8 or 16 threads, so blocks stay big enough for
// full occupancy. __launch_bounds__(MAX_BLOCK, 1024 / MAX_BLOCK) caps registers at 64 so at
// least 1024 threads fit per SM (sm_90: every instance fits, 23..64 registers, no spills, no
// stack). Row offsets are size_t: rows * n may exceed 2^31 elements.
//
// Launch. The launcher makes every launch a programmatic dependent launch (common.cuh): the
// kernel first lets its successor's blocks be scheduled, then waits for its predecessors, so
// the next kernel's launch and block scheduling overlap this one's run. At decode and per-head
// shapes (2 us kernels) that launch latency is a large part of the time; on an ordinary launch
// the two instructions are no-ops.
#include "common.cuh"
#include "rms_math.cuh"

namespace kp {

enum { PLAIN = 0, RESIDUAL = 1, ADD = 2 };

__device__ __forceinline__ uint4 zero4() { return make_uint4(0u, 0u, 0u, 0u); }

// Sum of `v` over the TPR threads of each row, returned to all of them (same bits everywhere).
template <int TPR, int MAX_BLOCK>
__device__ __forceinline__ float row_sum(float v) {
    constexpr int WIDTH = TPR < 32 ? TPR : 32;
#pragma unroll
    for (int offset = WIDTH / 2; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    if constexpr (TPR > 32) {
        constexpr int WPR = TPR / 32;  // warps per row
        __shared__ float partial[MAX_BLOCK / 32];
        const int warp = threadIdx.x / 32;
        if ((threadIdx.x & 31) == 0) partial[warp] = v;
        __syncthreads();
        const float* mine = partial + (warp / WPR) * WPR;  // this row's first warp
        v = mine[0];
#pragma unroll
        for (int j = 1; j < WPR; ++j) v += mine[j];
    }
    return v;
}

// One row per TPR threads. MODE PLAIN: (x, w) -> out. RESIDUAL: (x, y = residual, w) -> out.
// ADD: (x = a, y = b, w) -> out = residual_out, out2 = normed_out.
template <typename T, int ITEMS, int TPR, int MODE>
__device__ __forceinline__ void kp_row(const typename T::storage* __restrict__ x,
                                       const typename T::storage* __restrict__ y,
                                       const typename T::storage* __restrict__ w,
                                       typename T::storage* __restrict__ out,
                                       typename T::storage* __restrict__ out2,
                                       float eps, float weight_offset, int rows, int n) {
    typedef Vec<T> V;
    constexpr int VEC = V::N;
    constexpr int MAX_BLOCK = TPR > 256 ? TPR : 256;
    static_assert(TPR >= 1 && TPR <= 1024 && (TPR & (TPR - 1)) == 0, "TPR: a power of two");
    static_assert(ITEMS >= 1 && ITEMS <= 4, "ITEMS: 1..4 vectors per thread");

    const int t = threadIdx.x % TPR;
    const int row = blockIdx.x * (blockDim.x / TPR) + threadIdx.x / TPR;  // RPB rows per block
    const bool live = row < rows;
    const int vecs = n / VEC;
    const size_t base = (size_t)(live ? row : 0) * (size_t)n;
    const uint4* xv = reinterpret_cast<const uint4*>(x + base);
    const uint4* wv = reinterpret_cast<const uint4*>(w);

    // Launched as a programmatic dependent launch (kp_norms.py): let the next kernel's blocks
    // be scheduled now, and wait for the kernels before this one to finish before any load.
    pdl_launch_dependents();
    pdl_wait();
    // Issue every load before the first use: x (and y), then w (L2-resident, reused by all rows).
    bool ok[ITEMS];
    uint4 xr[ITEMS], yr[ITEMS], wr[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int j = t + i * TPR;
        ok[i] = live && j < vecs;
        xr[i] = ok[i] ? xv[j] : zero4();
    }
    if constexpr (MODE != PLAIN) {
        const uint4* yv = reinterpret_cast<const uint4*>(y + base);
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) yr[i] = ok[i] ? yv[t + i * TPR] : zero4();
    }
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) wr[i] = ok[i] ? wv[t + i * TPR] : zero4();

    // Sum of squares into 4 accumulators (element k -> acc[k % 4]); masked vectors are 0.
    float s[MODE == ADD ? ITEMS : 1][VEC];  // ADD: the unrounded f32 sum a + b
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        float f[VEC];
        V::unpack(xr[i], f);
        if constexpr (MODE == ADD) {
            float g[VEC];
            V::unpack(yr[i], g);
#pragma unroll
            for (int k = 0; k < VEC; ++k) s[i][k] = f[k] = f[k] + g[k];
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k % 4] += f[k] * f[k];
    }
    if constexpr (MODE != ADD && !V::WIDE) {
        // Keep x packed across the reduction (4 registers per vector, not 8 widened floats):
        // the empty asm hides the raw bits from the optimiser, so the widened copies are dead
        // here and the output loop widens again (one shift or mask per element).
#pragma unroll
        for (int i = 0; i < ITEMS; ++i)
            asm volatile("" : "+r"(xr[i].x), "+r"(xr[i].y), "+r"(xr[i].z), "+r"(xr[i].w));
    }
    const float ssq = row_sum<TPR, MAX_BLOCK>((acc[0] + acc[1]) + (acc[2] + acc[3]));
    const float inv = rms_inv(ssq, n, eps);

#ifdef KPARITY_MUTANT_SKIP_LANE
    if (threadIdx.x == 1) return;  // mutant: thread 1's vectors keep the NaN poison
#endif
    uint4* ov = reinterpret_cast<uint4*>(out + base);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        if (!ok[i]) continue;
        const int j = t + i * TPR;
        float f[VEC], wf[VEC], o[VEC];
        V::unpack(wr[i], wf);
        if constexpr (MODE == ADD) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) f[k] = s[i][k];
        } else {
            V::unpack(xr[i], f);
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) o[k] = normed<T>(f[k], inv, wf[k] + weight_offset);
        if constexpr (MODE == RESIDUAL) {
            float r[VEC];
            V::unpack(yr[i], r);
#pragma unroll
            for (int k = 0; k < VEC; ++k) o[k] = r[k] + o[k];
        }
        if constexpr (MODE == ADD) {
            ov[j] = V::pack(f);                                    // residual_out = T(s)
            reinterpret_cast<uint4*>(out2 + base)[j] = V::pack(o);  // normed_out
        } else {
            ov[j] = V::pack(o);
        }
    }
}

}  // namespace kp

#define KP_MAX_BLOCK(TPR) ((TPR) > 256 ? (TPR) : 256)

template <typename T, int ITEMS, int TPR>
__global__ void __launch_bounds__(KP_MAX_BLOCK(TPR), 1024 / KP_MAX_BLOCK(TPR))
kp_rms_norm(const typename T::storage* __restrict__ x, const typename T::storage* __restrict__ w,
            typename T::storage* __restrict__ out, float eps, float weight_offset, int rows,
            int n) {
    kp::kp_row<T, ITEMS, TPR, kp::PLAIN>(x, nullptr, w, out, nullptr, eps, weight_offset, rows,
                                         n);
}

template <typename T, int ITEMS, int TPR>
__global__ void __launch_bounds__(KP_MAX_BLOCK(TPR), 1024 / KP_MAX_BLOCK(TPR))
kp_rms_norm_residual(const typename T::storage* __restrict__ x,
                     const typename T::storage* __restrict__ residual,
                     const typename T::storage* __restrict__ w,
                     typename T::storage* __restrict__ out, float eps, float weight_offset,
                     int rows, int n) {
    kp::kp_row<T, ITEMS, TPR, kp::RESIDUAL>(x, residual, w, out, nullptr, eps, weight_offset,
                                            rows, n);
}

template <typename T, int ITEMS, int TPR>
__global__ void __launch_bounds__(KP_MAX_BLOCK(TPR), 1024 / KP_MAX_BLOCK(TPR))
kp_add_rms_norm(const typename T::storage* __restrict__ a,
                const typename T::storage* __restrict__ b,
                const typename T::storage* __restrict__ w,
                typename T::storage* __restrict__ residual_out,
                typename T::storage* __restrict__ normed_out, float eps, float weight_offset,
                int rows, int n) {
    kp::kp_row<T, ITEMS, TPR, kp::ADD>(a, b, w, residual_out, normed_out, eps, weight_offset,
                                       rows, n);
}
