// kp_rope<T>: kparity's own RoPE (oracle/rope.py), q and k of one layer rotated in ONE launch,
// each token at its own position (a decode batch at arbitrary positions, or packed prefill rows).
//
// Math, per token t at position p_t and pair i < R/2 (R = rotary_dim; the D - R tail elements
// of each head are copied bit for bit):
//   inv_i = theta^(-2i/R), scaled by llama3's bands or YaRN's ramp: computed in float64 from the
//           case's constants (exp2 of -(2i/R) log2(theta), log2(theta) from the host in
//           float64), rounded to f32 once (`rope_inv_freq`)
//   angle = f32(p_t * inv_i)                      (p_t exact in f32: positions < 2^24)
//   c, s  = sincosf(angle) * m                    (the accurate sincosf, NOT __sinf/__cosf: the
//                                                  fast intrinsics' absolute error grows with
//                                                  the angle; CuPy's -ftz=true is not
//                                                  --use_fast_math and keeps sincosf accurate)
//   (x1, x2) -> (x1 c - x2 s, x2 c + x1 s)        f32, one rounding to T at the store
//   pairing neox: (x_i, x_{i + R/2});  gptj: (x_{2i}, x_{2i+1})
//
// Layout. q [tokens, Hq, D], k [tokens, Hkv, D], outputs the same shapes (out of place). The
// heads of q and k are one list h < Hq + Hkv (q's first), cut into chunks of HPB heads. Block
// (x = chunk, y) handles its chunk for tokens y, y + gridDim.y, ... (gridDim.y <= 65535): per
// token the block first fills a shared table of (c_i, s_i) for every pair (R/2 entries, shared
// by all its heads: one sincosf per pair per block, not per element), then its threads walk
// the chunk's items: per head, R/2 pairs then D - R tail elements; item w of the chunk is head
// w / (D - R/2), slot w % (D - R/2). Consecutive threads take consecutive pairs, so a warp's
// loads of x1 (and of x2) are contiguous (neox) or stride 2 (gptj).
//
// DISPATCH INVARIANTS (derived from the dims in gpu_impls/cuda/kp_rope.py and checked by its
// contract before any launch):
//   - R <= 2 * KP_ROPE_MAX_HALF (512): the shared table holds R/2 entries (checked here too:
//     a larger R returns at once and leaves the outputs unwritten, the runner's NaN poison).
//   - positions < 2^24: converted to f32 exactly.
//   - blockDim.x = KP_ROPE_BLOCK, HPB = max(1, KP_ROPE_BLOCK / (D - R/2)), gridDim.x =
//     ceil((Hq + Hkv) / HPB); every item index is checked against the heads (a chunk past the
//     last head writes nothing) and element offsets are size_t.
//
// Launch. A programmatic dependent launch (common.cuh): the f32 table of inv_i depends only on
// the case's constants and is computed before `pdl_wait`; positions, q and k are read after it.
//
// Test-only mutants: KPARITY_MUTANT_ROPE_PAIRING_ADJACENT pairs (x_{2i}, x_{2i+1}) where neox's
// (x_i, x_{i + R/2}) is declared; KPARITY_MUTANT_LLAMA3_NO_SMOOTH leaves llama3's smooth band
// at the unscaled inv_i.
#include "common.cuh"

#define KP_ROPE_BLOCK 128
#define KP_ROPE_MAX_HALF 256

namespace kp_rope_detail {

enum { SCALING_NONE = 0, SCALING_LLAMA3 = 1, SCALING_YARN = 2 };

// inv_i in float64 (oracle/rope.py `inv_freq`), rounded to f32 once. theta^0 = exp2(-0) = 1
// exactly; the float64 error (a few 2^-52 relative) is far below half an f32 ULP.
__device__ __forceinline__ float rope_inv_freq(int i, int rotary_dim, int scaling,
                                               double log2_theta, double factor,
                                               double low_freq, double high_freq, double orig,
                                               double yarn_low, double yarn_span) {
    const double inv = exp2(-(2.0 * (double)i / (double)rotary_dim) * log2_theta);
    if (scaling == SCALING_LLAMA3) {
        const double wavelen = 2.0 * 3.141592653589793 / inv;  // 2 pi / inv, Python's math.pi
        if (wavelen > orig / low_freq) return (float)(inv / factor);
        if (wavelen < orig / high_freq) return (float)inv;
#ifdef KPARITY_MUTANT_LLAMA3_NO_SMOOTH
        return (float)inv;  // mutant: the smooth band keeps the unscaled inv
#endif
        const double s = (orig / wavelen - low_freq) / (high_freq - low_freq);
        return (float)((1.0 - s) * inv / factor + s * inv);
    }
    if (scaling == SCALING_YARN) {
        const double ramp = fmin(fmax(((double)i - yarn_low) / yarn_span, 0.0), 1.0);
        return (float)(inv / factor * ramp + inv * (1.0 - ramp));
    }
    return (float)inv;
}

}  // namespace kp_rope_detail

template <typename T>
__global__ void __launch_bounds__(KP_ROPE_BLOCK)
kp_rope(const typename T::storage* __restrict__ q, const typename T::storage* __restrict__ k,
        const int* __restrict__ positions, typename T::storage* __restrict__ q_out,
        typename T::storage* __restrict__ k_out, int tokens, int heads_q, int heads_kv,
        int head_dim, int rotary_dim, int heads_per_block, int gptj, int scaling,
        double log2_theta, double factor, double low_freq, double high_freq, double orig,
        double yarn_low, double yarn_span, float attention_factor) {
    typedef typename T::storage storage;
    __shared__ float inv_s[KP_ROPE_MAX_HALF], cos_s[KP_ROPE_MAX_HALF], sin_s[KP_ROPE_MAX_HALF];
    const int half = rotary_dim / 2;
    if (half > KP_ROPE_MAX_HALF || heads_per_block < 1 || rotary_dim > head_dim) return;
    const int heads = heads_q + heads_kv;
    const int per_head = head_dim - half;  // R/2 pairs, then D - R tail elements
    const int items = heads_per_block * per_head;
    const int head0 = blockIdx.x * heads_per_block;

    // The table needs only the constants: built while the kernel before this one finishes.
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        inv_s[i] = kp_rope_detail::rope_inv_freq(i, rotary_dim, scaling, log2_theta, factor,
                                                 low_freq, high_freq, orig, yarn_low,
                                                 yarn_span);
    pdl_launch_dependents();
    pdl_wait();

    for (int t = blockIdx.y; t < tokens; t += gridDim.y) {  // block-uniform: barriers are safe
        const float p = (float)positions[t];
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            float s, c;
            sincosf(p * inv_s[i], &s, &c);
            cos_s[i] = c * attention_factor;  // exact where m = 1
            sin_s[i] = s * attention_factor;
        }
        __syncthreads();  // the table is complete (and inv_s, on the first token)
        for (int w = threadIdx.x; w < items; w += blockDim.x) {
            const int local = w / per_head;
            const int j = w - local * per_head;
            const int h = head0 + local;
            if (h >= heads) break;  // later items belong to later heads: none left
            const bool is_q = h < heads_q;
            const size_t row = is_q ? (size_t)t * heads_q + h
                                    : (size_t)t * heads_kv + (h - heads_q);
            const storage* x = (is_q ? q : k) + row * (size_t)head_dim;
            storage* o = (is_q ? q_out : k_out) + row * (size_t)head_dim;
            if (j < half) {
#ifdef KPARITY_MUTANT_ROPE_PAIRING_ADJACENT
                const bool adjacent = true;  // mutant: (2i, 2i+1) whatever the pairing
#else
                const bool adjacent = gptj != 0;
#endif
                const int a = adjacent ? 2 * j : j;
                const int b = adjacent ? 2 * j + 1 : j + half;
                const float x1 = T::load(x, a), x2 = T::load(x, b);
                const float c = cos_s[j], s = sin_s[j];
                T::store(o, a, x1 * c - x2 * s);
                T::store(o, b, x2 * c + x1 * s);
            } else {
                const int e = rotary_dim + (j - half);  // the unrotated tail, copied as bits
                o[e] = x[e];
            }
        }
        __syncthreads();  // every thread is done with this token's table
    }
}
