// ffai_sdpa_decode<T, D>: the FFAI single-pass decode attention (`ffai_sdpa_decode`, `_d64`,
// `_d96`, `_d256`; metaltile-std src/ffai/sdpa_decode*.rs) ported to CUDA, batched: one query
// token per sequence against its contiguous KV cache, GQA, an optional learned sink per query
// head (GPT-OSS), a sliding window with StreamingLLM sink tokens (oracle/attention.py
// `sdpa_decode`).
//
//   q [B, Hq, D], k, v [B, Hkv, max_len, D] (kv_stride = max_len), lengths [B] i32, sinks [Hq]
//   f32 (read only when has_sink), out [B, Hq, D]; T = f32 / f16 / bf16 storage, f32 inside.
//
// Geometry (the seed's): one block of TPG = 1024 threads (32 warps) per (query head h,
// sequence b): grid [Hq, B], block [1024]. Query head h reads kv head h / (Hq / Hkv). Lane l
// of every warp holds elements [l*E, l*E + E) of q (pre-multiplied by scale), of the key and
// of its accumulator, E = D / 32; warp w walks the sequence's attended keys i = w, w + 32, ...
// (`Visible`: [0, sink_hi) ∪ [start, n)), each key one online-softmax step in f32:
//
//   s = warp_sum(Σ_e (q_e·scale) k_e)      m' = max(m, s)      l = l e^(m - m') + e^(s - m')
//   o = o e^(m - m') + e^(s - m') v
//
// then the 32 warps combine in shared memory, with the sink entering once, there:
//
//   M = max(max_w m_w, sink)   L = Σ_w e^(m_w - M) l_w + e^(sink - M)
//   out_d = T(Σ_w e^(m_w - M) o_w,d / L)            thread d < D, warps in order 0..31
//
// Deterministic (fixed order everywhere) and batch invariant (a block sees only its sequence).
// A term is rescaled at most ceil(count / 32) - 1 times inside its warp plus once in the combine:
// ceil(count / 32) in all (gpu_impls/cuda/ffai_attention.py declares softmax_block = 32).
//
// DISPATCH INVARIANTS (gpu_impls/cuda/ffai_attention.py checks them before any launch):
//   - D == the instance's head_dim (64, 96, 128, 256: one impl each, as the seed's variants);
//   - Hq % Hkv == 0;
//   - blockDim.x == 1024 (the combine reads 32 warps' partials), grid = [Hq, B].
// Reads stay inside the sequence's attended keys (t < min(lengths[b], max_len)): stale slots
// past a sequence's length or outside its window are never touched.
#include "ffai_attention.cuh"

template <typename T, int D>
__global__ void __launch_bounds__(1024, 1)
ffai_sdpa_decode(const typename T::storage* __restrict__ q,
                 const typename T::storage* __restrict__ k,
                 const typename T::storage* __restrict__ v,
                 const int* __restrict__ lengths, const float* __restrict__ sinks,
                 typename T::storage* __restrict__ out, int heads, int kv_heads, int max_len,
                 float scale, int window, int sink_end, int has_sink) {
    static_assert(D % 32 == 0 && D >= 32 && D <= 256, "D: a multiple of 32, at most 256");
    constexpr int E = D / 32;
    constexpr int WARPS = 32;
    __shared__ float s_m[WARPS], s_l[WARPS];
    __shared__ float s_o[WARPS][D];

    const int h = blockIdx.x, b = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kvh = ffai::kv_head_of(h, heads, kv_heads);
    const ffai::Visible vis = ffai::visible(ffai::seq_len(lengths, b, max_len), window, sink_end);

    const size_t q_row = (size_t)b * heads + h;
    float qs[E];
    ffai::load_row<T, E>(q, q_row, lane, qs);
#pragma unroll
    for (int e = 0; e < E; ++e) qs[e] *= scale;

    const size_t kv_rows = ((size_t)b * kv_heads + kvh) * (size_t)max_len;  // first row
    float m = ffai::neg_inf(), l = 0.0f, o[E];
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] = 0.0f;
    for (int i = warp; i < vis.count; i += WARPS) {
        const size_t row = kv_rows + (size_t)ffai::key_at(vis, i);
        float kk[E], vv[E];
        ffai::load_row<T, E>(k, row, lane, kk);
        ffai::load_row<T, E>(v, row, lane, vv);
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) s += qs[e] * kk[e];
        ffai::online_step<E>(m, l, o, ffai::warp_sum(s), vv);
    }

    // Combine the warps (a warp with no keys holds m = -inf, l = 0, o = 0: weight 0).
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) s_o[warp][lane * E + e] = o[e];
    __syncthreads();
    if (threadIdx.x >= D) return;
    const float sink = ffai::sink_logit(sinks, has_sink, h);
    float top = sink;
    for (int w = 0; w < WARPS; ++w) top = fmaxf(top, s_m[w]);
    const float base = ffai::exp_base(top);
    float total = 0.0f, acc = 0.0f;
    for (int w = 0; w < WARPS; ++w) {
        const float c = ffai::rescale(s_m[w], base);
        total += c * s_l[w];
        acc += c * s_o[w][threadIdx.x];
    }
    total += expf(sink - base);  // 0 without a sink
    T::store(out, q_row * D + threadIdx.x, acc / total);
}
