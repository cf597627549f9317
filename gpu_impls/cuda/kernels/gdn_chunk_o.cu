// gdn_chunk_o<T>: a CUDA port of mlx-native's `gated_delta_net_chunk_o_bf16` (the seed,
// ../shared/seeds/mlx-native_gated_delta_net_chunk_o.metal.txt; FLA's `chunk_fwd_kernel_o`), the
// output stage of Gated DeltaNet's chunked pipeline (op `gdn_chunk_o`, oracle/gdn_chunked.py).
//
// Per (batch b, value head h, chunk n, V tile of 32 columns), the chunk's rows i, j in 0..63
// (t = 64 n + i), kh = h / (Hv / Hk) the q/k head:
//
//   bo[i, v]  = exp(gc_i) * sum_k q[i, k] h_n[v, k]                     (f32, MMA)
//   bA[i, j]  = (i >= j) ? exp(gc_i - gc_j) * sum_k q[i, k] k[j, k] : 0  (f32, MMA; the mask
//                                                                         INCLUDES the diagonal)
//   bA        rounded to T (RNE), after the mask, before the closing dot
//   o[i, v]   = T( scale * (bo[i, v] + sum_j bA[i, j] v_new[j, v]) )     (f32 MMA; scale once,
//                                                                         after both dots)
//
// exactly the seed's order: the gate on bo before the closing dot accumulates into it, the
// masked entries selected to 0 (never multiplied: exp(gc_i - gc_j) may overflow above the
// diagonal), one scale at the store.
//
// Geometry, the seed's: grid (V / 32, NT, B * Hv), 256 threads = 8 warps (the seed's 8
// simdgroups), but for CUDA's limit of 65535 on grid.y and grid.z: past it the wrapper caps them
// and a block strides over the chunks and heads (one tile per block otherwise); warp w owns the chunk rows i in [8 w, 8 w + 8) and all 32 V columns of the tile
// and all 64 columns j of bA, in f32 accumulators (24 per lane, as the seed's 12 8x8 fragments).
// Shared memory, the seed's budget: the bA tile in T, 64 x 64 x 2 bytes = 8 KiB, nothing else.
// K == 128 (a compile-time loop of 8 MMA steps, as the seed's hard-coded 16 steps of 8), BT = 64.
//
// Tensor cores. The seed's simdgroup 8x8 MMAs become mma.sync m16n8k16 (f16 / bf16 inputs, f32
// accumulation) computing the TRANSPOSED tiles, so that the warp's 8 rows are the n = 8 side:
//   bo^T [32 v x 8 i] = h [v x K] . q^T [K x 8 i]       2 m-tiles of 16 v
//   bA^T [64 j x 8 i] = k [j x K] . q^T [K x 8 i]       4 m-tiles of 16 j, the same q fragment
//   bo^T += v_new^T [32 v x 64 j] . bA^T [64 j x 8 i]   4 k-steps of 16 j
// Fragments (PTX ISA, mma.m16n8k16 .f16/.bf16; g = lane / 4, c = lane % 4; a register holds two
// consecutive-column elements, the lower column in the low 16 bits):
//   A (16 x 16, row): a0 (row g, cols 2c, 2c+1), a1 (row g+8, same cols), a2 (row g, cols
//                     2c+8, 2c+9), a3 (row g+8, cols 2c+8, 2c+9)
//   B (16 x 8, col):  b0 (rows k = 2c, 2c+1, col n = g), b1 (rows 2c+8, 2c+9, col g)
//   C (16 x 8, f32):  c0, c1 (row g, cols 2c, 2c+1), c2, c3 (row g+8, cols 2c, 2c+1)
// h, k (K innermost) give A's registers as one 32-bit load each; q (K innermost) gives B's;
// bA^T's B registers are one 32-bit shared load of bA[i][j], bA[i][j+1]; v_new^T's A registers
// are two 16-bit loads each (V innermost in memory, j across a register).
//
// Layouts (elements, innermost last): q, k [B, T, Hk, 128]; v_new, o [B, T, Hv, V];
// h [B, NT, Hv, V, 128]; gc [B, T, Hv] f32 (the chunk-local cumsum of the log-decay).
//
// The bA tile is XOR-swizzled in shared memory: the 32-bit word w of row i (columns 2w, 2w+1)
// sits at word w ^ 4 (i % 8) of the row, so the closing dot's reads (8 rows g x words 4a + c)
// hit 32 distinct banks. Same 8 KiB.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/gdn.py checks them before any launch; the kernel trusts
// them): K == 128; V % 32 == 0 and V <= 256 (the seed's); T % 64 == 0 (whole chunks, no row
// guard); chunk == 64; T in {f16, bf16} (the F32 instance below is empty: nvcc_check
// instantiates every trait, the contract launches none). Hv % Hk == 0 is the op's domain
// (checked when a case is made, before any contract).
//
// Test-only mutant: KPARITY_MUTANT_EXCLUSIVE_MASK drops the diagonal from the causal mask
// (i > j, kkt's strict mask, where chunk_o's is i >= j).
#include "common.cuh"
#include "mma16.cuh"

#define GDN_O_THREADS 256
#define GDN_O_K 128
#define GDN_O_BT 64
#define GDN_O_BV 32

namespace gdn_chunk_o_detail {

using kp_mma16::IS_BF16;
using kp_mma16::mma;
using kp_mma16::pair;

// The A fragment of a row-major [16 x 16] tile of 16-bit elements at `p` (row stride `ld`
// elements): rows g, g + 8, columns 2c, 2c + 1 and 2c + 8, 2c + 9.
__device__ __forceinline__ void load_a(unsigned (&a)[4], const unsigned short* p, size_t ld,
                                       int g, int c) {
    const unsigned short* r0 = p + (size_t)g * ld + 2 * c;
    const unsigned short* r1 = r0 + 8 * ld;
    a[0] = pair(r0);
    a[1] = pair(r1);
    a[2] = pair(r0 + 8);
    a[3] = pair(r1 + 8);
}

// The half-word index of bA[i][j] in the swizzled 64 x 64 tile (see the header).
__device__ __forceinline__ int a_index(int i, int j) {
    return i * GDN_O_BT + 2 * ((j >> 1) ^ ((i & 7) << 2)) + (j & 1);
}

__device__ __forceinline__ bool causal(int i, int j) {
#ifdef KPARITY_MUTANT_EXCLUSIVE_MASK
    return i > j;  // mutant: the diagonal excluded (kkt's strict mask)
#else
    return i >= j;  // the seed's mask (FLA chunk_o :122-125), diagonal included
#endif
}

// One tile: V columns [32 i_v, +32) of chunk i_t of (batch, value head) i_bh; bA the block's
// shared A tile.
template <typename T>
__device__ __forceinline__ void chunk_o_tile(const unsigned short* __restrict__ q,
                                             const unsigned short* __restrict__ k,
                                             const unsigned short* __restrict__ v,
                                             const unsigned short* __restrict__ h,
                                             const float* __restrict__ gc,
                                             unsigned short* __restrict__ o,
                                             unsigned short* bA, int tokens, int heads_k,
                                             int heads_v, int dim_v, int n_chunks, float scale,
                                             int i_v, int i_t, int i_bh) {
    const int i_b = i_bh / heads_v, i_h = i_bh - i_b * heads_v;
    const int kh = i_h / (heads_v / heads_k);
    const int t0 = i_t * GDN_O_BT, v0 = i_v * GDN_O_BV;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, c = lane % 4;
    const int row0 = warp * 8;  // the warp's chunk rows: row0 .. row0 + 7 (the n side)

    const size_t qk_t = (size_t)heads_k * GDN_O_K;  // q, k: one token's stride
    const size_t v_t = (size_t)heads_v * dim_v;      // v_new, o: one token's stride
    const unsigned short* q_c = q + ((size_t)i_b * tokens + t0) * qk_t + (size_t)kh * GDN_O_K;
    const unsigned short* k_c = k + ((size_t)i_b * tokens + t0) * qk_t + (size_t)kh * GDN_O_K;
    const unsigned short* h_c = h + (((size_t)i_b * n_chunks + i_t) * heads_v + i_h)
                                        * (size_t)dim_v * GDN_O_K + (size_t)v0 * GDN_O_K;
    const size_t vo_c = ((size_t)i_b * tokens + t0) * v_t + (size_t)i_h * dim_v + v0;
    const float* g_c = gc + ((size_t)i_b * tokens + t0) * heads_v + i_h;

    float bo[2][4], ba[4][4];  // bo^T: 2 tiles of 16 v; bA^T: 4 tiles of 16 j (8 i each)
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) bo[m][e] = 0.0f;
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) ba[m][e] = 0.0f;

    // 1. The K reduction, q.h^T and q.k^T fused on one q fragment (seed sections 2A, 2B).
#pragma unroll 2
    for (int k0 = 0; k0 < GDN_O_K; k0 += 16) {
        // B = q^T [16 k x 8 i]: q[row0 + g][k0 + 2c ..], [k0 + 2c + 8 ..]
        const unsigned short* qp = q_c + (size_t)(row0 + g) * qk_t + k0 + 2 * c;
        const unsigned b0 = pair(qp), b1 = pair(qp + 8);
#pragma unroll
        for (int m = 0; m < 2; ++m) {  // A = h [16 v x 16 k], row stride K
            unsigned a[4];
            load_a(a, h_c + (size_t)(16 * m) * GDN_O_K + k0, GDN_O_K, g, c);
            mma<T>(bo[m], a, b0, b1);
        }
#pragma unroll
        for (int m = 0; m < 4; ++m) {  // A = k [16 j x 16 k], row stride Hk K
            unsigned a[4];
            load_a(a, k_c + (size_t)(16 * m) * qk_t + k0, qk_t, g, c);
            mma<T>(ba[m], a, b0, b1);
        }
    }

    // 2. The gates, the mask, bA rounded to T into shared memory (seed section 3). This lane's
    // accumulators sit at columns i = row0 + 2c + (e & 1), rows g + 8 (e >> 1) of each tile.
    const int i0 = row0 + 2 * c;
    const float g_i[2] = {g_c[(size_t)i0 * heads_v], g_c[(size_t)(i0 + 1) * heads_v]};
    const float exp_g_i[2] = {expf(g_i[0]), expf(g_i[1])};
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) bo[m][e] *= exp_g_i[e & 1];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int j = 16 * m + g + 8 * r;
            const float g_j = g_c[(size_t)j * heads_v];
#pragma unroll
            for (int col = 0; col < 2; ++col) {
                const int i = i0 + col;
                const float a = ba[m][2 * r + col] * expf(g_i[col] - g_j);
                bA[a_index(i, j)] = T::from_f32(causal(i, j) ? a : 0.0f);
            }
        }
    }
    __syncthreads();

    // 3. The closing dot bo^T += v_new^T . bA^T over the chunk's 64 rows j (seed section 4).
#pragma unroll
    for (int j0 = 0; j0 < GDN_O_BT; j0 += 16) {
        // B = bA^T [16 j x 8 i]: bA[row0 + g][j0 + 2c, +1] and [j0 + 2c + 8, +9]
        const unsigned b0 = pair(bA + a_index(row0 + g, j0 + 2 * c));
        const unsigned b1 = pair(bA + a_index(row0 + g, j0 + 8 + 2 * c));
#pragma unroll
        for (int m = 0; m < 2; ++m) {  // A = v_new^T [16 v x 16 j]: v_new[j][v], V innermost
            const unsigned short* vp = v + vo_c + (size_t)(j0 + 2 * c) * v_t + 16 * m + g;
            unsigned a[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                // a0: (v = g, j = 2c, 2c+1); a1: v + 8; a2: j + 8; a3: both
                const unsigned short* p = vp + (r & 1) * 8 + (size_t)((r >> 1) * 8) * v_t;
                a[r] = (unsigned)p[0] | ((unsigned)p[v_t] << 16);
            }
            mma<T>(bo[m], a, b0, b1);
        }
    }

    // 4. scale once, round to T, store (seed section 5): o[t0 + i][h][v0 + v].
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = i0 + (e & 1), col = 16 * m + g + 8 * (e >> 1);
            o[vo_c + (size_t)i * v_t + col] = T::from_f32(bo[m][e] * scale);
        }
    __syncthreads();  // every read of bA done before a next tile of this block writes it
}

}  // namespace gdn_chunk_o_detail

template <typename T>
__global__ void __launch_bounds__(GDN_O_THREADS)
gdn_chunk_o(const typename T::storage* __restrict__ q, const typename T::storage* __restrict__ k,
            const typename T::storage* __restrict__ v_new,
            const typename T::storage* __restrict__ h, const float* __restrict__ gc,
            typename T::storage* __restrict__ o, int batch, int tokens, int heads_k, int heads_v,
            int dim_v, int n_chunks, float scale) {
    if constexpr (sizeof(typename T::storage) == 2) {
        __shared__ __align__(16) unsigned short bA[GDN_O_BT * GDN_O_BT];  // 8 KiB, swizzled
        // block-uniform loops: one iteration each unless NT or B * Hv passes 65535
        for (int i_bh = blockIdx.z; i_bh < batch * heads_v; i_bh += gridDim.z)
            for (int i_t = blockIdx.y; i_t < n_chunks; i_t += gridDim.y)
                gdn_chunk_o_detail::chunk_o_tile<T>(q, k, v_new, h, gc, o, bA, tokens, heads_k,
                                                    heads_v, dim_v, n_chunks, scale, blockIdx.x,
                                                    i_t, i_bh);
    }
}
