// Shared pieces of the quantized kernels (MLX affine layout): the dequantize step and the codes a
// row accumulates, each with its test-only mutant (compiled in with -D by tests/mutants.py):
// KPARITY_MUTANT_DROP_BIAS (w = q * s), KPARITY_MUTANT_SKIP_LAST_GROUP (a row's last group is
// never accumulated).
#pragma once

namespace quant {

__device__ __forceinline__ float dequant(float q, float s, float b) {
#ifdef KPARITY_MUTANT_DROP_BIAS
    return q * s;
#else
    return q * s + b;
#endif
}

// Codes a row accumulates: all of them, or (mutant) all but the last group.
__device__ __forceinline__ int codes_used(int in_dim, int group_size) {
#ifdef KPARITY_MUTANT_SKIP_LAST_GROUP
    return in_dim - group_size;
#else
    return in_dim;
#endif
}

}  // namespace quant
