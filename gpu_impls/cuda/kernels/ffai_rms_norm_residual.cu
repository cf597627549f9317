// ffai_rms_norm_residual<T>: residual + RMSNorm(x), one row per block, 4 elements per thread.
//
// Ported from FFAI `ffai_rms_norm_residual` (metaltile-std src/ffai/rms_norm_residual.rs): the
// norm and the residual add fused, with no rounding to T in between.
//
//   inv    = rsqrt(sum_i x_i^2 / n + eps)                          (f32)
//   out_i  = T(residual_i + x_i * inv * (w_i + weight_offset))     (f32, one rounding at the store)
//
// DISPATCH INVARIANTS (as mt_rms_norm, TPG = n / 4; checked by the wrapper's contract):
//   - n = TPG * 4: thread t owns elements 4t .. 4t+3 of its row; the wrapper derives TPG = n / 4.
//   - TPG a multiple of 32 (and at least 32): the reduction combines whole warps.
//   - TPG <= 1024 (the per-block thread limit), so n <= 4096.
//   - Combined: n % 128 == 0 and 128 <= n <= 4096.
//   - Grid: one block per row.
// Belt and braces, as in mt_rms_norm: a thread whose 4 elements are not all in the row re-reads
// the row start, contributes 0 to the sum and stores nothing.
#include "common.cuh"
#include "rms_math.cuh"

template <typename T>
__global__ void ffai_rms_norm_residual(const typename T::storage* __restrict__ x,
                                       const typename T::storage* __restrict__ residual,
                                       const typename T::storage* __restrict__ w,
                                       typename T::storage* __restrict__ out,
                                       float eps, float weight_offset, int n) {
    const size_t row = (size_t)blockIdx.x * n;
    const int col = threadIdx.x * 4;
    const bool in_bounds = col + 3 < n;
    const int safe_col = in_bounds ? col : 0;  // a legal address; its value is masked below

    float v[4];
    float ssq = 0.0f;
    for (int k = 0; k < 4; ++k) {
        v[k] = T::load(x, row + safe_col + k);
        ssq += v[k] * v[k];
    }
    const float inv = rms_inv(block_sum(in_bounds ? ssq : 0.0f), n, eps);

#ifdef KPARITY_MUTANT_SKIP_LANE
    if (threadIdx.x == 1) return;  // mutant: thread 1's elements keep the NaN poison
#endif
    if (!in_bounds) return;
    for (int k = 0; k < 4; ++k) {
        const float wk = T::load(w, col + k) + weight_offset;
        T::store(out, row + col + k, T::load(residual, row + col + k) + normed<T>(v[k], inv, wk));
    }
}
