// Shared pieces of the FFAI decode-attention ports (ffai_sdpa_decode.cu and
// ffai_sdpa_decode_2pass.cu): which keys a sequence attends, which kv head a query head reads,
// the online-softmax step, the warp reductions and the rescale factor of a combine.
//
// Test-only mutation hooks (compiled in only by the mutants, tests/mutants.py), one place each so
// every kernel gets them:
//   KPARITY_MUTANT_GQA_MOD          kv head h % Hkv instead of h / (Hq / Hkv)
//   KPARITY_MUTANT_WINDOW_OFF_BY_ONE   the window starts one key early (window + 1 keys)
//   KPARITY_MUTANT_DROP_SINK           the learned sink never enters max or denominator
//   KPARITY_MUTANT_NO_RESCALE          a combine adds its parts without e^(m_part - M)
#pragma once

#include "common.cuh"

namespace ffai {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

// --- what a sequence attends (oracle/attention.py `visible`) ----------------------------------
// Keys [0, sink_hi) ∪ [start, n): with a window, start = max(n - window, 0) and the sink tokens
// [0, sink_end) clipped to start, so no key is attended twice (the seed's host rule
// window_start >= sink_end holds by construction, for every sequence of the batch); without a
// window, every key [0, n). A warp walks the attended keys by their index i < count.
struct Visible {
    int sink_hi;  // sink tokens [0, sink_hi)
    int start;    // the window [start, n)
    int count;    // sink_hi + n - start
};

__device__ __forceinline__ Visible visible(int n, int window, int sink_end) {
    if (window <= 0) return {0, 0, n};
#ifdef KPARITY_MUTANT_WINDOW_OFF_BY_ONE
    const int start = imax(n - window - 1, 0);  // mutant: window + 1 keys
#else
    const int start = imax(n - window, 0);
#endif
    const int sink_hi = imin(imax(sink_end, 0), start);
    return {sink_hi, start, sink_hi + n - start};
}

// Position of the i-th attended key (0 <= i < count).
__device__ __forceinline__ int key_at(const Visible& v, int i) {
    return i < v.sink_hi ? i : v.start + (i - v.sink_hi);
}

// The sequence's length as the kernel uses it: lengths[b] clamped to [0, max_len], so no read
// ever passes the cache's row (the oracle refuses lengths outside [1, max_len]).
__device__ __forceinline__ int seq_len(const int* lengths, int b, int max_len) {
    return imin(imax(lengths[b], 0), max_len);
}

// --- GQA ------------------------------------------------------------------------------------
__device__ __forceinline__ int kv_head_of(int h, int heads, int kv_heads) {
#ifdef KPARITY_MUTANT_GQA_MOD
    return h % kv_heads;  // mutant: tiled instead of grouped
#else
    return h / (heads / kv_heads);  // heads % kv_heads == 0: the contract
#endif
}

// --- the learned sink -------------------------------------------------------------------------
// The sink logit of query head h, or -inf without one (fmaxf(M, -inf) = M, e^(-inf - M) = 0).
__device__ __forceinline__ float sink_logit(const float* sinks, int has_sink, int h) {
#ifdef KPARITY_MUTANT_DROP_SINK
    return neg_inf();  // mutant: the sink term dropped
#else
    return has_sink ? sinks[h] : neg_inf();
#endif
}

// --- warp reductions (all 32 lanes live; every lane gets the same bits) ------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// --- the softmax's exponent base ---------------------------------------------------------------
// The max subtracted before exp: M itself, or 0 where M = -inf (nothing attended yet, or every
// score -inf), so that e^(-inf - base) = 0 instead of e^(-inf + inf) = NaN. A NaN score never
// wins fmaxf, but its own weight e^(NaN - base) is NaN and reaches l and o: NaN propagates; a
// +inf score makes the base +inf and its weight e^(inf - inf) NaN, as in the oracle.
__device__ __forceinline__ float exp_base(float m) { return m == neg_inf() ? 0.0f : m; }

// The factor a combine multiplies a part (max m_part) by to bring it to the common base.
__device__ __forceinline__ float rescale(float m_part, float base) {
#ifdef KPARITY_MUTANT_NO_RESCALE
    return 1.0f;  // mutant: parts added as if every max were M
#else
    return expf(m_part - base);
#endif
}

// One key of an online softmax (fp32): running max m, sum l, accumulator o[E] (this lane's
// E elements of Σ p v); score s, value elements vv[E]. The running terms are rescaled only when
// the max rises (e^0 = 1 exactly otherwise).
template <int E>
__device__ __forceinline__ void online_step(float& m, float& l, float (&o)[E], float s,
                                            const float (&vv)[E]) {
    const float m_new = fmaxf(m, s);
    const float base = exp_base(m_new);
    const float alpha = expf(m - base);
    const float p = expf(s - base);
    l = l * alpha + p;
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] = o[e] * alpha + p * vv[e];
    m = m_new;
}

// This lane's E elements of row `row` (D elements) of a [.., D] tensor, widened to f32: lane
// holds elements [lane*E, lane*E + E), so a warp reads the row contiguously.
template <typename T, int E>
__device__ __forceinline__ void load_row(const typename T::storage* p, size_t row, int lane,
                                         float (&x)[E]) {
    const size_t base = row * (size_t)(32 * E) + (size_t)lane * E;
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = T::load(p, base + e);
}

}  // namespace ffai
