// silu_mul<T>: SwiGLU's gate, out_i = T(silu(gate_i) * up_i), one element per thread.
//
//   silu(g) = g / (1 + exp(-g))      (f32; exp overflow for g < -88 gives 1 + inf = inf, silu = -0)
//
// DISPATCH INVARIANTS (the wrapper's geometry): block = 256 threads, grid = ceil(count / 256):
// thread i owns element i, count = rows * n (64-bit indices: any count memory can hold).
#include "common.cuh"

template <typename T>
__global__ void silu_mul(const typename T::storage* __restrict__ gate,
                         const typename T::storage* __restrict__ up,
                         typename T::storage* __restrict__ out, long long count) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const float g = T::load(gate, i);
    T::store(out, i, g / (1.0f + expf(-g)) * T::load(up, i));
}
