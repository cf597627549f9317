// mt_add_rms_norm<T>: s = a + b, then RMSNorm(s); s and the norm are both outputs. Row per block.
//
// Ported from metaltile-std `mt_add_rms_norm` (crates/metaltile-std/src/mlx/unary.rs): the
// pre-norm residual add fused with the norm.
//
//   s_i            = a_i + b_i                                      (f32, kept in registers)
//   inv            = rsqrt(sum_i s_i^2 / n + eps)                   (f32)
//   residual_out_i = T(s_i)
//   normed_out_i   = T(s_i * inv * (w_i + weight_offset))           (from the unrounded f32 s)
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
__global__ void mt_add_rms_norm(const typename T::storage* __restrict__ a,
                                const typename T::storage* __restrict__ b,
                                const typename T::storage* __restrict__ w,
                                typename T::storage* __restrict__ residual_out,
                                typename T::storage* __restrict__ normed_out,
                                float eps, float weight_offset, int n) {
    const size_t row = (size_t)blockIdx.x * n;
    const int col = threadIdx.x * 4;
    const bool in_bounds = col + 3 < n;
    const int safe_col = in_bounds ? col : 0;  // a legal address; its value is masked below

    float s[4];
    float ssq = 0.0f;
    for (int k = 0; k < 4; ++k) {
        s[k] = T::load(a, row + safe_col + k) + T::load(b, row + safe_col + k);
        ssq += s[k] * s[k];
    }
    const float inv = rms_inv(block_sum(in_bounds ? ssq : 0.0f), n, eps);

#ifdef KPARITY_MUTANT_SKIP_LANE
    if (threadIdx.x == 1) return;  // mutant: thread 1's elements keep the NaN poison
#endif
    if (!in_bounds) return;
    for (int k = 0; k < 4; ++k) {
        const float wk = T::load(w, col + k) + weight_offset;
        T::store(residual_out, row + col + k, s[k]);
        T::store(normed_out, row + col + k, normed<T>(s[k], inv, wk));
    }
}
