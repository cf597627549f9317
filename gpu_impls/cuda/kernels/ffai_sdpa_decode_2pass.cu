// ffai_sdpa_2pass_pass1<T, D>, ffai_sdpa_2pass_pass2<T, D>: the FFAI two-pass (split-KV) decode
// attention (`sdpa_decode_2pass_pass1/pass2` and their _d64/_d96/_d256 variants; metaltile-std
// src/ffai/sdpa_decode_2pass.rs) ported to CUDA, batched, with the op's GQA, window, sink
// tokens and learned sinks (oracle/attention.py `sdpa_decode`); pass 2 alone is also the
// `attn_combine` op with unnormalised partials in T (FFAI's `partial_o`).
//
// Pass 1: block (32, G) per (kv head, split j, sequence b): grid [Hkv, blocks, B], G = Hq / Hkv
// warps, warp y serving query head h = kv_head * G + y (reading kv head h / G). Split j takes
// the attended keys i ≡ j (mod blocks) (`Visible` order), each an online-softmax step in f32
// (ffai_attention.cuh), lane l holding elements [l*E, l*E + E), E = D / 32. It writes, per
// (b, h, j), the UNNORMALISED partial_o = Σ_t e^(s_t - m_j) v_t rounded to T, and
// partial_m = m_j, partial_l = Σ_t e^(s_t - m_j) in f32; an empty split writes m = -inf,
// l = 0, o = 0. Layout [B, Hq, blocks, D] and [B, Hq, blocks]: attn_combine's o, m, l.
//
// Pass 2: block of 1024 threads (32 warps) per (query head h, sequence b): grid [Hq, B]. The
// partials are read in groups of 32 (one per lane), group g by warp g % 32:
//
//   M = max(max_j m_j, sink)         c_j = e^(m_j - M)        (the max rescale)
//   L = Σ_j c_j l_j + e^(sink - M)   out_d = T(Σ_j c_j o_j,d / L)    lse = M + ln L (f32)
//
// the sink entering once, here, never per split. Lane j of a group computes c_j; the warp then
// walks the group's 32 partial rows, c_j broadcast by shuffle, each lane accumulating its E
// elements (coalesced rows); the warps' sums combine in shared memory in warp order. Only whole
// groups are read: blocks / 32 of them, so a block count that is not a multiple of 32 would
// silently drop the last blocks % 32 partials (the seed's failure mode; the contract forbids
// it). M = -inf (every split empty, no sink) gives out = 0 where `empty_zero` (attn_combine's
// rule) and 0 / 0 = NaN otherwise (sdpa_decode's IEEE rule: every attended score -inf); lse is
// M + ln 0 = -inf there either way.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/ffai_attention.py checks them before any launch):
//   - D == the instance's head_dim (64, 96, 128, 256); Hq % Hkv == 0;
//   - pass 1: blockDim = (32, Hq / Hkv), Hq / Hkv <= 32 (1024 threads), 1 <= blocks <= 65535
//     (grid.y); pass 2: blockDim.x == 1024;
//   - blocks % 32 == 0 (pass 2 reads whole groups of 32 partials).
// Deterministic and batch invariant (fixed orders; a block sees only its sequence).
#include "ffai_attention.cuh"

template <typename T, int D>
__global__ void __launch_bounds__(1024, 1)
ffai_sdpa_2pass_pass1(const typename T::storage* __restrict__ q,
                      const typename T::storage* __restrict__ k,
                      const typename T::storage* __restrict__ v,
                      const int* __restrict__ lengths,
                      typename T::storage* __restrict__ partial_o,
                      float* __restrict__ partial_m, float* __restrict__ partial_l, int heads,
                      int kv_heads, int max_len, int blocks, float scale, int window,
                      int sink_end) {
    static_assert(D % 32 == 0 && D >= 32 && D <= 256, "D: a multiple of 32, at most 256");
    constexpr int E = D / 32;
    const int split = blockIdx.y, b = blockIdx.z;
    const int h = blockIdx.x * blockDim.y + threadIdx.y;  // this warp's query head
    const int lane = threadIdx.x;
    if (h >= heads) return;  // a whole warp: no shuffle is left waiting
    const int kvh = ffai::kv_head_of(h, heads, kv_heads);
    const ffai::Visible vis = ffai::visible(ffai::seq_len(lengths, b, max_len), window, sink_end);

    const size_t q_row = (size_t)b * heads + h;
    float qs[E];
    ffai::load_row<T, E>(q, q_row, lane, qs);
#pragma unroll
    for (int e = 0; e < E; ++e) qs[e] *= scale;

    const size_t kv_rows = ((size_t)b * kv_heads + kvh) * (size_t)max_len;
    float m = ffai::neg_inf(), l = 0.0f, o[E];
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] = 0.0f;
    for (int i = split; i < vis.count; i += blocks) {
        const size_t row = kv_rows + (size_t)ffai::key_at(vis, i);
        float kk[E], vv[E];
        ffai::load_row<T, E>(k, row, lane, kk);
        ffai::load_row<T, E>(v, row, lane, vv);
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) s += qs[e] * kk[e];
        ffai::online_step<E>(m, l, o, ffai::warp_sum(s), vv);
    }

    const size_t part = q_row * (size_t)blocks + split;  // [B, Hq, blocks]
#pragma unroll
    for (int e = 0; e < E; ++e) T::store(partial_o, part * D + (size_t)lane * E + e, o[e]);
    if (lane == 0) {
        partial_m[part] = m;
        partial_l[part] = l;
    }
}

template <typename T, int D>
__global__ void __launch_bounds__(1024, 1)
ffai_sdpa_2pass_pass2(const typename T::storage* __restrict__ partial_o,
                      const float* __restrict__ partial_m, const float* __restrict__ partial_l,
                      const float* __restrict__ sinks, typename T::storage* __restrict__ out,
                      float* __restrict__ lse, int heads, int blocks, int has_sink,
                      int empty_zero) {
    static_assert(D % 32 == 0 && D >= 32 && D <= 256, "D: a multiple of 32, at most 256");
    constexpr int E = D / 32;
    constexpr int WARPS = 32;
    __shared__ float s_part[WARPS];
    __shared__ float s_o[WARPS][D];

    const int h = blockIdx.x, b = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t row = (size_t)b * heads + h;
    const size_t first = row * (size_t)blocks;  // this row's partial 0
    const int groups = blocks / 32;             // whole groups only (module comment)

    // M: the max over the partials and the sink, the same bits in every thread.
    float mx = ffai::neg_inf();
    for (int g = warp; g < groups; g += WARPS) mx = fmaxf(mx, partial_m[first + g * 32 + lane]);
    mx = ffai::warp_max(mx);
    if (lane == 0) s_part[warp] = mx;
    __syncthreads();
    const float sink = ffai::sink_logit(sinks, has_sink, h);
    float top = sink;
    for (int w = 0; w < WARPS; ++w) top = fmaxf(top, s_part[w]);
    const float base = ffai::exp_base(top);
    __syncthreads();  // s_part is reused below

    // Σ c_j l_j and Σ c_j o_j over this warp's groups.
    float lsum = 0.0f, acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    for (int g = warp; g < groups; g += WARPS) {
        const size_t j = first + (size_t)g * 32;
        const float c = ffai::rescale(partial_m[j + lane], base);
        lsum += c * partial_l[j + lane];
        for (int src = 0; src < 32; ++src) {
            const float cs = __shfl_sync(0xffffffffu, c, src);
            float ov[E];
            ffai::load_row<T, E>(partial_o, j + src, lane, ov);
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] += cs * ov[e];
        }
    }
    lsum = ffai::warp_sum(lsum);
    if (lane == 0) s_part[warp] = lsum;
#pragma unroll
    for (int e = 0; e < E; ++e) s_o[warp][lane * E + e] = acc[e];
    __syncthreads();
    if (threadIdx.x >= D) return;
    float total = 0.0f, sum = 0.0f;
    for (int w = 0; w < WARPS; ++w) {
        total += s_part[w];
        sum += s_o[w][threadIdx.x];
    }
    total += expf(sink - base);  // 0 without a sink
    const bool empty = top == ffai::neg_inf();
    T::store(out, row * D + threadIdx.x, empty && empty_zero ? 0.0f : sum / total);
    if (threadIdx.x == 0) lse[row] = top + logf(total);
}
