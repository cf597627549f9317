// kp_gdn_step<T, KPL>: kparity's Gated DeltaNet decode step (op `gdn_step`, oracle/gdn.py; the
// recurrence of oracle/gdn_math.py for one token). Per (batch b, value head h), kh = h / (Hv / Hk)
// the q/k head, the f32 state S [V, K] (V-major) is read once and written once:
//
//   k^, q^  = k, q in f32; with l2norm each x * rsqrt(sum x^2 + eps) (f32, not rounded to T)
//   S       = exp(g) S                      the decay first (g: the log-decay, f32)
//   u[v]    = beta (v[v] - S[v, :] . k^)    the delta, with the decayed S
//   S[v, :] = S[v, :] + u[v] k^             the rank-1 update
//   o[v]    = S[v, :] . (scale q^)          rounded to T once, at the store
//
// Every row v of S is independent given k^ and q^, so a warp owns whole rows: lane l holds
// KPL = K / 32 elements of the row (an instance per K), as the W-float vectors (32 j + l), j <
// KPL / W, W the widest of 4, 2, 1 dividing KPL (K = 128: one float4 per lane, a row's 512 bytes
// in one coalesced warp load), and the two dots of a row are warp butterflies
// (every lane gets the same bits: one store per row, by lane r for the warp's row r). A block of
// KP_GDN_WARPS warps takes KP_GDN_ROWS consecutive rows per warp of one (b, h): a slice of
// KP_GDN_WARPS * KP_GDN_ROWS rows; the warp issues its rows' state loads first, then reads k and q
// (the same 2 K elements per lane, from L2 after the first warp) while those are in flight. The
// grid is flat: blockIdx.x = (b * Hv + h) * slices + slice, so no grid dimension limits B or Hv.
// Bandwidth: 4 rows x 512 bytes per warp in flight at K = 128; no shared memory, no barrier.
//
// Numerics: f32 throughout; the dots in the butterfly's order (lane-strided partial sums, then
// 5 xor steps); expf and rsqrtf are CUDA's (2 ULPs; CuPy adds -ftz, not fast math). The
// state may alias state_out (an in-place update): each element is read by the thread that writes
// it, before it writes it, so the pointers carry no __restrict__.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/gdn.py checks them before any launch): K % 32 == 0 and
// K <= 256 (the instances: KPL = K / 32 in 1..8), Hv % Hk == 0.
//
// Test-only mutant: KPARITY_MUTANT_DECAY_AFTER_UPDATE applies exp(g) after the rank-1 update
// (the delta then reads the undecayed state).
#include "common.cuh"
#include "floatvec.cuh"

#define KP_GDN_WARPS 4
#define KP_GDN_ROWS 4    // rows of S per warp

namespace kp_gdn_step_detail {

using kp_floatvec::FloatVec;

// The butterfly sum of each of the N values over the warp: every lane gets the same bits.
template <int N>
__device__ __forceinline__ void warp_sums(float (&x)[N]) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
#pragma unroll
        for (int r = 0; r < N; ++r) x[r] += __shfl_xor_sync(0xffffffffu, x[r], offset);
}

}  // namespace kp_gdn_step_detail

template <typename T, int KPL>
__global__ void __launch_bounds__(KP_GDN_WARPS * 32)
kp_gdn_step(const typename T::storage* __restrict__ q, const typename T::storage* __restrict__ k,
            const typename T::storage* __restrict__ v, const float* __restrict__ g,
            const float* __restrict__ beta, const float* state_in, float* state_out,
            typename T::storage* __restrict__ o, int heads_k, int heads_v, int dim_v,
            int slices, int l2norm, float scale, float eps) {
    using namespace kp_gdn_step_detail;
    constexpr int W = KPL % 4 == 0 ? 4 : KPL % 2 == 0 ? 2 : 1;  // floats per vector
    constexpr int NV = KPL / W;                                  // vectors per lane
    constexpr int E = KPL;
    constexpr int dim_k = 32 * KPL;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int slice = blockIdx.x % slices;
    const int bh = blockIdx.x / slices;   // b * Hv + h
    const int b = bh / heads_v, h = bh - b * heads_v;
    const int kh = h / (heads_v / heads_k);
    const int row0 = (slice * KP_GDN_WARPS + warp) * KP_GDN_ROWS;
    if (row0 >= dim_v) return;  // warp-uniform: a whole warp past the last row
    const int rows = min(KP_GDN_ROWS, dim_v - row0);

    // 1. The warp's state rows, first (the bytes that matter); rows past V hold 0.
    const size_t base = ((size_t)bh * dim_v + row0) * dim_k;
    float s[KP_GDN_ROWS][E];
#pragma unroll
    for (int r = 0; r < KP_GDN_ROWS; ++r)
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            if (r < rows)
                FloatVec<W>::load(state_in + base + (size_t)r * dim_k + (j * 32 + lane) * W,
                                  &s[r][j * W]);
            else
#pragma unroll
                for (int w = 0; w < W; ++w) s[r][j * W + w] = 0.0f;
        }

    // 2. k^ and scale q^ in f32, the same elements of K as the state's.
    const typename T::storage* kp = k + ((size_t)b * heads_k + kh) * dim_k;
    const typename T::storage* qp = q + ((size_t)b * heads_k + kh) * dim_k;
    float kk[E], qq[E];
#pragma unroll
    for (int j = 0; j < NV; ++j)
#pragma unroll
        for (int w = 0; w < W; ++w) {
            const int i = (j * 32 + lane) * W + w;
            kk[j * W + w] = T::load(kp, i);
            qq[j * W + w] = T::load(qp, i);
        }
    if (l2norm) {
        float ss[2] = {0.0f, 0.0f};
#pragma unroll
        for (int e = 0; e < E; ++e) ss[0] += kk[e] * kk[e], ss[1] += qq[e] * qq[e];
        warp_sums(ss);
        const float inv_k = rsqrtf(ss[0] + eps), inv_q = rsqrtf(ss[1] + eps);
#pragma unroll
        for (int e = 0; e < E; ++e) kk[e] *= inv_k, qq[e] *= inv_q;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) qq[e] *= scale;
    const float alpha = expf(g[bh]), bt = beta[bh];

    // 3. Decay, delta, rank-1 update, output, row by row (the rows interleaved for ILP).
#ifndef KPARITY_MUTANT_DECAY_AFTER_UPDATE
#pragma unroll
    for (int r = 0; r < KP_GDN_ROWS; ++r)
#pragma unroll
        for (int e = 0; e < E; ++e) s[r][e] *= alpha;
#endif
    float kv[KP_GDN_ROWS];
#pragma unroll
    for (int r = 0; r < KP_GDN_ROWS; ++r) {
        kv[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) kv[r] += s[r][e] * kk[e];
    }
    warp_sums(kv);
    const size_t vo = (size_t)bh * dim_v + row0;  // v, o: [B, Hv, V]
    float out[KP_GDN_ROWS];
#pragma unroll
    for (int r = 0; r < KP_GDN_ROWS; ++r) {
        const float u = r < rows ? bt * (T::load(v, vo + r) - kv[r]) : 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) s[r][e] += u * kk[e];
#ifdef KPARITY_MUTANT_DECAY_AFTER_UPDATE
#pragma unroll
        for (int e = 0; e < E; ++e) s[r][e] *= alpha;  // mutant: the decay after the update
#endif
        out[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) out[r] += s[r][e] * qq[e];
    }
    warp_sums(out);

    // 4. The state rows back, and each row's output once (lane r).
#pragma unroll
    for (int r = 0; r < KP_GDN_ROWS; ++r) {
        if (r >= rows) break;
#pragma unroll
        for (int j = 0; j < NV; ++j)
            FloatVec<W>::store(state_out + base + (size_t)r * dim_k + (j * 32 + lane) * W,
                               &s[r][j * W]);
        if (lane == r) T::store(o, vo + r, out[r]);
    }
}
