// mt_gated_mixer_norm<T>: RMSNorm of an f32 row, weighted, times silu of a gate; one row per block.
//
// Ported from metaltile-std `mt_gated_mixer_norm` (crates/metaltile-std/src/mlx/rms_norm.rs): the
// Qwen3.5/3.6 GDN mixer's output norm. y is the recurrence output, kept in f32; z (the gate) and
// w are in T.
//
//   inv      = rsqrt(sum_i y_i^2 / n + eps)                (f32, from the f32 y)
//   silu(z)  = z / (1 + exp(-z))
//   out_i    = T((y_i * inv * (w_i + weight_offset)) * silu(z_i))    (one rounding at the store)
//
// DISPATCH INVARIANTS (the seed's: as mt_rms_norm; checked by the wrapper's contract):
//   - n = TPG * 4: thread t owns elements 4t .. 4t+3 of its row; the wrapper derives TPG = n / 4.
//   - TPG a multiple of 32 (and at least 32): the reduction combines whole warps.
//   - TPG <= 1024 (the per-block thread limit), so n <= 4096.
//   - Combined: n % 128 == 0 and 128 <= n <= 4096.
//   - Grid: one block per row.
// Belt and braces, as in the seed: a thread whose 4 elements are not all in the row re-reads the
// row start, contributes 0 to the sum and stores nothing.
#include "common.cuh"
#include "rms_math.cuh"

template <typename T>
__global__ void mt_gated_mixer_norm(const float* __restrict__ y,
                                    const typename T::storage* __restrict__ z,
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
        v[k] = y[row + safe_col + k];
        ssq += v[k] * v[k];
    }
    const float inv = rms_inv(block_sum(in_bounds ? ssq : 0.0f), n, eps);

#ifdef KPARITY_MUTANT_SKIP_LANE
    if (threadIdx.x == 1) return;  // mutant: thread 1's elements keep the NaN poison
#endif
    if (!in_bounds) return;
    for (int k = 0; k < 4; ++k) {
        const float zk = T::load(z, row + col + k);
        const float silu = zk / (1.0f + expf(-zk));  // exp overflow to inf gives silu = -0: fine
        const float wk = T::load(w, col + k) + weight_offset;
        T::store(out, row + col + k, normed<T>(v[k], inv, wk) * silu);
    }
}
