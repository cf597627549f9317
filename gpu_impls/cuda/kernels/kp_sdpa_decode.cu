// kparity's split-KV decode attention (gpu_impls/cuda/kp_attention.py has the design and the
// numerics): pass 1 `kp_sdpa_decode_split<T, D, G>` over one split of one sequence's keys for G
// query heads of one kv head; pass 2 `kp_attn_combine<T>` merges the splits (also the
// `attn_combine` op on its own). One key row is read once per block, for all G heads.
//
// Loads: the block stages tiles of TILE keys (K and V rows) in shared memory with cp.async, in a
// ring of STAGES tiles, so that STAGES - 1 tiles are in flight while one is computed.
// Math: a key row of D elements is held by LPK lanes ("a key group"), EPL = 16 elements each
// (16-byte vectors sub, sub + LPK, ... of the row: a warp's shared-memory reads are
// conflict-free); D = 96 leaves some lanes part idle. A warp holds 32 / LPK key groups, a block 4
// warps; each key group takes U keys of a tile: the scores (a butterfly over its LPK lanes), one
// running-max update, and P·V into f32 accumulators. The groups then merge by butterfly within
// the warp and through shared memory across warps, each merge a rescale by e^(m - M).
#include "common.cuh"

#ifndef KP_U
#define KP_U 2  // keys per key group per tile (Numerics.softmax_block in kp_attention.py)
#endif
#ifndef KP_WARPS
#define KP_WARPS 4  // warps per block of pass 1 (kp_attention.py WARPS)
#endif
#ifndef KP_EPL
#define KP_EPL 16           // elements of a key row per lane
#endif
#define KP_STAGE_BUDGET 65536  // bytes of shared memory for the tile ring (kp_attention.py)
#ifndef KP_COMBINE_UNROLL
// kp_attn_combine's loops over a chunk of splits: 1 (as shipped) reads l in thread 0 and o in
// each column's loop one split at a time; N > 1 stages l in shared memory with the weights and
// unrolls the loops by N, so that N splits' loads are in flight at once. The same operations
// in the same order either way (bit for bit); `cuda:kp_sdpa_decode_cu8` (scripts/
// kp_attn_variants.py) is the variant to time.
#define KP_COMBINE_UNROLL 1
#endif
// `#pragma unroll` takes a constant expression, not a macro: the knob as one, and no pragma at 1
// (the compiler's own choice, as shipped)
constexpr int kp_combine_unroll = KP_COMBINE_UNROLL;
#if KP_COMBINE_UNROLL > 1
#define KP_COMBINE_PRAGMA _Pragma("unroll kp_combine_unroll")
#else
#define KP_COMBINE_PRAGMA
#endif
#ifndef KP_MIN_BLOCKS
#define KP_MIN_BLOCKS 1  // __launch_bounds__' blocks per SM: more caps the registers
#endif

namespace kp_attn {

// +inf without math.h (NVRTC has none here: kernels include only common.cuh)
#define KP_INF __int_as_float(0x7f800000)

__host__ __device__ constexpr int next_pow2(int v) { return v <= 1 ? 1 : 2 * next_pow2((v + 1) / 2); }

// e^(m - M) for a running max m against M >= m, 0 when m is -inf (an empty group or split:
// its sums are 0, and e^(-inf - -inf) would be NaN). M = +inf (an infinite score) gives NaN
// for finite m, as the oracle's exp(s - inf) does: the head's output is NaN either way.
__device__ __forceinline__ float rescale(float m, float M) {
    return m == -KP_INF ? 0.0f : expf(m - M);
}

// Virtual index i of a sequence's attended keys -> key position (oracle.attention.visible):
// [0, n_sink) then [start, n).
struct Visible {
    int start, n_sink, count;
    __device__ Visible(int n, int window, int sink_end) {
#ifdef KPARITY_MUTANT_WINDOW_OFF_BY_ONE
        start = window > 0 ? max(n - window - 1, 0) : 0;  // mutant: one key too many
#else
        start = window > 0 ? max(n - window, 0) : 0;
#endif
        n_sink = window > 0 ? min(sink_end, start) : 0;
        count = n_sink + (n - start);
    }
    __device__ __forceinline__ int key(int i) const { return i < n_sink ? i : start + i - n_sink; }
};

// 16 bytes global -> shared, asynchronously (sm_80+); src_bytes = 0 fills zeros instead.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    unsigned s;
    asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"
                 : "=r"(s) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(src),
                 "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// The shape of pass 1 for one (T, D): lanes per key, keys per tile, tiles in the ring.
template <typename T, int D>
struct Shape {
    typedef typename T::storage storage;
    static constexpr int VEC = 16 / sizeof(storage);         // elements per 16-byte vector
    static constexpr int ROW_VECS = D / VEC;                 // 16-byte vectors per key row
    static constexpr int NV = KP_EPL / VEC;                  // vectors per lane
    static constexpr int LPK = next_pow2((D + KP_EPL - 1) / KP_EPL);
    static constexpr int GPW = 32 / LPK;                     // key groups per warp
    static constexpr int GROUPS = KP_WARPS * GPW;            // key groups per block
    static constexpr int TILE = GROUPS * KP_U;               // keys per tile
    static constexpr int STAGE_BYTES = 2 * TILE * D * (int)sizeof(storage);  // K and V rows
    static constexpr int RING = KP_STAGE_BUDGET / STAGE_BYTES;
    static constexpr int STAGES = RING < 2 ? 2 : (RING > 4 ? 4 : RING);
    static_assert(LPK <= 32 && D % KP_EPL == 0, "head_dim: a multiple of 16, at most 512");
};

// This lane's NV vectors of a row (vectors sub + i * LPK), widened to f32; absent ones 0.
template <typename T, int D>
__device__ __forceinline__ void row_f32(const uint4* row, int sub, float (&f)[KP_EPL]) {
    typedef Shape<T, D> S;
#pragma unroll
    for (int i = 0; i < S::NV; ++i) {
        const int vec = sub + i * S::LPK;
        float part[S::VEC];
        Vec<T>::unpack(vec < S::ROW_VECS ? row[vec] : make_uint4(0u, 0u, 0u, 0u), part);
#pragma unroll
        for (int e = 0; e < S::VEC; ++e) f[i * S::VEC + e] = part[e];
    }
}

}  // namespace kp_attn

// Pass 1. Grid (chunks, splits, B * Hkv): blockIdx.x picks G of the g = Hq / Hkv query heads of
// kv head hk (so the chunks of one (b, hk, split) run side by side and share the rows in L2),
// blockIdx.y the split, blockIdx.z = b * Hkv + hk. Split s of sequence b takes its attended keys
// [s * per, min((s + 1) * per, count)), per = ceil(count / splits). With splits == 1 the block
// writes out = acc / (l + e^(sink - M)) in T; else the split's f32 partials acc, m, l for
// kp_attn_combine. Cache: contiguous k, v [B, Hkv, L, D] (page_size == 0), or pages
// [num_pages, Hkv, page_size, D] with page_table [B, max_pages]. Dynamic shared memory:
// STAGES * STAGE_BYTES (kp_attention.py `ring_bytes`).
template <typename T, int D, int G>
__global__ void __launch_bounds__(KP_WARPS * 32, KP_MIN_BLOCKS) kp_sdpa_decode_split(
    const typename T::storage* __restrict__ q, const typename T::storage* __restrict__ k,
    const typename T::storage* __restrict__ v, const int* __restrict__ lengths,
    const int* __restrict__ page_table, const float* __restrict__ sinks,
    typename T::storage* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_m, float* __restrict__ part_l, float scale, int hq, int hkv,
    int max_len, int page_size, int max_pages, int window, int sink_end, int splits) {
    using namespace kp_attn;
    typedef Shape<T, D> S;
    typedef typename T::storage storage;
    constexpr int LPK = S::LPK, GPW = S::GPW, TILE = S::TILE, U = KP_U;
    constexpr int STAGES = S::STAGES, ROW_VECS = S::ROW_VECS;
    extern __shared__ uint4 ring[];  // [STAGES][2 (K, V)][TILE][ROW_VECS]

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane % LPK;                            // lane within its key group
    const int group = warp * GPW + lane / LPK;
    const int g = hq / hkv;
    const int b = blockIdx.z / hkv, hk = blockIdx.z % hkv;
    const int h0 = hk * g + blockIdx.x * G;                // first query head of this block
#ifdef KPARITY_MUTANT_GQA_MOD
    // mutant: query head h read against kv head h % Hkv (heads hk, hk + Hkv, ...)
#define KP_HEAD(j) (hk + (int)(blockIdx.x * G + (j)) * hkv)
#else
#define KP_HEAD(j) (h0 + (j))
#endif
    const int heads = min(G, g - (int)blockIdx.x * G);     // valid heads here (<= G)
    const int split = blockIdx.y;

    pdl_wait();  // q and the cache may be written by the kernels before this one
    pdl_launch_dependents();

    const Visible vis(lengths[b], window, sink_end);
    const int per = (vis.count + splits - 1) / splits;
    const int lo = split * per, hi = min(lo + per, vis.count);
    const int tiles = hi > lo ? (hi - lo + TILE - 1) / TILE : 0;
    const size_t kv_head_stride = page_size ? (size_t)page_size * D : (size_t)max_len * D;

    // Tile t (keys lo + t * TILE + j) into ring slot t % STAGES; keys past hi are zero-filled.
    auto load_tile = [&](int t) {
        uint4* kd = ring + (size_t)(t % STAGES) * 2 * TILE * ROW_VECS;
        uint4* vd = kd + TILE * ROW_VECS;
        for (int idx = threadIdx.x; idx < TILE * ROW_VECS; idx += KP_WARPS * 32) {
            const int j = idx / ROW_VECS, c = idx % ROW_VECS;
            const int i = lo + t * TILE + j;
            size_t row = 0;
            if (i < hi) {
                const int key = vis.key(i);
                row = page_size
                    ? ((size_t)page_table[(size_t)b * max_pages + key / page_size] * hkv + hk)
                          * kv_head_stride + (size_t)(key % page_size) * D
                    : ((size_t)b * hkv + hk) * kv_head_stride + (size_t)key * D;
            }
            const int bytes = i < hi ? 16 : 0;
            cp_async16(kd + idx, reinterpret_cast<const uint4*>(k + row) + c, bytes);
            cp_async16(vd + idx, reinterpret_cast<const uint4*>(v + row) + c, bytes);
        }
    };
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < tiles) load_tile(t);
        cp_async_commit();
    }

    float qs[G][KP_EPL];  // q * scale, f32 (the MLX form: the scale multiplies the query)
#pragma unroll
    for (int j = 0; j < G; ++j) {
        if (j < heads) {
            row_f32<T, D>(reinterpret_cast<const uint4*>(q + ((size_t)b * hq + KP_HEAD(j)) * D),
                          sub, qs[j]);
#pragma unroll
            for (int e = 0; e < KP_EPL; ++e) qs[j][e] *= scale;
        } else {
#pragma unroll
            for (int e = 0; e < KP_EPL; ++e) qs[j][e] = 0.0f;
        }
    }

    float m[G], l[G], acc[G][KP_EPL];
#pragma unroll
    for (int j = 0; j < G; ++j) {
        m[j] = -KP_INF;
        l[j] = 0.0f;
#pragma unroll
        for (int e = 0; e < KP_EPL; ++e) acc[j][e] = 0.0f;
    }

    for (int t = 0; t < tiles; ++t) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of tile t have landed
        __syncthreads();              // everyone's; and everyone is done with tile t - 1
        if (t + STAGES - 1 < tiles) load_tile(t + STAGES - 1);  // into tile t - 1's slot
        cp_async_commit();            // (an empty group at the end keeps the count uniform)

        const uint4* kt = ring + (size_t)(t % STAGES) * 2 * TILE * ROW_VECS;
        const uint4* vt = kt + TILE * ROW_VECS;
        const int first = lo + t * TILE + group * U;  // this key group's first key of the tile
        float s[U][G];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float kf[KP_EPL];
            row_f32<T, D>(kt + (group * U + u) * ROW_VECS, sub, kf);
#pragma unroll
            for (int j = 0; j < G; ++j) {
                float dot = 0.0f;
#pragma unroll
                for (int e = 0; e < KP_EPL; ++e) dot = fmaf(qs[j][e], kf[e], dot);
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                s[u][j] = first + u < hi ? dot : -KP_INF;
            }
        }
        float vf[U][KP_EPL];
#pragma unroll
        for (int u = 0; u < U; ++u) row_f32<T, D>(vt + (group * U + u) * ROW_VECS, sub, vf[u]);
#pragma unroll
        for (int j = 0; j < G; ++j) {
            float top = m[j];
#pragma unroll
            for (int u = 0; u < U; ++u) top = fmaxf(top, s[u][j]);  // a NaN score is skipped here
            const float safe = top == -KP_INF ? 0.0f : top;        // and poisons p below
            const float corr = rescale(m[j], safe);
            m[j] = top;
            float p[U];
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                p[u] = expf(s[u][j] - safe);
                sum += p[u];
            }
#ifdef KPARITY_MUTANT_NO_RESCALE
            l[j] = l[j] + sum;  // mutant: the running sums kept at their old max's scale
#else
            l[j] = l[j] * corr + sum;
#pragma unroll
            for (int e = 0; e < KP_EPL; ++e) acc[j][e] *= corr;
#endif
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int e = 0; e < KP_EPL; ++e) acc[j][e] = fmaf(p[u], vf[u][e], acc[j][e]);
            }
        }
    }
    cp_async_wait<0>();  // no copy outlives the block (the trailing groups are empty)

    // Merge the key groups of a warp (butterfly over the group index), then the warps.
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) {
#pragma unroll
        for (int j = 0; j < G; ++j) {
            const float m_other = __shfl_xor_sync(0xffffffffu, m[j], o);
            const float l_other = __shfl_xor_sync(0xffffffffu, l[j], o);
            const float top = fmaxf(m[j], m_other);
            const float c_mine = rescale(m[j], top), c_other = rescale(m_other, top);
            l[j] = l[j] * c_mine + l_other * c_other;
#pragma unroll
            for (int e = 0; e < KP_EPL; ++e) {
                const float a_other = __shfl_xor_sync(0xffffffffu, acc[j][e], o);
                acc[j][e] = acc[j][e] * c_mine + a_other * c_other;
            }
            m[j] = top;
        }
    }
    __shared__ float sm_m[KP_WARPS][G], sm_l[KP_WARPS][G], sm_acc[KP_WARPS][G][D];
    if (lane < LPK) {
#pragma unroll
        for (int j = 0; j < G; ++j) {
            if (lane == 0) {
                sm_m[warp][j] = m[j];
                sm_l[warp][j] = l[j];
            }
#pragma unroll
            for (int i = 0; i < S::NV; ++i) {
                const int vec = sub + i * LPK;
                if (vec < ROW_VECS) {
#pragma unroll
                    for (int e = 0; e < S::VEC; ++e)
                        sm_acc[warp][j][vec * S::VEC + e] = acc[j][i * S::VEC + e];
                }
            }
        }
    }
    __syncthreads();

    for (int idx = threadIdx.x; idx < heads * D; idx += blockDim.x) {
        const int j = idx / D, d = idx % D;
        float top = -KP_INF;
#pragma unroll
        for (int w = 0; w < KP_WARPS; ++w) top = fmaxf(top, sm_m[w][j]);
        const bool direct = splits == 1;
        const float sink = direct && sinks ? sinks[KP_HEAD(j)] : -KP_INF;
        const size_t head_row = (size_t)b * hq + KP_HEAD(j);  // in [B, Hq]
#ifndef KPARITY_MUTANT_DROP_SINK
        top = fmaxf(top, sink);
#endif
        float total = 0.0f, a = 0.0f;
#pragma unroll
        for (int w = 0; w < KP_WARPS; ++w) {
            const float c = rescale(sm_m[w][j], top);
            total = fmaf(c, sm_l[w][j], total);
            a = fmaf(c, sm_acc[w][j][d], a);
        }
        if (direct) {
#ifndef KPARITY_MUTANT_DROP_SINK
            total += rescale(sink, top);
#endif
            T::store(out, head_row * D + d, a / total);
        } else {
            const size_t at = head_row * splits + split;
            part_o[at * D + d] = a;
            if (d == 0) {
                part_m[at] = top;
                part_l[at] = total;
            }
        }
    }
#undef KP_HEAD
}

// Pass 2 (and the `attn_combine` op): one block of 128 threads per (b, h) row of [B, H]; o
// [B, H, S, D] f32 partials (normalized != 0: o_s = acc_s / l_s), m, l [B, H, S] f32, sinks [H]
// or null; out [B, H, D] in T, lse [B, H] f32 or null. M = max(max_s m_s, sink),
// c_s = e^(m_s - M), L = sum_s c_s l_s (+ e^(sink - M)), out = sum_s c_s acc_s / L,
// lse = M + ln L. A row whose splits are all empty (and no sink) gives out 0 and lse -inf, as
// the op's oracle does. The weights of 128 splits at a time are computed once, in parallel,
// into shared memory; each thread then sums its columns d over them.
template <typename T>
__global__ void __launch_bounds__(128) kp_attn_combine(
    const float* __restrict__ o, const float* __restrict__ m, const float* __restrict__ l,
    const float* __restrict__ sinks, typename T::storage* __restrict__ out,
    float* __restrict__ lse, int heads, int splits, int D, int normalized) {
    using kp_attn::rescale;
    constexpr int N = 128;
    __shared__ float weight[N], part[N / 32];
#if KP_COMBINE_UNROLL > 1
    __shared__ float lsh[N];  // this chunk's l, beside its weights
#endif
    const int row = blockIdx.x, h = row % heads, tid = threadIdx.x, lane = tid & 31;
    pdl_wait();  // the partials are pass 1's
    pdl_launch_dependents();
#ifdef KPARITY_MUTANT_DROP_SINK
    sinks = nullptr;  // mutant: the sink's denominator term left out
#endif
    const float* mr = m + (size_t)row * splits;
    const float* lr = l + (size_t)row * splits;
    // M: the block's max over the splits (and the sink)
    float top = sinks ? sinks[h] : -KP_INF;
    for (int s = tid; s < splits; s += N) top = fmaxf(top, mr[s]);
    for (int off = 16; off > 0; off >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, off));
    if (lane == 0) part[tid / 32] = top;
    __syncthreads();
    top = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
    __syncthreads();

    float total = 0.0f;  // thread 0's, the only one used
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // columns tid, tid + 128, ... (D <= 512)
    for (int base = 0; base < splits; base += N) {
        const int s = base + tid;
#ifdef KPARITY_MUTANT_NO_RESCALE
        const float c = s < splits ? (mr[s] == -KP_INF ? 0.0f : 1.0f) : 0.0f;  // mutant: e^0
#else
        const float c = s < splits ? rescale(mr[s], top) : 0.0f;
#endif
        weight[tid] = s < splits ? c : 0.0f;
#if KP_COMBINE_UNROLL > 1
        lsh[tid] = s < splits ? lr[s] : 0.0f;
#define KP_L(i) lsh[i]
#else
#define KP_L(i) lr[base + (i)]
#endif
        __syncthreads();
        const int count = min(N, splits - base);
        if (tid == 0) {
            KP_COMBINE_PRAGMA
            for (int i = 0; i < count; ++i) total = fmaf(weight[i], KP_L(i), total);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int d = tid + k * N;
            if (d < D) {
                float a = acc[k];
                KP_COMBINE_PRAGMA
                for (int i = 0; i < count; ++i) {
                    const float w = normalized ? weight[i] * KP_L(i) : weight[i];
                    a = fmaf(w, o[((size_t)row * splits + base + i) * D + d], a);
                }
                acc[k] = a;
            }
        }
#undef KP_L
        __syncthreads();
    }
    if (tid == 0) {
        if (sinks) total += rescale(sinks[h], top);
        part[0] = total;
    }
    __syncthreads();
    total = part[0];
    // Empty: every split without keys (m = -inf, l = 0). A split whose scores were all NaN
    // also has m = -inf (fmaxf skips NaN) but l = NaN: total is NaN then, and so is out.
    const bool empty = top == -KP_INF && total == 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int d = tid + k * N;
        if (d < D) T::store(out, (size_t)row * D + d, empty ? 0.0f : acc[k] / total);
    }
    if (lse && tid == 0) lse[row] = empty ? -KP_INF : top + logf(total);
}
