// mt_rms_norm_wide<T>: RMSNorm of one row per block, any row length, two strided passes.
//
// Ported from metaltile-std `mt_rms_norm_wide` (crates/metaltile-std/src/mlx/rms_norm.rs): for
// rows wider than mt_rms_norm's 4096 (e.g. Gemma-4-31B's hidden 5376). Each thread strides over
// the row by the block size, so its element count ceil(n / TPG) varies with n and cannot be kept
// in registers across the reduction: pass 2 re-reads x (RMSNorm is memory-bound; that extra read
// is the price of unbounded n).
//
//   inv    = rsqrt(sum_i x_i^2 / n + eps)                  (f32)
//   out_i  = T(x_i * inv * (w_i + weight_offset))           (f32, one rounding at the store)
//
// DISPATCH INVARIANTS (the seed's; checked by the wrapper's contract before any launch):
//   - TPG a multiple of 32 (the reduction combines whole warps). The wrapper uses TPG = 1024;
//     the stride is blockDim.x, so the kernel is correct for any such TPG.
//   - Grid: one block per row.
//   - n may be any positive value: the strided loops bound on n, threads past it run no
//     iterations (and still take part in the reduction, contributing 0).
#include "common.cuh"
#include "rms_math.cuh"

template <typename T>
__global__ void mt_rms_norm_wide(const typename T::storage* __restrict__ x,
                                 const typename T::storage* __restrict__ w,
                                 typename T::storage* __restrict__ out,
                                 float eps, float weight_offset, int n) {
    const size_t row = (size_t)blockIdx.x * n;

    // Pass 1: strided sum of squares.
    float ssq = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = T::load(x, row + i);
        ssq += v * v;
    }
    const float inv = rms_inv(block_sum(ssq), n, eps);

#ifdef KPARITY_MUTANT_SKIP_LANE
    if (threadIdx.x == 1) return;  // mutant: thread 1's elements keep the NaN poison
#endif
    // Pass 2: re-read x, scale, store.
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        T::store(out, row + i, normed<T>(T::load(x, row + i), inv, T::load(w, i) + weight_offset));
}
