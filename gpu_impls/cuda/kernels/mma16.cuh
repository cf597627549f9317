// The m16n8k16 tensor-core product and the 16-bit pair load shared by the mma.sync kernels
// (gdn_chunk_o.cu, kp_moe_gemm.cu), in namespace kp_mma16: each kernel's namespace takes them
// with `using`.
#pragma once
#include "common.cuh"

namespace kp_mma16 {

template <typename T> constexpr bool IS_BF16 = false;
template <> constexpr bool IS_BF16<BF16> = true;

// c += A (16 x 16, T) B (16 x 8, T), f32 accumulation.
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                    unsigned b1) {
    if constexpr (IS_BF16<T>)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two consecutive 16-bit elements (p[0] low, p[1] high) as one 32-bit load; p is 4-byte
// aligned (an even element offset from a 256-byte aligned buffer).
__device__ __forceinline__ unsigned pair(const unsigned short* p) {
    return *reinterpret_cast<const unsigned*>(p);
}

}  // namespace kp_mma16
