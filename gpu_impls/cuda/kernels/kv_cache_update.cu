// kv_cache_update<T>: a step's new k and v rows written into the caches at their slots
// (oracle/kv_cache.py), in place; every other cache element keeps its bits. A copy of raw
// storage bits (no f32 round trip: NaN payloads and subnormals are kept under -ftz).
//
//   k, v [rows, H, D]; slots [rows] i32: the row's slot, -1 for a padding row (skipped)
//   contiguous  cache [B, H, max_len, D]: slot = b * max_len + pos -> cache[b, h, pos, :]
//   paged       cache [pages, page_size, H, D]: slot = page * page_size + offset
//               -> cache[page, offset, h, :], i.e. element (slot * H + h) * D + d
//
// One thread per element of k (and the same element of v): i = (row * H + h) * D + d, so a
// warp reads consecutive elements of a row and writes consecutive elements of one cache row.
// A slot outside [0, n_slots) (n_slots = B * max_len, both layouts) writes nothing: a padding
// row by design, anything else a caller's bug that must not write past the cache.
//
// DISPATCH INVARIANTS (the wrapper's geometry): block = 256 threads, grid = ceil(count / 256),
// count = rows * H * D (64-bit indices).
//
// Test-only mutant: KPARITY_MUTANT_KV_SLOT_OFF_BY_ONE writes every real row one slot later.
#include "common.cuh"

template <typename T>
__global__ void kv_cache_update(const typename T::storage* __restrict__ k,
                                const typename T::storage* __restrict__ v,
                                const int* __restrict__ slots,
                                typename T::storage* __restrict__ k_cache,
                                typename T::storage* __restrict__ v_cache, long long count,
                                int heads, int head_dim, int max_len, int paged,
                                long long n_slots) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const long long d = i % head_dim;
    const long long row_head = i / head_dim;
    const long long h = row_head % heads;
    long long slot = slots[row_head / heads];
    if (slot < 0) return;  // a padding row
#ifdef KPARITY_MUTANT_KV_SLOT_OFF_BY_ONE
    slot += 1;  // mutant: one slot late
#endif
    if (slot >= n_slots) return;
    const long long dst = paged ? (slot * heads + h) * head_dim + d
                                : (((slot / max_len) * heads + h) * max_len + slot % max_len)
                                      * head_dim + d;
    k_cache[dst] = k[i];
    v_cache[dst] = v[i];
}
