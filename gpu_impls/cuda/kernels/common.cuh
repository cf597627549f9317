// Shared pieces of kparity's CUDA kernels: storage traits, the block-wide sum, the RMS math.
//
// Self-contained on purpose: no cuda_fp16.h / cuda_bf16.h, so NVRTC needs no CUDA include path
// (only -I for this directory). f16 and bf16 cross the host boundary as raw uint16 bits and are
// converted here with PTX `cvt`; every kernel computes in f32 and rounds to T once, at the store.
//
// The RMS math (and its test-only mutation hooks) is in rms_math.cuh, included by the norm kernels
// only: a header's mutant defines make nvcc_check compile every includer once more per define.
#pragma once

// --- storage traits: T::load(p, i) -> float, T::store(p, i, float) rounds to T (RNE) ----------

struct F32 {
    typedef float storage;
    static __device__ __forceinline__ float load(const float* p, size_t i) { return p[i]; }
    static __device__ __forceinline__ void store(float* p, size_t i, float v) { p[i] = v; }
    static __device__ __forceinline__ float round(float v) { return v; }
};

struct F16 {
    typedef unsigned short storage;  // IEEE binary16 bits
    static __device__ __forceinline__ float to_f32(unsigned short h) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));  // exact widening
        return f;
    }
    static __device__ __forceinline__ unsigned short from_f32(float f) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));  // round to nearest even
        return h;
    }
    static __device__ __forceinline__ float load(const storage* p, size_t i) {
        return to_f32(p[i]);
    }
    static __device__ __forceinline__ void store(storage* p, size_t i, float v) {
        p[i] = from_f32(v);
    }
    static __device__ __forceinline__ float round(float v) { return to_f32(from_f32(v)); }
};

struct BF16 {
    typedef unsigned short storage;  // bfloat16 bits: the top half of an f32
    static __device__ __forceinline__ float to_f32(unsigned short b) {
        return __uint_as_float((unsigned)b << 16);  // exact widening
    }
    static __device__ __forceinline__ unsigned short from_f32(float f) {
        unsigned short b;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));  // round to nearest even; sm_80+
        return b;
    }
    static __device__ __forceinline__ float load(const storage* p, size_t i) {
        return to_f32(p[i]);
    }
    static __device__ __forceinline__ void store(storage* p, size_t i, float v) {
        p[i] = from_f32(v);
    }
    static __device__ __forceinline__ float round(float v) { return to_f32(from_f32(v)); }
};

// --- 16-byte vectors: N elements of T, widened to f32 and packed back -------------------------

template <typename T>
struct Vec {
    typedef typename T::storage storage;
    static constexpr bool WIDE = sizeof(storage) == 4;    // f32: one element per 32-bit word
    static constexpr int N = 16 / sizeof(storage);        // elements per 16-byte vector

    // The N elements of a 16-byte vector, widened to f32 (exact); element 2k is the low half of
    // word k for 16-bit T (little-endian, as in memory).
    static __device__ __forceinline__ void unpack(const uint4 v, float (&f)[N]) {
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if constexpr (WIDE) {
                f[k] = __uint_as_float(w[k]);
            } else {
                f[2 * k] = T::to_f32((unsigned short)(w[k] & 0xffffu));
                f[2 * k + 1] = T::to_f32((unsigned short)(w[k] >> 16));
            }
        }
    }

    // N f32 values rounded to T (RNE, the trait's store rounding) and packed into 16 bytes.
    static __device__ __forceinline__ uint4 pack(const float (&f)[N]) {
        unsigned w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if constexpr (WIDE) {
                w[k] = __float_as_uint(f[k]);
            } else {
                w[k] = (unsigned)T::from_f32(f[2 * k])
                       | ((unsigned)T::from_f32(f[2 * k + 1]) << 16);
            }
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};

// --- block-wide sum ------------------------------------------------------------------------------

// Sum of `v` over the block, returned to every thread. Requires blockDim.x a multiple of 32 (the
// contracts check it): the full-mask shuffle needs all 32 lanes, and a trailing partial warp
// would not be counted. Warps reduce by butterfly, lane 0 of each parks its partial in shared
// memory, then every thread adds the partials in the same order, so all threads hold the same
// bits (the broadcast) and the result is deterministic run to run.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];  // one slot per warp: at most 1024 / 32
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    const int n_warps = blockDim.x / 32;
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.0f;
    for (int i = 0; i < n_warps; ++i) total += partial[i];
    __syncthreads();  // the slots may be reused by a later call only once everyone has read them
    return total;
}

// --- RMS math -----------------------------------------------------------------------------------
// A kernel launched with pdl=True (gpu_impls/cuda/_module.py `launch`) may start while the kernel
// before it in the stream is still running. `pdl_launch_dependents` lets the next kernel's
// blocks be scheduled once every block of this one has run it (or exited); `pdl_wait` returns
// once the kernels before this one have completed and their writes are visible, so it must come
// before the first load of anything another kernel may write and before the first store. Both
// are no-ops in an ordinary launch, so such a kernel is correct launched either way.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
