// kparity's FP4 kernels (issue 31): NVFP4 (BLOCK 16, UE4M3 block scales) and MXFP4 (BLOCK 32,
// E8M0 block scales) weights as `fp4_quantize` stores them (oracle/fp4.py): codes [R, K/2] u8
// (element 2j in the low nibble of byte j), scales [R, K/BLOCK] u8, tensor_scale [1] f32.
//
// kp_fp4_dequantize<T, BLOCK>: x_hat = e2m1(q) * scale * tensor_scale. A thread per 4-byte word of
// codes (8 elements, all in one block since BLOCK >= 8 and K % BLOCK == 0: the flat element 8g
// is in the flat block 8g / BLOCK whatever the row), one 16-byte store of 8 elements (two for
// f32). The product is exact in double (q: 2 significant bits, a UE4M3 scale 4, tensor_scale
// 24; E8M0 a power of two), rounded once to f32 (cvt.rn, subnormals kept) and once to T: exact
// up to the final rounding (the oracle's bound: half an f32 ULP and half a T ULP).
//
// kp_fp4_gemv<T, BLOCK, MAXM>: y[m, n] = tensor_scale * sum_b scale[n, b] * sum_{k in b} q[n, k]
// x[m, k] for m < M <= MAXM (instances MAXM = 1 and 4). A block owns KPF_ROWS = 4 weight rows and
// 1..4 warps that split K in 16-byte chunks of 32 codes (thread t: chunks t, t + threads, ...;
// coalesced LDG.128), each chunk one MXFP4 block or two NVFP4 blocks; the next step's chunks and
// scale bytes (one 16-bit load of the two NVFP4 bytes, one byte for MXFP4) are loaded before the
// current step's math (kp_qgemv.cu's lesson: an unprefetched scale load stalls each step a full
// memory latency). x is read per half chunk (16 values of each of the M rows, 16-byte loads),
// shared by the 4 rows. Codes decode through a 16-entry f32 table in shared memory: a word's 8
// codes become byte offsets 4 * code in two words (even and odd nibbles: two shifts and two
// masks per 8 codes), each an LDS (16 distinct banks: conflict-free, equal codes broadcast).
// Per block, each lane sums q * x over the block's codes (two chains, f32 FMAs, the compiler's
// FTZ as the kernel model assumes), then acc = fma(scale, that sum, acc) in PTX without .ftz
// (an E8M0 scale 2^-127 is an f32 subnormal); the tensor scale multiplies the finished dot
// (without .ftz: gs_dec may be subnormal). These are the oracle's admissible forms
// (oracle/fp4_gemv.py: the per-block split, the tensor scale applied to the finished dot). The
// warps' sums meet in shared memory in warp order: deterministic. Rows past `out` load row 0 and
// store nothing; x rows m >= M are neither read nor written.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/fp4.py): K % BLOCK == 0 (dequantize); in % 32 == 0 and
// M <= 4 (GEMV); 16-byte aligned codes (GEMV) and x, 4-byte aligned codes (dequantize), 2-byte
// aligned NVFP4 scales (GEMV).
#include "common.cuh"
#include "fp4.cuh"

#define KPF_DQ_THREADS 256  // kp_fp4_dequantize's block
#define KPF_BLOCK 128       // kp_fp4_gemv's block at most (4 warps)
#define KPF_ROWS 4          // kp_fp4_gemv's weight rows per block

namespace kpf {

// The block scale (as a double) of a dequantized element.
template <int BLOCK>
__device__ __forceinline__ double scale_f64(unsigned b) {
    if constexpr (BLOCK == 16) return (double)kp_e4m3_f32(b);  // exact: a normal or 0 (or NaN)
    else return kp_e8m0_f64(b);
}

// The 8 E2M1 values of a word of codes (code n at bits 4n..4n+3) through the shared table `lut`.
__device__ __forceinline__ void decode_word(unsigned w, const float* lut, float* q) {
    const unsigned even = (w << 2) & 0x3C3C3C3Cu;  // byte b: 4 * code 2b, a byte offset in lut
    const unsigned odd = (w >> 2) & 0x3C3C3C3Cu;   // byte b: 4 * code 2b + 1
    const char* base = reinterpret_cast<const char*>(lut);
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        // byte b, zero-extended: one PRMT (a shift and a mask otherwise)
        q[2 * b] = *reinterpret_cast<const float*>(base + __byte_perm(even, 0u, 0x4440u + b));
        q[2 * b + 1] = *reinterpret_cast<const float*>(base + __byte_perm(odd, 0u, 0x4440u + b));
    }
}

}  // namespace kpf

template <typename T, int BLOCK>
__global__ void __launch_bounds__(KPF_DQ_THREADS)
kp_fp4_dequantize(const unsigned* __restrict__ codes, const unsigned char* __restrict__ scales,
                  const float* __restrict__ tensor_scale, typename T::storage* __restrict__ x_hat,
                  long long words) {
    static_assert(BLOCK == 16 || BLOCK == 32, "kp_fp4_dequantize: NVFP4 (16) or MXFP4 (32)");
    typedef Vec<T> V;
    const long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= words) return;
    const unsigned w = codes[g];
    // scale * tensor_scale: at most 4 x 24 significant bits (E8M0: a power of two), exact
    const double st = kpf::scale_f64<BLOCK>(scales[g * 8 / BLOCK])
                      * kp_f32_to_f64(tensor_scale[0]);
    float v[8];
#pragma unroll
    for (int n = 0; n < 8; ++n) v[n] = kp_f64_to_f32(kp_e2m1_f64((w >> (4 * n)) & 15u) * st);
    uint4* out = reinterpret_cast<uint4*>(x_hat) + g * (8 / V::N);
#pragma unroll
    for (int j = 0; j < 8 / V::N; ++j) {
        float f[V::N];
#pragma unroll
        for (int k = 0; k < V::N; ++k) f[k] = v[j * V::N + k];
        out[j] = V::pack(f);
    }
}

template <typename T, int BLOCK, int MAXM>
__global__ void __launch_bounds__(KPF_BLOCK)
kp_fp4_gemv(const uint4* __restrict__ codes, const unsigned char* __restrict__ scales,
            const float* __restrict__ tensor_scale, const typename T::storage* __restrict__ x,
            typename T::storage* __restrict__ y, int m_rows, int out_dim, int in_dim) {
    static_assert(BLOCK == 16 || BLOCK == 32, "kp_fp4_gemv: NVFP4 (16) or MXFP4 (32)");
    typedef Vec<T> V;
    constexpr int HALF = 16;              // codes per half chunk (8 bytes: one NVFP4 block)
    constexpr int XV = HALF / V::N;       // 16-byte vectors of x per half chunk and row of x
    constexpr int MAX_WARPS = KPF_BLOCK / 32;
    __shared__ float lut[16];
    __shared__ float partial[MAX_WARPS][KPF_ROWS][MAXM];
    const int t = threadIdx.x;
    const int threads = blockDim.x;  // 32 * warps, warps in 1..MAX_WARPS: they split K
    if (t < 16) lut[t] = kp_e2m1_f32((unsigned)t);
    __syncthreads();

    const int row0 = blockIdx.x * KPF_ROWS;
    const int chunks = in_dim / 32;
    // Chunk c of row r: codes[crow[r] + c]; its scale bits: NVFP4 the 16-bit pair (blocks 2c,
    // 2c + 1: K / 16 = 2 * chunks bytes a row) at the same index, MXFP4 the byte at it.
    size_t crow[KPF_ROWS];
#pragma unroll
    for (int r = 0; r < KPF_ROWS; ++r)
        crow[r] = (size_t)(row0 + r < out_dim ? row0 + r : 0) * chunks;
    auto scale_bits = [&](int r, int c) -> unsigned {
        if constexpr (BLOCK == 16)
            return reinterpret_cast<const unsigned short*>(scales)[crow[r] + c];
        else
            return scales[crow[r] + c];
    };

    float acc[KPF_ROWS][MAXM];
    uint4 next[KPF_ROWS];
    unsigned next_s[KPF_ROWS];
#pragma unroll
    for (int r = 0; r < KPF_ROWS; ++r) {
#pragma unroll
        for (int m = 0; m < MAXM; ++m) acc[r][m] = 0.0f;
        const bool any = t < chunks;
        next[r] = any ? codes[crow[r] + t] : make_uint4(0u, 0u, 0u, 0u);
        next_s[r] = any ? scale_bits(r, t) : 0u;
    }
    for (int c = t; c < chunks; c += threads) {
        uint4 cur[KPF_ROWS];
        unsigned cur_s[KPF_ROWS];
        const bool more = c + threads < chunks;
#pragma unroll
        for (int r = 0; r < KPF_ROWS; ++r) {
            cur[r] = next[r];
            cur_s[r] = next_s[r];
            if (more) {  // the next step's loads, in flight during this step's math
                next[r] = codes[crow[r] + c + threads];
                next_s[r] = scale_bits(r, c + threads);
            }
        }
        float block_dot[KPF_ROWS][MAXM];  // MXFP4: the block's sum over both halves
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float xf[MAXM][HALF];
#pragma unroll
            for (int m = 0; m < MAXM; ++m) {
                if (m >= m_rows) continue;
                const uint4* xv = reinterpret_cast<const uint4*>(x + (size_t)m * in_dim)
                                  + ((size_t)c * 32 + h * HALF) / V::N;
#pragma unroll
                for (int v = 0; v < XV; ++v) {
                    float f[V::N];
                    V::unpack(xv[v], f);
#pragma unroll
                    for (int k = 0; k < V::N; ++k) xf[m][v * V::N + k] = f[k];
                }
            }
#pragma unroll
            for (int r = 0; r < KPF_ROWS; ++r) {
                float q[HALF];
                kpf::decode_word(h ? cur[r].z : cur[r].x, lut, q);
                kpf::decode_word(h ? cur[r].w : cur[r].y, lut, q + 8);
#pragma unroll
                for (int m = 0; m < MAXM; ++m) {
                    if (m >= m_rows) continue;
                    float a0 = 0.0f, a1 = 0.0f;  // two chains: sum_k q x over the half
#pragma unroll
                    for (int k = 0; k < HALF; k += 2) {
                        a0 = fmaf(q[k], xf[m][k], a0);
                        a1 = fmaf(q[k + 1], xf[m][k + 1], a1);
                    }
                    const float d = a0 + a1;
                    if constexpr (BLOCK == 16) {  // each half is a block: its scale byte
                        acc[r][m] = kp_fma_rn(kp_e4m3_f32((cur_s[r] >> (8 * h)) & 0xFFu), d,
                                              acc[r][m]);
                    } else {
                        block_dot[r][m] = h ? block_dot[r][m] + d : d;
                    }
                }
            }
        }
        if constexpr (BLOCK == 32) {
#pragma unroll
            for (int r = 0; r < KPF_ROWS; ++r) {
                const float s = kp_e8m0_f32(cur_s[r]);
#pragma unroll
                for (int m = 0; m < MAXM; ++m)
                    if (m < m_rows) acc[r][m] = kp_fma_rn(s, block_dot[r][m], acc[r][m]);
            }
        }
    }
    // Each warp's partial per (row, x row) by butterfly, then the warps' in warp order.
#pragma unroll
    for (int r = 0; r < KPF_ROWS; ++r) {
#pragma unroll
        for (int m = 0; m < MAXM; ++m) {
            float v = acc[r][m];
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1)  // without .ftz: a lane's
                v = kp_add_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));  // partial may be
                                                                           // subnormal
            if ((t & 31) == 0) partial[t / 32][r][m] = v;
        }
    }
    __syncthreads();
    if (t < KPF_ROWS * MAXM) {
        const int r = t / MAXM, m = t % MAXM;
        if (row0 + r < out_dim && m < m_rows) {
            float v = partial[0][r][m];
            for (int j = 1; j < threads / 32; ++j) v = kp_add_rn(v, partial[j][r][m]);
            T::store(y, (size_t)m * out_dim + row0 + r, kp_mul_rn(v, tensor_scale[0]));
        }
    }
}
