// FloatVec<W>: W consecutive floats (1, 2 or 4) as one load or store, shared by the state
// kernels that read a state row in the widest vector dividing a lane's share (gdn_step.cu,
// ssm_step.cu), in namespace kp_floatvec: each kernel's namespace takes it with `using`.
#pragma once

namespace kp_floatvec {

template <int W> struct FloatVec;
template <> struct FloatVec<1> {
    static __device__ __forceinline__ void load(const float* p, float* f) { f[0] = p[0]; }
    static __device__ __forceinline__ void store(float* p, const float* f) { p[0] = f[0]; }
};
template <> struct FloatVec<2> {
    static __device__ __forceinline__ void load(const float* p, float* f) {
        const float2 v = *reinterpret_cast<const float2*>(p);
        f[0] = v.x, f[1] = v.y;
    }
    static __device__ __forceinline__ void store(float* p, const float* f) {
        *reinterpret_cast<float2*>(p) = make_float2(f[0], f[1]);
    }
};
template <> struct FloatVec<4> {
    static __device__ __forceinline__ void load(const float* p, float* f) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
    }
    static __device__ __forceinline__ void store(float* p, const float* f) {
        *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
    }
};

}  // namespace kp_floatvec
