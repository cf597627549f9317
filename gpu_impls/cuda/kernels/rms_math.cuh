// The RMS math of the norm kernels (split from common.cuh: only the norm kernels include it).
//
// Test-only mutation hooks (compiled in only by the mutants, `-DKPARITY_MUTANT_...`): the two that
// change the math live here, in `rms_inv` and `normed`, so every norm kernel gets them from one
// place; KPARITY_MUTANT_SKIP_LANE is placed in each kernel, right before its stores.
#pragma once

#include "common.cuh"

// --- RMS math ------------------------------------------------------------------------------------

// inv = rsqrt(ssq / n + eps): the seed's `rsqrt(tg_ssq / n + eps)`, in f32.
__device__ __forceinline__ float rms_inv(float ssq, int n, float eps) {
#ifdef KPARITY_MUTANT_DROP_EPS
    eps = 0.0f;  // mutant: eps not added (all-zero rows give inf * 0 = NaN)
#endif
    return rsqrtf(ssq / (float)n + eps);
}

// The normalised, weighted value x * inv * w in f32, w already (weight + weight_offset). The seed's
// order: x * inv first, then * w, with no rounding in between.
template <typename T>
__device__ __forceinline__ float normed(float x, float inv, float w) {
#ifdef KPARITY_MUTANT_ROUND_BEFORE_WEIGHT
    return T::round(x * inv) * w;  // mutant: HF-Llama's w * T(x * inv), rounded twice
#else
    return x * inv * w;
#endif
}

