// softcap<T>: Gemma 2's logit soft-capping, out_i = T(cap * tanhf(x_i / cap)), one element per
// thread, f32 inside, one rounding at the store.
//
// DISPATCH INVARIANTS (the wrapper's geometry): block = 256 threads, grid = ceil(count / 256):
// thread i owns element i, count = rows * n (64-bit indices: any count memory can hold).
#include "common.cuh"

template <typename T>
__global__ void softcap(const typename T::storage* __restrict__ x,
                        typename T::storage* __restrict__ out, long long count, float cap) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    T::store(out, i, cap * tanhf(T::load(x, i) / cap));
}
