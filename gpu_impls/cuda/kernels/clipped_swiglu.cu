// clipped_swiglu<T>: GPT-OSS's clipped SwiGLU (oracle/activations.py), one element per thread.
//
//   g   = min(gate, limit)                (both_sides: clip(gate, -limit, limit))
//   u   = clip(up, -limit, limit)
//   out = T(g * sigmoid(alpha * g) * (u + 1)),  sigmoid(z) = 1 / (1 + exp(-z))     f32
//
// The clamps are written as comparisons (`v > limit ? limit : v`), not fminf/fmaxf, which return
// the other operand for a NaN: a NaN input stays NaN, as in the oracle (np.minimum). +inf clamps
// to +limit; -inf in gate under the one-sided clamp gives -inf * 0 = NaN (exp(inf) = inf).
//
// DISPATCH INVARIANTS (the wrapper's geometry): block = 256 threads, grid = ceil(count / 256):
// thread i owns element i, count = rows * n (64-bit indices: any count memory can hold).
//
// Test-only mutant: KPARITY_MUTANT_SWIGLU_NO_CLAMP skips both clamps.
#include "common.cuh"

__device__ __forceinline__ float clamp_both(float v, float limit) {
    return v > limit ? limit : (v < -limit ? -limit : v);  // NaN: both false, v kept
}

template <typename T>
__global__ void clipped_swiglu(const typename T::storage* __restrict__ gate,
                               const typename T::storage* __restrict__ up,
                               typename T::storage* __restrict__ out, long long count,
                               float limit, float alpha, int gate_both_sides) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float g = T::load(gate, i), u = T::load(up, i);
#ifndef KPARITY_MUTANT_SWIGLU_NO_CLAMP
    g = gate_both_sides ? clamp_both(g, limit) : (g > limit ? limit : g);
    u = clamp_both(u, limit);
#endif
    const float sig = 1.0f / (1.0f + expf(-(g * alpha)));
    T::store(out, i, g * sig * (u + 1.0f));
}
