// kparity's MoE routing family (oracle/moe_route.py; issue 31): the router, the counting-sort
// dispatch, the permute (gather), the unpermute (weighted combine) and the deterministic
// scatter-add. All on the device, no host synchronisation, no atomics (but the mutant's): every
// output's bits are the same on every run.
//
// kp_moe_router<T>: logits [T, E] (T), bias [E] f32 -> ids [T, k] i32, weights [T, k] f32. One
//   warp per token, KP_ROUTER_WARPS tokens a block. The warp writes each expert's selection key
//   to its slice of shared memory (dynamic: KP_ROUTER_WARPS * E words), lane l owning experts
//   e = l, l + 32, ...:
//     softmax (scoring softmax_topk / softmax): the logit itself (p = softmax(l) is increasing
//       in l, so the k largest logits are the k largest p, without p's f32 ties), and the
//       row's max (NaN-propagating: a NaN or +inf in the row makes every p NaN, as the oracle's)
//       and sum of exp(l - max) (lane-strided partial sums, then a warp butterfly: every lane
//       holds the same bits);
//     sigmoid_bias: sigmoid(l) + bias[e] (f32). With groups > 1 each lane g < groups scores
//       group g (its two best keys' values summed, one where a group has one expert), the
//       topk_group best groups are kept (k rounds of a warp argmax over the lanes), and the
//       experts of every other group get the key of -inf.
//   A key is the score mapped to an unsigned integer in the score's order, NaN below -inf
//   (key 1), an expert already chosen below NaN (key 0); -0 is read as +0. The top k: k rounds
//   of a warp argmax over 64-bit (key, ~e) candidates, so that equal scores go to the smaller
//   id: each lane keeps its own best candidate, only the winner's owner rescans its experts.
//   Lane j < k then holds the j-th id and computes its weight: exp(l - max) / sum, or sigmoid(l)
//   (the unbiased score, recomputed from the logit: the same bits as at selection); under
//   norm_topk_prob divided by (the warp sum of the k weights + eps), then times the scale.
// kp_moe_dispatch<T>: ids [T, k] i32 -> counts [E], offsets [E + 1], perm [T k], inv_perm [T k]
//   (i32), n = T k. One block per expert e, KP_DISPATCH_WARPS warps, warp w owning the slots
//   [w seg, (w + 1) seg) (seg a multiple of 32). Pass 1 counts the slots with an id below e
//   (offsets[e]: no prefix sum across blocks needed) and equal to e (counts[e]), per warp;
//   pass 2 walks the warp's slots 32 at a time in order, a ballot giving each matching lane its
//   rank, and places slot i at offsets[e] + (e's slots in earlier warps) + its rank:
//   perm[pos] = i, inv_perm[i] = pos. The stable order (the oracle's argsort, kind="stable")
//   by construction; every element of every output written once (offsets[E] = n by the last
//   block). The T trait is unused (the op has no float tensor).
// kp_moe_permute<T>: x [T, H] (T), perm [n] -> x_sorted [n, H]: x_sorted[r] = x[perm[r] / k],
//   raw storage bits (NaN payloads and subnormals kept under -ftz). A block per sorted row r.
// kp_moe_unpermute<T>: y_sorted [n, H] (T), weights [T, k] f32, inv_perm [n] -> out [T, H]:
//   out[t] = sum_j w[t, j] y_sorted[inv_perm[t k + j]], each product one f32 rounding, summed in
//   j order (__fmul_rn / __fadd_rn: no FMA contraction), rounded to T once. A block per token.
// kp_moe_scatter_add<T>: the same combine in the op's DECLARED order (the oracle's docstring): a
//   token's k products added into 0 in the order of their sorted positions. Two launches:
//   kp_moe_scatter_inverse (a thread per sorted row r: inv[perm[r]] = r, into a workspace),
//   then kp_moe_scatter_add, a block per token t: its first k threads read the token's k
//   positions from the workspace and rank them (ascending, distinct in a permutation; a tie,
//   impossible there, goes to the smaller j so that the ranks stay a permutation), then every
//   thread adds the k products of each of its chunks in rank order.
//
// Row kernels (permute, unpermute, scatter-add): a block of KP_ROW_THREADS threads per row
// (grid.x = the rows: n < 2^31, the op's i32 positions), thread i taking the chunks i, i + 128,
// ... of the row. A chunk is VEC = 16 / sizeof(T) consecutive elements (8 in f16 / bf16, 4 in f32);
// `vec` (the wrapper's: H % VEC == 0 and every row pointer 16-byte aligned) loads and stores it
// as one 16-byte vector, else element by element guarded by c < H (a partial last chunk, any H).
//
// Indices: element offsets in size_t; slots, positions and loop counters in 32-bit ints, which
// hold any n < 2^31 (the i32 outputs' limit; the dispatch's loop counters are unsigned, so that
// i + 32 cannot overflow). An index input outside its range (an id outside [0, E), a position
// outside [0, n)) writes nothing or NaN, never outside an output: such inputs are outside the
// ops' domains.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/moe_route.py checks them before any launch): router
// k <= 32 (lane j holds the j-th id), E <= 1024 (the keys' shared memory, 16 KiB a block),
// groups <= 32 (lane g scores group g); scatter-add k <= 32 (its first k threads rank the
// token's positions into a 32-entry shared table).
//
// Test-only mutant: KPARITY_MUTANT_ATOMIC_SCATTER_ADD (tests/mutants.py): the scatter-add as an
// atomic scatter (the seed's first device path): kp_moe_scatter_inverse's thread r adds its
// row's products into an f32 accumulator [T, H] (zeroed by the wrapper) with atomicAdd, in
// whatever order the threads of a token's k rows arrive; kp_moe_scatter_add stores the
// accumulator rounded to T. Inside the bound on every run, not bit-identical across runs.
#include "common.cuh"

#define KP_ROUTER_WARPS 4     // tokens (warps) per router block
#define KP_ROUTER_MAX_K 32    // ids per token: one lane each
#define KP_ROUTER_MAX_E 1024  // experts: KP_ROUTER_WARPS * E * 4 bytes of shared keys
#define KP_DISPATCH_WARPS 8   // warps per dispatch block (one block per expert)
#define KP_ROW_THREADS 128    // threads per row-kernel block: a 16-byte chunk at a time
#define KP_INVERSE_THREADS 256

namespace kp_moe_detail {

constexpr unsigned FULL = 0xffffffffu;
constexpr unsigned TAKEN = 0u;     // an expert already chosen
constexpr unsigned NAN_KEY = 1u;   // a NaN score: below every number

// The score's order as an unsigned integer: -inf -> 0x007fffff, ..., -0 = +0 -> 0x80000000, ...,
// +inf -> 0xff800000; NaN -> 1. Every number's key is >= 2.
__device__ __forceinline__ unsigned order_key(float f) {
    if (f != f) return NAN_KEY;
    if (f == 0.0f) f = 0.0f;  // -0 ties with +0 (and, under -ftz, a subnormal with both)
    const unsigned b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The score a key >= 1 stands for (NaN for NAN_KEY).
__device__ __forceinline__ float key_value(unsigned k) {
    if (k <= NAN_KEY) return __uint_as_float(0x7fffffffu);
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

constexpr unsigned NEG_INF_KEY = 0x007fffffu;  // order_key(-inf)

// A candidate: the key above, the index below, complemented: the larger candidate has the
// larger key, at equal keys the smaller index.
__device__ __forceinline__ unsigned long long candidate(unsigned key, int index) {
    return ((unsigned long long)key << 32) | (unsigned)(~index);
}

__device__ __forceinline__ int candidate_index(unsigned long long c) {
    return (int)(~(unsigned)c);
}

__device__ __forceinline__ unsigned long long warp_max(unsigned long long v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const unsigned long long o = __shfl_xor_sync(FULL, v, offset);
        v = o > v ? o : v;
    }
    return v;
}

// A butterfly sum: every lane ends with the same bits (each step adds the same two partial
// sums, in either order: f32 addition commutes).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL, v, offset);
    return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL, v, offset);
    return v;
}

// max that propagates NaN from either side (fmaxf drops it)
__device__ __forceinline__ float nan_max(float a, float b) {
    return (a > b || a != a) ? a : b;
}

__device__ __forceinline__ float warp_nan_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v = nan_max(v, __shfl_xor_sync(FULL, v, offset));
    return v;
}

// sigmoid in f32: expf (CUDA's precise one: the seed's router flipped near-tie top-k sets with
// __expf), 1 + t, an IEEE divide. -inf -> 0, +inf -> 1.
__device__ __forceinline__ float sigmoid(float l) { return 1.0f / (1.0f + expf(-l)); }

// The best candidate among this lane's experts e = lane, lane + 32, ... (a chosen one's key is
// TAKEN: it loses to any expert not yet chosen).
__device__ __forceinline__ unsigned long long lane_best(const unsigned* keys, int lane,
                                                        int experts) {
    unsigned long long best = 0;
    for (int e = lane; e < experts; e += 32) {
        const unsigned long long c = candidate(keys[e], e);
        best = c > best ? c : best;
    }
    return best;
}

// Group-limited selection: the experts of all but the topk_group best groups get the key of
// -inf. Lane g < groups scores group g: its two best keys' values summed (NaN if either is NaN:
// such a group ranks last), ties to the smaller group id.
__device__ __forceinline__ void mask_groups(unsigned* keys, int lane, int experts, int groups,
                                            int topk_group) {
    const int size = experts / groups;
    unsigned long long mine = 0;  // lanes >= groups: never kept (every group's candidate > 0)
    if (lane < groups) {
        unsigned long long b1 = 0, b2 = 0;
        for (int i = 0; i < size; ++i) {
            const int e = lane * size + i;
            const unsigned long long c = candidate(keys[e], e);
            if (c > b1) {
                b2 = b1;
                b1 = c;
            } else if (c > b2) {
                b2 = c;
            }
        }
        float score = key_value((unsigned)(b1 >> 32));
        if (size > 1) score += key_value((unsigned)(b2 >> 32));
        mine = candidate(order_key(score), lane);
    }
    unsigned kept = 0;
    for (int q = 0; q < topk_group && q < groups; ++q) {  // topk_group <= groups: the domain
        const int g = candidate_index(warp_max(mine));
        kept |= 1u << g;
        if (lane == g) mine = 0;
    }
    __syncwarp();  // every lane has read the keys of its group before any is overwritten
    for (int e = lane; e < experts; e += 32)
        if (!((kept >> (e / size)) & 1u)) keys[e] = NEG_INF_KEY;
}

// A chunk of VEC elements of a row: one 16-byte vector where `vec`, else element loads guarded
// by c < hidden (the elements past it read as 0 and are never stored).
template <typename T>
__device__ __forceinline__ void load_chunk(const typename T::storage* p, size_t at, int c0,
                                           int hidden, int vec, float (&f)[Vec<T>::N]) {
    if (vec) {
        Vec<T>::unpack(*reinterpret_cast<const uint4*>(p + at), f);
    } else {
#pragma unroll
        for (int v = 0; v < Vec<T>::N; ++v) f[v] = c0 + v < hidden ? T::load(p, at + v) : 0.0f;
    }
}

// Chunk c0 of y_sorted's row `pos` (load_chunk); a pos outside [0, n) is outside the op's
// domain: the chunk reads as NaN (loud, never out of bounds).
template <typename T>
__device__ __forceinline__ void load_slot_chunk(const typename T::storage* y_sorted, int pos,
                                                int n, int c0, int hidden, int vec,
                                                float (&y)[Vec<T>::N]) {
    if (pos >= 0 && pos < n) {
        load_chunk<T>(y_sorted, (size_t)pos * hidden + c0, c0, hidden, vec, y);
    } else {
#pragma unroll
        for (int v = 0; v < Vec<T>::N; ++v) y[v] = __uint_as_float(0x7fffffffu);
    }
}

template <typename T>
__device__ __forceinline__ void store_chunk(typename T::storage* p, size_t at, int c0,
                                            int hidden, int vec, const float (&f)[Vec<T>::N]) {
    if (vec) {
        *reinterpret_cast<uint4*>(p + at) = Vec<T>::pack(f);
    } else {
#pragma unroll
        for (int v = 0; v < Vec<T>::N; ++v)
            if (c0 + v < hidden) T::store(p, at + v, f[v]);
    }
}

}  // namespace kp_moe_detail

// --- the router ----------------------------------------------------------------------------------

// Block: KP_ROUTER_WARPS * 32 threads, dynamic shared memory KP_ROUTER_WARPS * E * 4 bytes;
// grid: ceil(T / KP_ROUTER_WARPS). use_sigmoid: 1 for sigmoid_bias, 0 for the softmax scorings;
// eps: 1e-20 for sigmoid_bias (HF's renormaliser), 0 otherwise.
template <typename T>
__global__ void __launch_bounds__(KP_ROUTER_WARPS * 32)
kp_moe_router(const typename T::storage* __restrict__ logits, const float* __restrict__ bias,
              int* __restrict__ ids, float* __restrict__ weights, int tokens, int experts,
              int top_k, int groups, int topk_group, int use_sigmoid, int norm, float scale,
              float eps) {
    using namespace kp_moe_detail;
    extern __shared__ unsigned kp_router_keys[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int t = blockIdx.x * KP_ROUTER_WARPS + warp;
    if (t >= tokens) return;  // warp-uniform; the kernel has no block barrier
    unsigned* keys = kp_router_keys + (size_t)warp * experts;
    const size_t row = (size_t)t * experts;

    // 1. Selection keys (each lane its own experts), the softmax's max and sum.
    float mx = 0.0f, sum = 0.0f;
    if (use_sigmoid) {
        for (int e = lane; e < experts; e += 32)
            keys[e] = order_key(sigmoid(T::load(logits, row + e)) + bias[e]);
        if (groups > 1) {
            __syncwarp();  // lane g reads the keys of group g, written by other lanes
            mask_groups(keys, lane, experts, groups, topk_group);
        }
    } else {
        mx = __uint_as_float(0xff800000u);  // -inf
        for (int e = lane; e < experts; e += 32) {
            const float l = T::load(logits, row + e);
            keys[e] = order_key(l);
            mx = nan_max(mx, l);
        }
        mx = warp_nan_max(mx);
        for (int e = lane; e < experts; e += 32) sum += expf(T::load(logits, row + e) - mx);
        sum = warp_sum(sum);
    }
    __syncwarp();

    // 2. The top k: lane j keeps the j-th id. Only the owner lane (e % 32) reads or writes
    //    keys[e] from here on.
    int id = 0;
    unsigned long long mine = lane_best(keys, lane, experts);
    for (int j = 0; j < top_k; ++j) {
        const int best = candidate_index(warp_max(mine));
        if ((best & 31) == lane) {
            keys[best] = TAKEN;
            mine = lane_best(keys, lane, experts);
        }
        if (lane == j) id = best;
    }

    // 3. Weights: the unbiased score of each chosen expert, renormalised, scaled.
    float w = 0.0f;
    if (lane < top_k) {
        const float l = T::load(logits, row + id);
        w = use_sigmoid ? sigmoid(l) : expf(l - mx) / sum;
    }
    if (norm) w = w / (warp_sum(w) + eps);
    w = w * scale;
    if (lane < top_k) {
        ids[(size_t)t * top_k + lane] = id;
        weights[(size_t)t * top_k + lane] = w;
    }
}

// --- dispatch: the counting sort -----------------------------------------------------------------

// Block: KP_DISPATCH_WARPS * 32 threads; grid: E (one block per expert).
template <typename T>
__global__ void __launch_bounds__(KP_DISPATCH_WARPS * 32)
kp_moe_dispatch(const int* __restrict__ ids, int* __restrict__ counts, int* __restrict__ offsets,
                int* __restrict__ perm, int* __restrict__ inv_perm, int n, int experts) {
    using namespace kp_moe_detail;
    const int e = blockIdx.x;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // the warp's slots [begin, end), seg a multiple of 32 (64-bit: n may be near 2^31)
    const long long seg = ((long long)n + KP_DISPATCH_WARPS * 32 - 1)
                          / (KP_DISPATCH_WARPS * 32) * 32;
    const long long first = warp * seg, last = first + seg;
    const unsigned begin = (unsigned)(first < n ? first : n);
    const unsigned end = (unsigned)(last < n ? last : n);

    // 1. Per warp: slots with an id below e, slots with id e (any order: counts).
    int below = 0, here = 0;
    for (unsigned i = begin + lane; i < end; i += 32) {
        const int v = ids[i];
        below += v < e;
        here += v == e;
    }
    below = warp_sum_int(below);
    here = warp_sum_int(here);
    __shared__ int warp_below[KP_DISPATCH_WARPS], warp_here[KP_DISPATCH_WARPS];
    if (lane == 0) {
        warp_below[warp] = below;
        warp_here[warp] = here;
    }
    __syncthreads();
    int offset = 0, count = 0, before = 0;  // before: e's slots in the earlier warps
#pragma unroll
    for (int w = 0; w < KP_DISPATCH_WARPS; ++w) {
        offset += warp_below[w];
        count += warp_here[w];
        before += w < warp ? warp_here[w] : 0;
    }
    if (threadIdx.x == 0) {
        counts[e] = count;
        offsets[e] = offset;
        if (e == experts - 1) offsets[experts] = n;
    }

    // 2. Place e's slots in order, 32 slots a step (the loop bounds are warp-uniform, so the
    //    full-mask ballot has every lane).
    int pos = offset + before;
    for (unsigned base = begin; base < end; base += 32) {
        const unsigned i = base + lane;
        const bool hit = i < end && ids[i] == e;
        const unsigned mask = __ballot_sync(FULL, hit);
        if (hit) {
            const int p = pos + __popc(mask & ((1u << lane) - 1u));
            perm[p] = (int)i;
            inv_perm[i] = p;
        }
        pos += __popc(mask);
    }
}

// --- permute -------------------------------------------------------------------------------------

// Block: KP_ROW_THREADS; grid: n (a block per sorted row). chunks = ceil(H / VEC).
template <typename T>
__global__ void __launch_bounds__(KP_ROW_THREADS)
kp_moe_permute(const typename T::storage* __restrict__ x, const int* __restrict__ perm,
               typename T::storage* __restrict__ x_sorted, int tokens, int top_k, int hidden,
               int chunks, int vec) {
    constexpr int VEC = Vec<T>::N;
    const int r = blockIdx.x;
    const int p = perm[r];
    if (p < 0 || p / top_k >= tokens) return;  // not a slot: outside the op's domain
    const size_t src = (size_t)(p / top_k) * hidden, dst = (size_t)r * hidden;
    for (int u = threadIdx.x; u < chunks; u += KP_ROW_THREADS) {
        const int c0 = u * VEC;
        if (vec) {
            *reinterpret_cast<uint4*>(x_sorted + dst + c0) =
                *reinterpret_cast<const uint4*>(x + src + c0);
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                if (c0 + v < hidden) x_sorted[dst + c0 + v] = x[src + c0 + v];
        }
    }
}

// --- unpermute: the weighted combine in j order ------------------------------------------------

// Block: KP_ROW_THREADS; grid: T (a block per token).
template <typename T>
__global__ void __launch_bounds__(KP_ROW_THREADS)
kp_moe_unpermute(const typename T::storage* __restrict__ y_sorted,
                 const float* __restrict__ weights, const int* __restrict__ inv_perm,
                 typename T::storage* __restrict__ out, int tokens, int top_k, int hidden,
                 int chunks, int vec) {
    using namespace kp_moe_detail;
    constexpr int VEC = Vec<T>::N;
    const int t = blockIdx.x, n = tokens * top_k;
    for (int u = threadIdx.x; u < chunks; u += KP_ROW_THREADS) {
        const int c0 = u * VEC;
        float acc[VEC] = {};
        for (int j = 0; j < top_k; ++j) {
            const size_t slot = (size_t)t * top_k + j;
            const int pos = inv_perm[slot];
            const float w = weights[slot];
            float y[VEC];
            load_slot_chunk<T>(y_sorted, pos, n, c0, hidden, vec, y);
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const float prod = __fmul_rn(w, y[v]);
                acc[v] = j == 0 ? prod : __fadd_rn(acc[v], prod);
            }
        }
        store_chunk<T>(out, (size_t)t * hidden + c0, c0, hidden, vec, acc);
    }
}

// --- scatter-add: the combine in the sorted positions' order ---------------------------------

// Launch 1. Block: KP_INVERSE_THREADS; grid: ceil(n / KP_INVERSE_THREADS). inv [n] i32 (the
// wrapper's workspace). y_sorted, weights, acc: the mutant's only (acc NULL otherwise).
template <typename T>
__global__ void __launch_bounds__(KP_INVERSE_THREADS)
kp_moe_scatter_inverse(const int* __restrict__ perm,
                       const typename T::storage* __restrict__ y_sorted,
                       const float* __restrict__ weights, int* __restrict__ inv,
                       float* __restrict__ acc, int n, int top_k, int hidden) {
    const unsigned r = blockIdx.x * KP_INVERSE_THREADS + threadIdx.x;
    if (r >= (unsigned)n) return;
    const int p = perm[r];
    if (p < 0 || p >= n) return;  // not a slot: outside the op's domain
#ifdef KPARITY_MUTANT_ATOMIC_SCATTER_ADD
    // mutant: the atomic scatter. Row r's products added into its token's f32 accumulator row,
    // concurrently with the token's other k - 1 rows (other threads, other blocks).
    const float w = weights[p];
    const size_t src = (size_t)r * hidden, dst = (size_t)(p / top_k) * hidden;
    for (int c = 0; c < hidden; ++c)
        atomicAdd(acc + dst + c, __fmul_rn(w, T::load(y_sorted, src + c)));
#else
    inv[p] = (int)r;
#endif
}

// Launch 2. Block: KP_ROW_THREADS (>= KP_ROUTER_MAX_K >= k: the first k threads rank the
// positions); grid: T (a block per token).
template <typename T>
__global__ void __launch_bounds__(KP_ROW_THREADS)
kp_moe_scatter_add(const typename T::storage* __restrict__ y_sorted,
                   const float* __restrict__ weights, const int* __restrict__ inv,
                   const float* __restrict__ acc, typename T::storage* __restrict__ out,
                   int tokens, int top_k, int hidden, int chunks, int vec) {
    using namespace kp_moe_detail;
    static_assert(KP_ROW_THREADS >= KP_ROUTER_MAX_K, "a thread per position to rank");
    constexpr int VEC = Vec<T>::N;
    const int t = blockIdx.x;
#ifdef KPARITY_MUTANT_ATOMIC_SCATTER_ADD
    // mutant: the accumulator the atomics filled, stored once
    for (int u = threadIdx.x; u < chunks; u += KP_ROW_THREADS) {
        const int c0 = u * VEC;
        float sum[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v)
            sum[v] = c0 + v < hidden ? acc[(size_t)t * hidden + c0 + v] : 0.0f;
        store_chunk<T>(out, (size_t)t * hidden + c0, c0, hidden, vec, sum);
    }
#else
    const int n = tokens * top_k;
    __shared__ int spos[KP_ROUTER_MAX_K];
    __shared__ float sw[KP_ROUTER_MAX_K];
    if (threadIdx.x < top_k) {
        const size_t base = (size_t)t * top_k;
        const int j = threadIdx.x, pos = inv[base + j];
        int rank = 0;
        for (int q = 0; q < top_k; ++q) {
            const int other = inv[base + q];
            rank += other < pos || (other == pos && q < j);
        }
        spos[rank] = pos;
        sw[rank] = weights[base + j];
    }
    __syncthreads();
    for (int u = threadIdx.x; u < chunks; u += KP_ROW_THREADS) {
        const int c0 = u * VEC;
        float sum[VEC] = {};  // the declared order starts from 0
        for (int q = 0; q < top_k; ++q) {
            const int pos = spos[q];
            const float w = sw[q];
            float y[VEC];
            load_slot_chunk<T>(y_sorted, pos, n, c0, hidden, vec, y);
#pragma unroll
            for (int v = 0; v < VEC; ++v) sum[v] = __fadd_rn(sum[v], __fmul_rn(w, y[v]));
        }
        store_chunk<T>(out, (size_t)t * hidden + c0, c0, hidden, vec, sum);
    }
#endif
}
