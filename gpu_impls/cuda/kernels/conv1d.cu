// kp_conv1d_causal_step<T, W>, kp_conv1d_causal<T, W>: kparity's Mamba-2 causal depthwise conv1d
// (ops `conv1d_causal_step` and `conv1d_causal`, oracle/conv1d.py), channels last, width W
// (an instance per W in 2..KP_CONV_MAX_W). With xx = cat(state, x) along the tokens (the state
// the W-1 previous raw inputs, oldest first) and w[W-1] multiplying the current token:
//
//   y_t        = bias + sum_j w[j] xx[t + j]     f32 (bias where use_bias), then
//                silu(y) = y / (1 + exp(-y))      where silu; rounded to T once, at the store
//   state out  = the last W-1 rows of xx         raw copies of the stored bits (no f32 round
//                                                trip: NaN payloads and, under -ftz, subnormals
//                                                kept), oldest first
//
// One thread per chunk of VEC = 16 / sizeof(T) consecutive channels (8 in f16/bf16, 4 in f32):
// every row it touches (x, y, the state, each weight row, the bias) is one 16-byte vector where
// `vec` (the wrapper's: D % VEC == 0 and every pointer 16-byte aligned), else VEC element loads
// guarded by c < D (the partial chunk past the last multiple of VEC, at any D).
//
// kp_conv1d_causal_step: one token per batch row, the state shifted by one:
//   state_out[k] = state_in[k + 1] (k < W-2), state_out[W-2] = x. Thread (b, chunk), flat grid.
// kp_conv1d_causal: the prefill over T tokens. A block takes KP_CONV_THREADS chunks of one
//   batch row over one span of span_len tokens [t0, t1); each thread starts from the W-1 rows
//   of xx before t0 (the halo: the initial state's rows where t0 < W-1, else x's), walks its
//   tokens with the W-1 previous inputs in registers (the seed's `_silu_cast_many`), KP_CONV_AHEAD
//   tokens' loads issued before their outputs, and the block of the last span writes the
//   final state from its registers. T = 0: one span of no tokens, which copies the state.
//   state_out must not alias state_in here (the last span's block writes it while the first
//   span's reads the halo): a plain output, as the op declares.
//   Flat grid: blockIdx.x = (b spans + span) chunk_blocks + chunk_block.
//
// Numerics: f32; the sum in the order bias, w[0] xx[t], ..., w[W-1] xx[t+W-1] (the contract
// admits any; adds may contract to FMAs, fewer roundings than the bound charges); expf is
// CUDA's (2 ULPs), the divide IEEE (-prec-div; the bound charges 2 ULPs); CuPy adds -ftz.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/ssm.py checks them before any launch): 2 <= W <=
// KP_CONV_MAX_W (the instances; W >= 2 is the op's domain). Block KP_CONV_THREADS threads.
//
// Test-only mutants: KPARITY_MUTANT_CONV_DOUBLE_SHIFT (the step): the shift runs twice before x
// is written, [s0, s1, s2] -> [s2, s2, x] (FFAI's Nemotron decode bug; y is formed before the
// shift, and from a zero state or at W <= 3 the state is the right one).
// KPARITY_MUTANT_CONV_STATE_SKIPS_LAST (the prefill): the final state is the window before the
// last token, xx[T-1 .. T+W-3], where T > 1 (one token is the decode step's path, right).
#include "common.cuh"

#define KP_CONV_MAX_W 4      // the instances: W in 2..4 (causal-conv1d's widths)
#define KP_CONV_THREADS 64   // threads per block of the prefill
#define KP_CONV_STEP_MAX_THREADS 256  // the step: 64 or 256 threads a block (the wrapper's choice)
#ifndef KP_CONV_MIN_BLOCKS
// __launch_bounds__' blocks per SM for the prefill: 8 caps it at 128 registers (120 used, no
// spills, ptxas sm_90), 16 warps an SM instead of the 12 that 158 registers left
#define KP_CONV_MIN_BLOCKS 8
#endif
#ifndef KP_CONV_FAST_SILU
// diagnostic (scripts/kp_conv_variants.py): is the prefill bound by silu's instructions? 1
// forms silu as y * rcp.approx.ftz(1 + expf(-y)), a 1-ULP reciprocal and a product instead of
// the IEEE divide (within the op's bound: the divide at 2 ULP, then the product); 2 also takes
// __expf at 16-bit T, whose error grows with |y| (not declared: bench it with --no-verify).
#define KP_CONV_FAST_SILU 0
#endif
#ifndef KP_CONV_AHEAD
#define KP_CONV_AHEAD 4      // prefill: tokens whose x loads are issued together (8: 32 more
#endif                       // registers and slower on an H100, scripts/kp_conv_variants.py)

namespace kp_conv_detail {

// A chunk's VEC elements of T, as 16 raw bytes (element e in word e / (4 / sizeof), low half
// first: little-endian, as in memory and as Vec<T>::unpack reads them).
template <typename T>
struct Chunk {
    typedef typename T::storage S;
    static constexpr int N = 16 / sizeof(S);
    static constexpr int PER_WORD = 4 / sizeof(S);

    static __device__ __forceinline__ unsigned bits(S v) {
        if constexpr (sizeof(S) == 4) return __float_as_uint(v);
        else return (unsigned)v;
    }
    static __device__ __forceinline__ S from_bits(unsigned u) {
        if constexpr (sizeof(S) == 4) return __uint_as_float(u);
        else return (S)(u & 0xffffu);
    }

    // Elements [c0, c0 + N) of row `row` (an element offset): one 16-byte load where vec, else
    // element loads of those below `valid` (zero bits past it).
    static __device__ __forceinline__ uint4 load(const S* p, size_t row, int valid, bool vec) {
        if (vec) return *reinterpret_cast<const uint4*>(p + row);
        unsigned w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int e = 0; e < N; ++e)
            if (e < valid)
                w[e / PER_WORD] |= bits(p[row + e]) << (32 / PER_WORD * (e % PER_WORD));
        return make_uint4(w[0], w[1], w[2], w[3]);
    }

    static __device__ __forceinline__ void store(S* p, size_t row, int valid, bool vec,
                                                 const uint4 v) {
        if (vec) {
            *reinterpret_cast<uint4*>(p + row) = v;
            return;
        }
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < N; ++e)
            if (e < valid)
                p[row + e] = from_bits(w[e / PER_WORD] >> (32 / PER_WORD * (e % PER_WORD)));
    }
};

// y for one token of a chunk: bias + sum_j w[j] xx[t + j] (win: xx[t .. t+W-2], cur: xx[t+W-1])
// in f32, silu, rounded to T and packed.
template <typename T, int W>
__device__ __forceinline__ uint4 conv_out(const float (&wt)[W][Vec<T>::N],
                                          const float (&bias)[Vec<T>::N],
                                          const float (&win)[W - 1][Vec<T>::N],
                                          const float (&cur)[Vec<T>::N], bool silu) {
    constexpr int N = Vec<T>::N;
    float out[N];
#pragma unroll
    for (int e = 0; e < N; ++e) {
        float acc = bias[e];
#pragma unroll
        for (int j = 0; j < W - 1; ++j) acc += wt[j][e] * win[j][e];
        acc += wt[W - 1][e] * cur[e];
#if KP_CONV_FAST_SILU
        if (silu) {
            const float ex = (KP_CONV_FAST_SILU >= 2 && sizeof(typename T::storage) == 2)
                                 ? __expf(-acc) : expf(-acc);
            float r;
            asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + ex));
            out[e] = acc * r;
        } else {
            out[e] = acc;
        }
#else
        out[e] = silu ? acc / (1.0f + expf(-acc)) : acc;
#endif
    }
    return Vec<T>::pack(out);
}

// The W weight rows and the bias (0 where !use_bias) of channels [c0, c0 + N), in f32.
template <typename T, int W>
__device__ __forceinline__ void load_weights(const typename T::storage* weight,
                                             const typename T::storage* bias, int channels,
                                             int c0, int valid, bool vec, bool use_bias,
                                             float (&wt)[W][Vec<T>::N],
                                             float (&bs)[Vec<T>::N]) {
#pragma unroll
    for (int j = 0; j < W; ++j)
        Vec<T>::unpack(Chunk<T>::load(weight, (size_t)j * channels + c0, valid, vec), wt[j]);
    if (use_bias) {
        Vec<T>::unpack(Chunk<T>::load(bias, (size_t)c0, valid, vec), bs);
    } else {
#pragma unroll
        for (int e = 0; e < Vec<T>::N; ++e) bs[e] = 0.0f;
    }
}

}  // namespace kp_conv_detail

// x, y [B, D]; weight [W, D]; bias [D]; state_in, state_out [B, W-1, D] (all T). Block:
// blockDim.x threads (64, or 256 where B chunks fills the GPU: gpu_impls/cuda/ssm.py); grid:
// ceil(B chunks / blockDim.x), chunks = ceil(D / VEC).
template <typename T, int W>
__global__ void __launch_bounds__(KP_CONV_STEP_MAX_THREADS)
kp_conv1d_causal_step(const typename T::storage* __restrict__ x,
                      const typename T::storage* __restrict__ weight,
                      const typename T::storage* __restrict__ bias,
                      const typename T::storage* state_in, typename T::storage* state_out,
                      typename T::storage* __restrict__ y, int batch, int channels, int chunks,
                      int use_bias, int silu, int vec) {
    using namespace kp_conv_detail;
    typedef Chunk<T> C;
    constexpr int N = Vec<T>::N;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)batch * chunks) return;
    const int b = (int)(i / chunks), c0 = (int)(i % chunks) * N;
    const int valid = min(N, channels - c0);

    // 1. The state rows and x first (the per-row bytes), then the weights (shared by every row).
    uint4 raw[W];  // xx[0 .. W-1]: the state's W-1 rows, then x
#pragma unroll
    for (int k = 0; k < W - 1; ++k)
        raw[k] = C::load(state_in, ((size_t)b * (W - 1) + k) * channels + c0, valid, vec);
    raw[W - 1] = C::load(x, (size_t)b * channels + c0, valid, vec);
    float wt[W][N], bs[N];
    load_weights<T, W>(weight, bias, channels, c0, valid, vec, use_bias, wt, bs);

    // 2. y from the window; the state out is the window shifted by one (raw bits).
    float win[W - 1][N], cur[N];
#pragma unroll
    for (int k = 0; k < W - 1; ++k) Vec<T>::unpack(raw[k], win[k]);
    Vec<T>::unpack(raw[W - 1], cur);
    C::store(y, (size_t)b * channels + c0, valid, vec, conv_out<T, W>(wt, bs, win, cur, silu));
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
#ifdef KPARITY_MUTANT_CONV_DOUBLE_SHIFT
        // mutant: shifted twice ([s0, s1, s2] -> [s2, s2, x]): slot k < W-2 gets xx[min(k+2, W-2)]
        const uint4 v = k < W - 2 ? raw[min(k + 2, W - 2)] : raw[W - 1];
#else
        const uint4 v = raw[k + 1];
#endif
        C::store(state_out, ((size_t)b * (W - 1) + k) * channels + c0, valid, vec, v);
    }
}

// The row of xx = cat(state_in, x) at index `row` (< W-1: the state's row, else x's row
// row - (W-1)), channels [c0, c0 + VEC), of batch row b.
template <typename T, int W>
__device__ __forceinline__ uint4 kp_conv_xx(const typename T::storage* x,
                                            const typename T::storage* state_in, int b,
                                            int tokens, int channels, int c0, int valid,
                                            bool vec, int row) {
    if (row < W - 1)
        return kp_conv_detail::Chunk<T>::load(
            state_in, ((size_t)b * (W - 1) + row) * channels + c0, valid, vec);
    return kp_conv_detail::Chunk<T>::load(
        x, ((size_t)b * tokens + (row - (W - 1))) * channels + c0, valid, vec);
}

// x, y [B, T, D]; weight [W, D]; bias [D]; state_in, state_out [B, W-1, D] (all T). Block:
// KP_CONV_THREADS threads; grid: B spans chunk_blocks (module comment).
template <typename T, int W>
__global__ void __launch_bounds__(KP_CONV_THREADS, KP_CONV_MIN_BLOCKS)
kp_conv1d_causal(const typename T::storage* __restrict__ x,
                 const typename T::storage* __restrict__ weight,
                 const typename T::storage* __restrict__ bias,
                 const typename T::storage* __restrict__ state_in,
                 typename T::storage* __restrict__ state_out,
                 typename T::storage* __restrict__ y, int tokens, int channels, int chunks,
                 int chunk_blocks, int spans, int span_len, int use_bias, int silu, int vec) {
    using namespace kp_conv_detail;
    typedef Chunk<T> C;
    constexpr int N = Vec<T>::N;
    const int chunk = (blockIdx.x % chunk_blocks) * KP_CONV_THREADS + threadIdx.x;
    const int rest = blockIdx.x / chunk_blocks;
    const int span = rest % spans, b = rest / spans;
    if (chunk >= chunks) return;
    const int c0 = chunk * N;
    const int valid = min(N, channels - c0);
    const int t0 = span * span_len;
    const int t1 = min(tokens, t0 + span_len);

    // 1. The halo: xx[t0 .. t0+W-2], the W-1 inputs before token t0; then the weights.
    uint4 raw[W - 1];
#pragma unroll
    for (int k = 0; k < W - 1; ++k)
        raw[k] = kp_conv_xx<T, W>(x, state_in, b, tokens, channels, c0, valid, vec, t0 + k);
    float wt[W][N], bs[N], win[W - 1][N];
    load_weights<T, W>(weight, bias, channels, c0, valid, vec, use_bias, wt, bs);
#pragma unroll
    for (int k = 0; k < W - 1; ++k) Vec<T>::unpack(raw[k], win[k]);

    // 2. The tokens, KP_CONV_AHEAD loads at a time; the window slides by one per token.
    for (int t = t0; t < t1; t += KP_CONV_AHEAD) {
        uint4 ahead[KP_CONV_AHEAD];
#pragma unroll
        for (int u = 0; u < KP_CONV_AHEAD; ++u)
            ahead[u] = t + u < t1 ? C::load(x, ((size_t)b * tokens + t + u) * channels + c0,
                                            valid, vec)
                                  : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int u = 0; u < KP_CONV_AHEAD; ++u) {
            if (t + u < t1) {  // (a guard, not a break: the unrolled indices stay constant)
                float cur[N];
                Vec<T>::unpack(ahead[u], cur);
                C::store(y, ((size_t)b * tokens + t + u) * channels + c0, valid, vec,
                         conv_out<T, W>(wt, bs, win, cur, silu));
#pragma unroll
                for (int k = 0; k < W - 2; ++k) {
                    raw[k] = raw[k + 1];
#pragma unroll
                    for (int e = 0; e < N; ++e) win[k][e] = win[k + 1][e];
                }
                raw[W - 2] = ahead[u];
#pragma unroll
                for (int e = 0; e < N; ++e) win[W - 2][e] = cur[e];
            }
        }
    }

    // 3. The last span's block: the final state, xx[T .. T+W-2] (raw bits).
    if (span != spans - 1) return;
#ifdef KPARITY_MUTANT_CONV_STATE_SKIPS_LAST
    if (tokens > 1) {  // mutant: the window before the last token, xx[T-1 .. T+W-3]
#pragma unroll
        for (int k = 0; k < W - 1; ++k)
            raw[k] = kp_conv_xx<T, W>(x, state_in, b, tokens, channels, c0, valid, vec,
                                      tokens - 1 + k);
    }
#endif
#pragma unroll
    for (int k = 0; k < W - 1; ++k)
        C::store(state_out, ((size_t)b * (W - 1) + k) * channels + c0, valid, vec, raw[k]);
}
