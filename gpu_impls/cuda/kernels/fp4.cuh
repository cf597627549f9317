// FP4 pieces shared by kp_fp4.cu (dequantize, GEMV) and kp_fp4_quantize.cu: the E2M1 code
// values, the block scales (UE4M3 for NVFP4, E8M0 for MXFP4) and f32 arithmetic that keeps
// subnormals (oracle/fp4.py states the formats).
//
// CuPy compiles every kernel with -ftz=true (gpu_impls/cuda/backend.py): compiler-generated f32
// arithmetic reads subnormal operands as 0 and flushes subnormal results. Where an FP4 result
// depends on an f32 subnormal the oracle keeps, the operation is written in PTX without .ftz:
// a tensor scale gs_dec = 1 / gs_enc is subnormal when amax(|X|) < 7.9e-36 (gs_enc clamped to
// FLT_MAX), the E8M0 scale byte 0 is 2^-127, and the quantizer's f32 steps must be bit-exact
// against IEEE f32 NumPy on every input (subnormal x included).
#pragma once

// --- f32 / f64 arithmetic without flush-to-zero -------------------------------------------------

__device__ __forceinline__ float kp_mul_rn(float a, float b) {
    float d;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

__device__ __forceinline__ float kp_div_rn(float a, float b) {
    float d;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));  // IEEE, correctly rounded
    return d;
}

__device__ __forceinline__ float kp_fma_rn(float a, float b, float c) {
    float d;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
    return d;
}

__device__ __forceinline__ float kp_add_rn(float a, float b) {
    float d;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));  // subnormal a, b, d kept
    return d;
}

__device__ __forceinline__ double kp_f32_to_f64(float a) {
    double d;
    asm("cvt.f64.f32 %0, %1;" : "=d"(d) : "f"(a));  // exact, subnormal a included
    return d;
}

__device__ __forceinline__ float kp_f64_to_f32(double a) {
    float d;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(d) : "d"(a));  // one RNE rounding, subnormals kept
    return d;
}

// --- E2M1 codes ---------------------------------------------------------------------------------
// code = sign << 3 | i, magnitude index i in 0..7: {0, 0.5, 1, 1.5, 2, 3, 4, 6}. For i >= 2 the
// value is 2^((i >> 1) - 1) (1 + (i & 1) / 2): the index's two high bits are the exponent and its
// low bit the mantissa's top bit, so i << 22 added to the bits of 0.5 (0x3F000000) is the value
// (i = 2: 0x3F800000 = 1, i = 7: 0x40C00000 = 6). i = 1 (0.5) and i = 0 (0) are E2M1's
// subnormal and zero, spelled out. Code 8 is -0.

__device__ __forceinline__ float kp_e2m1_f32(unsigned code) {
    const unsigned i = code & 7u;
    const unsigned mag = i >= 2u ? 0x3F000000u + (i << 22) : (i ? 0x3F000000u : 0u);
    return __uint_as_float(mag | ((code & 8u) << 28));
}

// The same value as a double (its bits built the same way, 0.5 = 0x3FE0000000000000).
__device__ __forceinline__ double kp_e2m1_f64(unsigned code) {
    const unsigned long long i = code & 7u;
    const unsigned long long mag = i >= 2u ? 0x3FE0000000000000ull + (i << 51)
                                           : (i ? 0x3FE0000000000000ull : 0ull);
    return __longlong_as_double((long long)(mag | ((unsigned long long)(code & 8u) << 60)));
}

// --- block scales -------------------------------------------------------------------------------

// float8_e4m3fn bits -> f32, exact: s eeee mmm, bias 7, 2^(e - 7) (1 + m / 8) for e >= 1 (the f32
// exponent e + 120, the mantissa's top 3 bits m), m 2^-9 for e = 0; 0x7F / 0xFF are its NaNs
// (no infinities). Every value is an f32 normal (>= 2^-9) or 0.
__device__ __forceinline__ float kp_e4m3_f32(unsigned b) {
    const unsigned e = (b >> 3) & 15u, m = b & 7u;
    float mag = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
    if ((b & 0x7Fu) == 0x7Fu) mag = __uint_as_float(0x7FC00000u);
    return (b & 0x80u) ? -mag : mag;
}

// E8M0 byte e -> 2^(e - 127) as f32: the biased exponent itself for e >= 1, 2^-127 (an f32
// subnormal: use it in kp_*_rn arithmetic) for e = 0; e = 255 is E8M0's NaN (OCP MX v1.0, as
// the oracle: fp4_quantize never writes it), and e << 23 = 0x7F800000 (inf) with the quiet bit
// set is NaN.
__device__ __forceinline__ float kp_e8m0_f32(unsigned e) {
    return __uint_as_float(e ? (e << 23) | (e == 255u ? 0x00400000u : 0u) : 0x00400000u);
}

// E8M0 byte e -> 2^(e - 127) as a double, exact for every byte but 255 (NaN, as the oracle).
__device__ __forceinline__ double kp_e8m0_f64(unsigned e) {
    return e == 255u ? __longlong_as_double(0x7FF8000000000000LL)
                     : __longlong_as_double((long long)((unsigned long long)(e + 896u) << 52));
}
