// kparity's MoE grouped GEMM (op `moe_grouped_gemm`, oracle/moe_gemm.py), one launch for all
// experts, over rows sorted by expert (the counting-sort layout of `moe_dispatch`):
//
//     y[i, n] = sum_k x[i, k] W[e(i), n, k]     e(i): the e with offsets[e] <= i < offsets[e + 1]
//
// in f32, one rounding to T at the store. W is "dense" (T [E, N, K]) or "affine4" (MLX affine int4,
// group 64: w_q u32 [E, N, K / 8], element d of a row in nibble d % 8 of word d / 8, low nibble
// first; scales, biases T [E, N, K / 64]; W = q s + b).
//
// No host sync: offsets [E + 1] stay on the device. The grid is sized from host-known dims only:
// blockIdx.x = tile * slabs + slab, where `slab` is a block of output columns and `tile` numbers
// the row tiles of all experts in order (expert e has ceil(count_e / TM) tiles of TM rows, the
// last one partial; an empty expert has none). The host launches an upper bound of tiles,
//     min(M, M / TM + min(E, M))     (sum_e ceil(c_e / TM) <= sum_e (c_e / TM + 1) over the at most
//                                     min(E, M) experts that own rows; and a tile has >= 1 row),
// every block finds its (expert, first row, rows) from the offsets (`find_tile`) and blocks past
// the last tile exit. The offsets are staged in shared memory, clamped to [0, M], so a bad offset
// can never address outside x or y (rows outside every segment are then not written; the layout
// has offsets[0] = 0 and offsets[E] = M).
//
// Two kernels; the host picks one by dims (gpu_impls/cuda/moe_gemm.py), never by offsets:
//
// kp_moe_gemv<T, AFFINE, MT> (decode and small M: a GEMV per expert tile). A block of 1..4
// warps (blockDim.x = 32 x warps) owns ROWS = 4 output columns and one tile of TM = MT <= 8 x
// rows (MT: M / E rounded up to a power of two, 1 at decode). kp_qgemv's design (kp_qgemv.cu and
// its lessons): thread t walks the 16-byte weight chunks t, t + blockDim.x, ... of its 4 rows (32
// int4 codes or 16 / sizeof(T) dense elements a chunk), the next step's chunks (and scales,
// biases) in flight during the math, each x chunk read once per x row and shared by the 4
// columns; int4 codes to f32 by PRMT; per chunk the algebraic split  s * sum q x + b * sum x  (a
// chunk lies inside one group), dense chunks as an fmaf chain. A warp's partials by butterfly,
// the warps' in warp order through shared memory (deterministic).
//
// kp_moe_gemm_mma<T, AFFINE> (prefill: f16/bf16, K % 64 == 0): a block of 4 warps owns a tile
// of TM = 64 x rows of one expert and TN = 64 output columns, warp w the 32 x 32 quarter
// (w / 2, w % 2): 2 x 4 mma.m16n8k16 tiles, f32 accumulation. K in steps of TK = 64 (one affine4
// group): the block stages the x tile and the weight tile in shared memory as T (affine4: the
// codes q, exact in f16 / bf16), the next step's global loads held in registers during this
// step's math. Dense: the products accumulate straight into the f32 accumulators. affine4: each
// step's sums q.x go to a fresh accumulator P, then  acc = fmaf(s, P, fmaf(b, sum x, acc))  per
// group (the algebraic split: every product q x is exact in f32), sum x from the staged tile
// (each row's 8 vectors sit in 8 consecutive lanes: their sums meet in a fixed butterfly). Rows
// past the tile's and columns past N are staged as zeros and never stored.
// Fragments (PTX ISA, mma.m16n8k16 .f16/.bf16; g = lane / 4, c = lane % 4; a register holds two
// consecutive-k elements, the lower k in the low half):
//   A (16 x 16, row): a0 (row g, k 2c, 2c+1), a1 (row g+8), a2 (row g, k 2c+8, 2c+9), a3 (row g+8)
//   B (16 x 8, col):  b0 (k 2c, 2c+1, column n = g), b1 (k 2c+8, 2c+9, column g)
//   C (16 x 8, f32):  c0, c1 (row g, columns 2c, 2c+1), c2, c3 (row g+8, columns 2c, 2c+1)
// A = x [rows x k] and B = W^T [k x n] both come as 32-bit pairs from rows with K innermost; the
// shared rows are TK + 8 elements (36 words), so the 32 lanes' pair loads hit 32 distinct banks.
//
// Error: every product is exact in f32 (dense f16/bf16 on the tensor cores, and q x) or one f32
// rounding (fmaf); sums in f32 in a fixed order: the any-order f32 bound of oracle/gemv.py, both
// admissible affine4 forms. Deterministic: no atomics, every order fixed; a row's result depends
// on its own x row, its expert's W and the kernel instance only.
//
// Integer math: element offsets in size_t; int only for counts bounded by M, E, N, K.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/moe_gemm.py): E <= KPMOE_MAX_EXPERTS (the staged offsets);
// affine4: K % 64 == 0 (also the op's domain); dense: K * sizeof(T) % 16 == 0 (16-byte rows);
// 16-byte aligned x and w (checked at launch); kp_moe_gemm_mma: T in {f16, bf16}, K % 64 == 0
// (the F32 instance only traps; the host never picks it). Launched as a programmatic dependent
// launch: nothing is read or written before griddepcontrol.wait.
//
// Test-only mutant (tests/mutants.py): KPARITY_MUTANT_TILE_FIRST_ROW makes every tile of an
// expert start at the expert's first row: right wherever each expert fits one tile (decode),
// wrong (rows past the first tile never written) where one expert owns more.
#include "common.cuh"
#include "mma16.cuh"

#define KPMOE_MAX_EXPERTS 1024
#define KPMOE_ROWS 4            // kp_moe_gemv: output columns (weight rows) per block
#define KPMOE_GEMV_MAX_WARPS 4  // kp_moe_gemv: warps splitting K, at most
#define KPMOE_TM 64             // kp_moe_gemm_mma: x rows per tile
#define KPMOE_TN 64             // kp_moe_gemm_mma: output columns per block
#define KPMOE_TK 64             // kp_moe_gemm_mma: K per step (one affine4 group)
#define KPMOE_MMA_THREADS 128   // kp_moe_gemm_mma: 4 warps
#define KPMOE_PAD 8             // kp_moe_gemm_mma: T elements after each staged row
#define KPMOE_GROUP 64          // the affine4 group

namespace kpmoe {

constexpr unsigned FULL = 0xffffffffu;

// offsets[0..E] into shared memory, clamped to [0, M]; then the block's barrier.
__device__ __forceinline__ void stage_offsets(const int* __restrict__ offsets, int experts,
                                              int rows_m, int* s_off) {
#pragma unroll 4
    for (int i = threadIdx.x; i <= experts; i += blockDim.x)
        s_off[i] = min(max(offsets[i], 0), rows_m);
    __syncthreads();
}

// Tile `tile` of the enumeration (experts in order, ceil(count / TM) tiles each): its expert,
// first row and rows (1..TM); false past the last tile. Every warp computes it by itself (the
// same answer in every warp: a block-uniform result), 32 experts at a time: each lane's tile
// count, an inclusive scan by shuffles, and the first lane whose running total passes `tile`.
template <int TM>
__device__ __forceinline__ bool find_tile(const int* s_off, int experts, int tile, int& expert,
                                          int& row0, int& rows) {
    const int lane = threadIdx.x & 31;
    int base = 0;  // tiles of the experts before e0
    for (int e0 = 0; e0 < experts; e0 += 32) {
        const int e = e0 + lane;
        const int count = e < experts ? max(s_off[e + 1] - s_off[e], 0) : 0;
        const int n = count > 0 ? (count - 1) / TM + 1 : 0;
        int incl = n;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int v = __shfl_up_sync(FULL, incl, d);
            if (lane >= d) incl += v;
        }
        const int total = __shfl_sync(FULL, incl, 31);
        if (tile < base + total) {  // warp-uniform: the tile's expert is among these 32
            // the first lane past `tile` has n > 0 (its running total rose past it)
            const int src = __ffs(__ballot_sync(FULL, base + incl > tile)) - 1;
            const int first = __shfl_sync(FULL, base + incl - n, src);  // its first tile
            expert = e0 + src;
            const int lo = s_off[expert], hi = s_off[expert + 1];
#ifdef KPARITY_MUTANT_TILE_FIRST_ROW
            row0 = lo + 0 * first;  // mutant: every tile of the expert at its first row
#else
            row0 = lo + (tile - first) * TM;
#endif
            rows = min(TM, hi - row0);
            return true;
        }
        base += total;
    }
    return false;
}

__device__ __forceinline__ float byte_as_float(unsigned word, unsigned selector) {
    // bytes: [word.byte(m), 0x00, 0x00, 0x4B] -> 2^23 + byte, exact; minus 2^23
    return __uint_as_float(__byte_perm(word, 0x4B000000u, selector)) - 8388608.0f;
}

// sum_k q_k * xf[k] over one chunk's 32 int4 codes (4 interleaved chains), as kp_qgemv.cu.
__device__ __forceinline__ float chunk_dot4(const uint4 chunk, const float (&xf)[32]) {
    const unsigned words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // word j: codes 8j .. 8j + 7; byte m of even/odd: 8j + 2m (+1)
        const unsigned even = words[j] & 0x0F0F0F0Fu, odd = (words[j] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const unsigned sel = 0x7540u | (unsigned)m;
            a[m] = fmaf(byte_as_float(even, sel), xf[8 * j + 2 * m], a[m]);
            a[m] = fmaf(byte_as_float(odd, sel), xf[8 * j + 2 * m + 1], a[m]);
        }
    }
    return (a[0] + a[1]) + (a[2] + a[3]);
}

using kp_mma16::IS_BF16;
using kp_mma16::mma;
using kp_mma16::pair;

}  // namespace kpmoe

// --- kp_moe_gemv: decode and small M ------------------------------------------------------------

template <typename T, int AFFINE, int MT>
__global__ void __launch_bounds__(KPMOE_GEMV_MAX_WARPS * 32)
kp_moe_gemv(const typename T::storage* __restrict__ x, const uint4* __restrict__ w,
            const typename T::storage* __restrict__ scales,
            const typename T::storage* __restrict__ biases, const int* __restrict__ offsets,
            typename T::storage* __restrict__ y, int rows_m, int experts, int out_dim,
            int in_dim, int slabs) {
    static_assert(MT == 1 || MT == 2 || MT == 4 || MT == 8, "kp_moe_gemv: 1, 2, 4 or 8 rows");
    typedef typename T::storage S;
    typedef Vec<T> V;
    constexpr int ROWS = KPMOE_ROWS;
    constexpr int CODES = AFFINE ? 32 : V::N;  // K elements per 16-byte weight chunk
    constexpr int XV = CODES / V::N;           // 16-byte x vectors per chunk
    constexpr int CHUNKS_PER_GROUP = KPMOE_GROUP / 32;
    __shared__ int s_off[KPMOE_MAX_EXPERTS + 1];
    __shared__ float partial[KPMOE_GEMV_MAX_WARPS][ROWS * MT];

    // Programmatic dependent launch: the next kernel may be scheduled now; wait for the kernels
    // before this one (the dispatch writes offsets and x) before any load.
    pdl_launch_dependents();
    pdl_wait();
    kpmoe::stage_offsets(offsets, experts, rows_m, s_off);
    const int slab = (int)(blockIdx.x % (unsigned)slabs);
    const int tile = (int)(blockIdx.x / (unsigned)slabs);
    int expert, row0, rows;
    if (!kpmoe::find_tile<MT>(s_off, experts, tile, expert, row0, rows)) return;  // idle block

    const int t = threadIdx.x, threads = blockDim.x;
    const int n0 = slab * ROWS;
    const int chunks = in_dim / CODES;
    const int groups = in_dim / KPMOE_GROUP;  // affine4 only
    size_t wrow[ROWS], grow[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const size_t n = (size_t)expert * out_dim + (n0 + r < out_dim ? n0 + r : n0);
        wrow[r] = n * chunks;  // columns past N read column n0 and store nothing
        grow[r] = n * groups;
    }
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const size_t x_stride = (size_t)(in_dim / V::N);  // 16-byte vectors per x row
    const size_t x_tile = (size_t)row0 * x_stride;

    float acc[ROWS][MT];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
    uint4 next[ROWS];
    S next_s[ROWS], next_b[ROWS];  // affine4: the next chunk's scale and bias, in flight with it
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const bool any = t < chunks;
        next[r] = any ? w[wrow[r] + t] : make_uint4(0u, 0u, 0u, 0u);
        if constexpr (AFFINE) {
            next_s[r] = any ? scales[grow[r] + t / CHUNKS_PER_GROUP] : S(0);
            next_b[r] = any ? biases[grow[r] + t / CHUNKS_PER_GROUP] : S(0);
        }
    }
    for (int c = t; c < chunks; c += threads) {
        uint4 cur[ROWS];
        S cur_s[ROWS], cur_b[ROWS];
        const int c_next = c + threads;
        const bool more = c_next < chunks;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            cur[r] = next[r];
            if constexpr (AFFINE) {
                cur_s[r] = next_s[r];
                cur_b[r] = next_b[r];
            }
            if (more) {  // the next step's loads, in flight during this step's math
                next[r] = w[wrow[r] + c_next];
                if constexpr (AFFINE) {
                    next_s[r] = scales[grow[r] + c_next / CHUNKS_PER_GROUP];
                    next_b[r] = biases[grow[r] + c_next / CHUNKS_PER_GROUP];
                }
            }
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (m < rows) {  // block-uniform
                float xf[CODES];
                float xsum = 0.0f;
#pragma unroll
                for (int v = 0; v < XV; ++v) {
                    float f[V::N];
                    V::unpack(xv[x_tile + (size_t)m * x_stride + (size_t)c * XV + v], f);
#pragma unroll
                    for (int k = 0; k < V::N; ++k) {
                        xf[v * V::N + k] = f[k];
                        if constexpr (AFFINE) xsum += f[k];
                    }
                }
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    if constexpr (AFFINE) {
                        const float s = T::load(&cur_s[r], 0), b = T::load(&cur_b[r], 0);
                        acc[r][m] = fmaf(s, kpmoe::chunk_dot4(cur[r], xf),
                                         fmaf(b, xsum, acc[r][m]));
                    } else {
                        float wf[V::N];
                        V::unpack(cur[r], wf);
#pragma unroll
                        for (int k = 0; k < V::N; ++k) acc[r][m] = fmaf(wf[k], xf[k], acc[r][m]);
                    }
                }
            }
        }
    }

    // Each warp's partial per (column, row) by butterfly, then the warps' in warp order.
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            float v = acc[r][m];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kpmoe::FULL, v, o);
            if ((t & 31) == 0) partial[t / 32][r * MT + m] = v;
        }
    __syncthreads();
    for (int i = t; i < ROWS * MT; i += threads) {
        const int r = i / MT, m = i % MT;
        if (m < rows && n0 + r < out_dim) {
            float v = partial[0][i];
            for (int j = 1; j < threads / 32; ++j) v += partial[j][i];
            T::store(y, (size_t)(row0 + m) * out_dim + n0 + r, v);
        }
    }
}

// --- kp_moe_gemm_mma: prefill on tensor cores ---------------------------------------------------

template <typename T, int AFFINE>
__global__ void __launch_bounds__(KPMOE_MMA_THREADS)
kp_moe_gemm_mma(const typename T::storage* __restrict__ x, const uint4* __restrict__ w,
                const typename T::storage* __restrict__ scales,
                const typename T::storage* __restrict__ biases, const int* __restrict__ offsets,
                typename T::storage* __restrict__ y, int rows_m, int experts, int out_dim,
                int in_dim, int slabs) {
    pdl_launch_dependents();
    pdl_wait();
    if constexpr (sizeof(typename T::storage) == 4) {
        __trap();  // f32 has no exact tensor-core path: the host picks kp_moe_gemv for f32
    } else {
        typedef typename T::storage S;
        typedef Vec<T> V;  // 8 elements a 16-byte vector
        constexpr int TM = KPMOE_TM, TN = KPMOE_TN, TK = KPMOE_TK;
        constexpr int LD = TK + KPMOE_PAD;  // elements per staged row (36 words: no conflicts)
        constexpr int TV = TK / 8;          // 16-byte vectors of a staged row's TK elements
        __shared__ __align__(16) S xs[TM * LD];
        __shared__ __align__(16) S ws[TN * LD];
        __shared__ float s_scale[TN], s_bias[TN], s_xsum[TM];
        __shared__ int s_off[KPMOE_MAX_EXPERTS + 1];

        kpmoe::stage_offsets(offsets, experts, rows_m, s_off);
        const int slab = (int)(blockIdx.x % (unsigned)slabs);
        const int tile = (int)(blockIdx.x / (unsigned)slabs);
        int expert, row0, rows;
        if (!kpmoe::find_tile<TM>(s_off, experts, tile, expert, row0, rows)) return;

        const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
        const int g = lane >> 2, c = lane & 3;
        const int wm = warp >> 1, wn = warp & 1;  // the warp's 32 x 32 quarter of the tile
        const int n0 = slab * TN;
        const int ksteps = in_dim / TK;
        const size_t x_stride = (size_t)(in_dim / 8);  // 16-byte vectors per x (dense W) row
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        const size_t w_base = (size_t)expert * out_dim;  // the expert's first weight row
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

        // This thread's global loads of one step, held in registers: x vectors i = t + 128 j
        // (row i / 8, vector i % 8: a row's 8 vectors in 8 consecutive lanes); dense W the
        // same over columns; affine4 one chunk of 32 codes (column t / 2, half t % 2) and one
        // scale (t < 64) or bias (t >= 64).
        uint4 xr[4], wr[4];
        S sb = S(0);
        auto load = [&](int ks) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int i = t + KPMOE_MMA_THREADS * j, r = i / TV, v = i % TV;
                xr[j] = r < rows ? xv[(size_t)(row0 + r) * x_stride + (size_t)ks * TV + v] : zero;
            }
            if constexpr (AFFINE) {
                const int n = t >> 1, h = t & 1;
                wr[0] = n0 + n < out_dim
                            ? w[(w_base + n0 + n) * (size_t)(in_dim / 32) + (size_t)ks * 2 + h]
                            : zero;
                const int col = t & (TN - 1);
                const S* p = t < TN ? scales : biases;
                sb = n0 + col < out_dim ? p[(w_base + n0 + col) * (size_t)(in_dim / KPMOE_GROUP)
                                            + ks] : S(0);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int i = t + KPMOE_MMA_THREADS * j, n = i / TV, v = i % TV;
                    wr[j] = n0 + n < out_dim
                                ? w[(w_base + n0 + n) * x_stride + (size_t)ks * TV + v]
                                : zero;
                }
            }
        };
        // The held loads into shared memory; affine4: the codes as T (exact), the scale or
        // bias, and each x row's sum over the step (its 8 lanes' sums in a fixed butterfly).
        auto stage = [&]() {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int i = t + KPMOE_MMA_THREADS * j, r = i / TV, v = i % TV;
                *reinterpret_cast<uint4*>(&xs[r * LD + v * 8]) = xr[j];
                if constexpr (AFFINE) {
                    float f[8];
                    V::unpack(xr[j], f);
                    float sum = 0.0f;
#pragma unroll
                    for (int k = 0; k < 8; ++k) sum += f[k];
#pragma unroll
                    for (int o = 1; o < TV; o <<= 1) sum += __shfl_xor_sync(kpmoe::FULL, sum, o);
                    if (v == 0) s_xsum[r] = sum;
                }
            }
            if constexpr (AFFINE) {
                const int n = t >> 1, h = t & 1;
                const unsigned words[4] = {wr[0].x, wr[0].y, wr[0].z, wr[0].w};
#pragma unroll
                for (int q = 0; q < 4; ++q) {  // word q: codes 8q .. 8q + 7 of the half
                    float f[8];
#pragma unroll
                    for (int k = 0; k < 8; ++k) f[k] = (float)((words[q] >> (4 * k)) & 15u);
                    *reinterpret_cast<uint4*>(&ws[n * LD + 32 * h + 8 * q]) = V::pack(f);
                }
                if (t < TN) s_scale[t] = T::load(&sb, 0);
                else s_bias[t - TN] = T::load(&sb, 0);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int i = t + KPMOE_MMA_THREADS * j, n = i / TV, v = i % TV;
                    *reinterpret_cast<uint4*>(&ws[n * LD + v * 8]) = wr[j];
                }
            }
        };

        float acc[2][4][4], part[2][4][4];  // [m16 tile][n8 tile][fragment element]
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int nj = 0; nj < 4; ++nj)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mi][nj][e] = part[mi][nj][e] = 0.0f;

        load(0);
        for (int ks = 0; ks < ksteps; ++ks) {
            __syncthreads();  // the previous step's readers are done with the shared tiles
            stage();
            __syncthreads();
            if (ks + 1 < ksteps) load(ks + 1);  // in flight during the math
#pragma unroll
            for (int kk = 0; kk < TK; kk += 16) {
                unsigned a[2][4], b[4][2];
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    const S* p = &xs[(32 * wm + 16 * mi + g) * LD + kk + 2 * c];
                    a[mi][0] = kpmoe::pair(p);
                    a[mi][1] = kpmoe::pair(p + 8 * LD);
                    a[mi][2] = kpmoe::pair(p + 8);
                    a[mi][3] = kpmoe::pair(p + 8 * LD + 8);
                }
#pragma unroll
                for (int nj = 0; nj < 4; ++nj) {
                    const S* p = &ws[(32 * wn + 8 * nj + g) * LD + kk + 2 * c];
                    b[nj][0] = kpmoe::pair(p);
                    b[nj][1] = kpmoe::pair(p + 8);
                }
#pragma unroll
                for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                    for (int nj = 0; nj < 4; ++nj) {
                        if constexpr (AFFINE)
                            kpmoe::mma<T>(part[mi][nj], a[mi], b[nj][0], b[nj][1]);
                        else
                            kpmoe::mma<T>(acc[mi][nj], a[mi], b[nj][0], b[nj][1]);
                    }
            }
            if constexpr (AFFINE) {  // the group's scale and bias, after its exact products
#pragma unroll
                for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                    for (int nj = 0; nj < 4; ++nj)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int row = 32 * wm + 16 * mi + g + 8 * (e >> 1);
                            const int col = 32 * wn + 8 * nj + 2 * c + (e & 1);
                            acc[mi][nj][e] = fmaf(s_scale[col], part[mi][nj][e],
                                                  fmaf(s_bias[col], s_xsum[row], acc[mi][nj][e]));
                            part[mi][nj][e] = 0.0f;
                        }
            }
        }

#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int nj = 0; nj < 4; ++nj)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = 32 * wm + 16 * mi + g + 8 * (e >> 1);
                    const int col = n0 + 32 * wn + 8 * nj + 2 * c + (e & 1);
                    if (row < rows && col < out_dim)
                        T::store(y, (size_t)(row0 + row) * out_dim + col, acc[mi][nj][e]);
                }
    }
}
