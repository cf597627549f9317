// mt_rms_norm_small<T>: RMSNorm of one row per block, 2 consecutive elements per thread.
//
// Ported from metaltile-std `mt_rms_norm_small` (crates/metaltile-std/src/mlx/rms_norm.rs): the
// small-head_dim variant, so that head_dim = 64 still fills one full warp (TPG = 32).
//
//   inv    = rsqrt(sum_i x_i^2 / n + eps)                  (f32)
//   out_i  = T(x_i * inv * (w_i + weight_offset))           (f32, one rounding at the store)
//
// DISPATCH INVARIANTS (the seed's; checked by the wrapper's contract before any launch):
//   - n = TPG * 2: thread t owns elements 2t, 2t+1 of its row; the wrapper derives TPG = n / 2.
//   - TPG >= 32 (n >= 64) and TPG a multiple of 32: the reduction combines whole warps.
//   - TPG <= 1024 (the per-block thread limit), so n <= 2048.
//   - Combined: n % 64 == 0 and 64 <= n <= 2048.
//   - Grid: one block per row.
// Unlike mt_rms_norm, the seed has no out-of-bounds clamp here: the contract is the only guard.
#include "common.cuh"
#include "rms_math.cuh"

template <typename T>
__global__ void mt_rms_norm_small(const typename T::storage* __restrict__ x,
                                  const typename T::storage* __restrict__ w,
                                  typename T::storage* __restrict__ out,
                                  float eps, float weight_offset, int n) {
    const size_t row = (size_t)blockIdx.x * n;
    const int col = threadIdx.x * 2;

    const float x0 = T::load(x, row + col);
    const float x1 = T::load(x, row + col + 1);
    const float inv = rms_inv(block_sum(x0 * x0 + x1 * x1), n, eps);

#ifdef KPARITY_MUTANT_SKIP_LANE
    if (threadIdx.x == 1) return;  // mutant: thread 1's elements keep the NaN poison
#endif
    T::store(out, row + col, normed<T>(x0, inv, T::load(w, col) + weight_offset));
    T::store(out, row + col + 1, normed<T>(x1, inv, T::load(w, col + 1) + weight_offset));
}
