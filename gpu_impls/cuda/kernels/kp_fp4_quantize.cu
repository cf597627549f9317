// kparity's FP4 quantizer (issue 31): x [R, K] (T) -> codes [R, K/2] u8 (element 2j in the low
// nibble), scales [R, K/BLOCK] u8, tensor_scale [1] f32, bit for bit as oracle/fp4.py's rules
// with E2M1 round-to-nearest-even (RULE 0: NVFP4 "exact", vLLM's ref_nvfp4_quant; RULE 1: MXFP4
// "ocp"; RULE 2: MXFP4 "ceil"). The "mlx" rules (nearest-low E2M1, and for NVFP4 a T rounding
// of vmax / 6) are not implemented: the contract refuses them.
//
// kp_fp4_amax<T>: amax(|X|) of the whole tensor as f32 bits into *amax_bits (zeroed by the
// launcher): |x| of a finite f32 orders as its bits, so an unsigned max (per lane, a warp
// max, one atomicMax a warp) is the exact max in any order (deterministic). NVFP4 only.
//
// kp_fp4_quantize<T, RULE>: a thread per block of BLOCK elements (16-byte vector loads, the
// BLOCK / 2 code bytes as one 8- or 16-byte store, the scale byte). Every f32 step is the
// oracle's, in PTX without .ftz (fp4.cuh: x and the scales may be f32 subnormals):
//   NVFP4  gs_enc = amax == 0 ? 1 : min(RN(2688 / amax), FLT_MAX); gs_dec = RN(1 / gs_enc)
//          s = RN(gs_enc * RN(vmax * RN(1/6))); sf = e4m3(min(s, 448)) RNE (cvt.rn.satfinite)
//          enc = sf == 0 ? 0 : RN(1 / RN(sf * gs_dec)); v = RN(x * enc)
//   MXFP4  e = floor(log2 amax) - 2 ("ocp") or ceil(log2 RN(amax / 6)) ("ceil"), from the bits
//          (exact, subnormals included), clamped to [-127, 127], -127 for an all-zero block;
//          v = x * 2^-e in double (exact)
// then E2M1 RNE of v by its thresholds (the ties 0.25, 1.25, 2.5, 5 go down to the even code,
// 0.75, 1.75, 3.5 up; |v| > 5 saturates to 6), the sign kept where |v| rounds to 0 (-0.1 ->
// 0x8), as the oracle's "rne". The tensor scale: gs_dec (NVFP4) or 1 (MXFP4), written by thread 0.
// One corner differs from the oracle on x86: an NVFP4 block whose enc overflows to inf (only when
// gs_enc is clamped, amax < 7.9e-36, and sf * gs_dec < 2^-128) turns an x = 0 into 0 * inf = NaN,
// the canonical NaN here (code 0) where x86 NumPy's default NaN is negative (code 0x8).
//
// Test-only mutants (tests/mutants.py FP4_CUDA_MUTANTS): KPARITY_MUTANT_FP4_TIES_AWAY (E2M1 ties
// half away from zero), KPARITY_MUTANT_FP4_UNSCALED_BLOCK_MAX (the NVFP4 block scale from the
// block max without gs_enc; the elements still x * enc).
//
// DISPATCH INVARIANTS (gpu_impls/cuda/fp4.py): K % BLOCK == 0; RULE in (exact, ocp, ceil);
// 16-byte aligned x, 8-byte (NVFP4) or 16-byte (MXFP4) aligned codes.
#include "common.cuh"
#include "fp4.cuh"

#define KPF_AMAX_THREADS 256
#define KPF_Q_THREADS 128

namespace kpfq {

__device__ __forceinline__ unsigned umax(unsigned a, unsigned b) { return a > b ? a : b; }

// E2M1 code of a scaled value v, ties to the even code (module comment); |v| > 6 saturates.
__device__ __forceinline__ unsigned e2m1_rne(float v) {
    const float a = __uint_as_float(__float_as_uint(v) & 0x7FFFFFFFu);  // |v|, no arithmetic
#ifdef KPARITY_MUTANT_FP4_TIES_AWAY
    const unsigned mag = (a >= 0.25f) + (a >= 0.75f) + (a >= 1.25f) + (a >= 1.75f) + (a >= 2.5f)
                         + (a >= 3.5f) + (a >= 5.0f);
#else
    const unsigned mag = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f)
                         + (a >= 3.5f) + (a > 5.0f);
#endif
    return mag | ((__float_as_uint(v) >> 28) & 8u);
}

// The same for a double v (MXFP4's exact x * 2^-e; the thresholds are exact in both).
__device__ __forceinline__ unsigned e2m1_rne(double v) {
    const double a = __longlong_as_double(__double_as_longlong(v) & 0x7FFFFFFFFFFFFFFFll);
#ifdef KPARITY_MUTANT_FP4_TIES_AWAY
    const unsigned mag = (a >= 0.25) + (a >= 0.75) + (a >= 1.25) + (a >= 1.75) + (a >= 2.5)
                         + (a >= 3.5) + (a >= 5.0);
#else
    const unsigned mag = (a > 0.25) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5)
                         + (a >= 3.5) + (a > 5.0);
#endif
    return mag | ((unsigned)((unsigned long long)__double_as_longlong(v) >> 60) & 8u);
}

// floor(log2 a) of a positive finite f32 from its bits (a subnormal: its highest set bit).
__device__ __forceinline__ int floor_log2(unsigned bits) {
    const int e = (int)(bits >> 23);
    return e ? e - 127 : (31 - __clz(bits & 0x7FFFFFu)) - 149;
}

// The unbiased E8M0 exponent of a block with amax bits `abits` (oracle/fp4.py mx_exponent).
template <int RULE>
__device__ __forceinline__ int mx_exponent(unsigned abits) {
    if (abits == 0u) return -127;  // an all-zero block
    int e;
    if constexpr (RULE == 1) {  // "ocp": floor(log2 amax) - emax(E2M1)
        e = floor_log2(abits) - 2;
    } else {  // "ceil": ceil(log2 y), y = RN(amax / 6); frexp(0) gives exponent 0
        const unsigned y = __float_as_uint(kp_div_rn(__uint_as_float(abits), 6.0f));
        if (y == 0u) return 0;  // amax <= 3 * 2^-149: y rounds to 0, and the oracle's e is 0
        const int fl = floor_log2(y);
        const bool power_of_two = (y >> 23) ? (y & 0x7FFFFFu) == 0u : (y & (y - 1u)) == 0u;
        e = power_of_two ? fl : fl + 1;
    }
    return e < -127 ? -127 : (e > 127 ? 127 : e);
}

// e4m3(s) RNE for s >= 0 (s <= 448 after the clamp): the low byte of cvt's pair.
__device__ __forceinline__ unsigned e4m3_rn(float s) {
    unsigned short pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(s));
    return pair & 0xFFu;
}

}  // namespace kpfq

template <typename T>
__global__ void __launch_bounds__(KPF_AMAX_THREADS)
kp_fp4_amax(const typename T::storage* __restrict__ x, unsigned* __restrict__ amax_bits,
            long long vectors) {
    typedef Vec<T> V;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    unsigned m = 0u;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < vectors;
         i += (long long)gridDim.x * blockDim.x) {
        float f[V::N];
        V::unpack(xv[i], f);  // exact widening: no arithmetic, subnormals kept
#pragma unroll
        for (int k = 0; k < V::N; ++k) m = kpfq::umax(m, __float_as_uint(f[k]) & 0x7FFFFFFFu);
    }
    m = __reduce_max_sync(0xffffffffu, m);
    if ((threadIdx.x & 31) == 0 && m) atomicMax(amax_bits, m);
}

template <typename T, int RULE>
__global__ void __launch_bounds__(KPF_Q_THREADS)
kp_fp4_quantize(const typename T::storage* __restrict__ x, const unsigned* __restrict__ amax_bits,
                unsigned char* __restrict__ codes, unsigned char* __restrict__ scales,
                float* __restrict__ tensor_scale, long long blocks) {
    static_assert(RULE >= 0 && RULE <= 2, "kp_fp4_quantize: 0 nvfp4 exact, 1 mxfp4 ocp, 2 ceil");
    typedef Vec<T> V;
    constexpr int BLOCK = RULE == 0 ? 16 : 32;
    constexpr float MAX_F32 = 3.40282346638528859812e+38f;
    const long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;

    float gs_enc = 1.0f, gs_dec = 1.0f;
    if constexpr (RULE == 0) {
        const unsigned abits = *amax_bits;
        if (abits) {
            gs_enc = kp_div_rn(2688.0f, __uint_as_float(abits));  // inf past FLT_MAX: clamped
            if (gs_enc > MAX_F32) gs_enc = MAX_F32;
        }
        gs_dec = kp_div_rn(1.0f, gs_enc);
    }
    if (b == 0) tensor_scale[0] = gs_dec;
    if (b >= blocks) return;

    float xf[BLOCK];
    const uint4* xv = reinterpret_cast<const uint4*>(x) + b * (BLOCK / V::N);
#pragma unroll
    for (int v = 0; v < BLOCK / V::N; ++v) {
        float f[V::N];
        V::unpack(xv[v], f);
#pragma unroll
        for (int k = 0; k < V::N; ++k) xf[v * V::N + k] = f[k];
    }
    unsigned vmax = 0u;  // |x| max as bits (exact, no arithmetic)
#pragma unroll
    for (int k = 0; k < BLOCK; ++k) vmax = kpfq::umax(vmax, __float_as_uint(xf[k]) & 0x7FFFFFFFu);

    unsigned q[BLOCK];
    unsigned scale_byte;
    if constexpr (RULE == 0) {
        const float sixth = __uint_as_float(0x3E2AAAABu);  // RN(1/6), as NumPy's F32(1) / F32(6)
#ifdef KPARITY_MUTANT_FP4_UNSCALED_BLOCK_MAX
        float s = kp_mul_rn(__uint_as_float(vmax), sixth);
#else
        float s = kp_mul_rn(gs_enc, kp_mul_rn(__uint_as_float(vmax), sixth));
#endif
        if (s > 448.0f) s = 448.0f;  // s >= 0; a subnormal s stays (e4m3 makes it 0)
        scale_byte = kpfq::e4m3_rn(s);
        const float enc = scale_byte ? kp_div_rn(1.0f, kp_mul_rn(kp_e4m3_f32(scale_byte), gs_dec))
                                     : 0.0f;
#pragma unroll
        for (int k = 0; k < BLOCK; ++k) q[k] = kpfq::e2m1_rne(kp_mul_rn(xf[k], enc));
    } else {
        const int e = kpfq::mx_exponent<RULE>(vmax);
        scale_byte = (unsigned)(e + 127);
        const double inv = __longlong_as_double((long long)((unsigned long long)(1023 - e) << 52));
#pragma unroll
        for (int k = 0; k < BLOCK; ++k) q[k] = kpfq::e2m1_rne(kp_f32_to_f64(xf[k]) * inv);
    }
    unsigned words[BLOCK / 8];
#pragma unroll
    for (int j = 0; j < BLOCK / 8; ++j) {
        words[j] = 0u;
#pragma unroll
        for (int n = 0; n < 8; ++n) words[j] |= q[8 * j + n] << (4 * n);
    }
    if constexpr (BLOCK == 16)
        reinterpret_cast<uint2*>(codes)[b] = make_uint2(words[0], words[1]);
    else
        reinterpret_cast<uint4*>(codes)[b] = make_uint4(words[0], words[1], words[2], words[3]);
    scales[b] = (unsigned char)scale_byte;
}
