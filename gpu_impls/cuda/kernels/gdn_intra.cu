// The intra-chunk stages of Gated DeltaNet's chunked pipeline (oracle/gdn_chunked.py; issue 29),
// kparity's own kernels, one per stage op, on CUDA cores in f32 (gpu_impls/cuda/gdn_intra.py):
//
//   kp_gdn_chunk_cumsum<T, C>  gc[t, h] = sum_{m <= i} g[n C + m, h]           (t = n C + i)
//   kp_gdn_kkt<T, C>           A[t, h, j] = beta_i (k_i . k_j) exp(gc_i - gc_j) for j < i, else 0
//   kp_gdn_solve_tril<T, C>    Ai = (I + L)^-1 per chunk, L = A's strictly lower part, stored in T
//   kp_gdn_wy<T, C>            w = Ai @ T(k beta exp(gc)), u = Ai @ T(v beta), stored in T
//
// C (the chunk: 16, 32, 64) is a template argument; T the storage trait of k, v, Ai, w, u (g,
// gc, beta, A are f32 whatever T is). i, j are token indices local to a chunk; `valid` = min(C,
// T - n C) the chunk's tokens below T: rows past it are the oracle's zero padding (k, v, beta, g
// zero: they add nothing) and are never stored. Layouts (elements, innermost last): k
// [B, T, Hk, K]; v [B, T, Hv, V]; g, gc, beta [B, T, Hv]; A, Ai [B, T, Hv, C]; w [B, T, Hv, K];
// u [B, T, Hv, V]. Value head h reads k head h / (Hv / Hk).
//
// Numerics (the oracle's kernel models admit each): f32 throughout; every dot a chain of fmaf in
// ascending index order (the models: any order); expf of the f32 DIFFERENCE gc_i - gc_j, never a
// product of exps; masked entries selected to an exact 0 (never multiplied: exp(gc_i - gc_j)
// above the diagonal may overflow). CuPy compiles with -ftz=true (the runner's oracle knows).
//
// Geometry (the wrapper derives it; grid.y is capped at 65535 there and a block strides over the
// further chunks: every loop holding a __syncthreads is block-uniform):
//   cumsum  flat: one thread per (b, chunk, h), h fastest (coalesced along Hv), 128 a block; the
//           chunk's C loads issued at once (C is a template argument), then the sequential sum.
//   kkt     grid (B * Hk, NT): one block per (k head, chunk) for ALL the value heads that read
//           that k head (k_i . k_j is theirs in common: computed once, scaled per value head).
//           The k tile in shared memory as f32, transposed (kT[k][row], so that 4 consecutive
//           rows at one k are one float4); each thread one 4 x 4 tile of the dot matrix, the
//           lower triangle's tiles packed onto the threads (tri_threads(C): 32 / 64 / 160);
//           then D (the dots, aliasing kT) and, per value head, A's rows written whole (zeros
//           included), float4 along j. Dynamic shared memory: (max(K, C) (C + 4) + 2 C) floats.
//   solve   grid (B * Hv, NT): one block per (value head, chunk); right-looking substitution: X
//           starts as I, and at step m (rows sequential, C - 1 steps and barriers) every row
//           i > m takes X[i, :m+1] -= L[i, m] X[m, :m+1]; X[i, j] is then the dot
//           -sum_{j <= m < i} L[i, m] X[m, j] in ascending m. Each thread holds one 4 x 4 tile of
//           X in registers (the lower triangle's tiles packed, as kkt's); row m + 1 is final
//           after step m and its owners publish it to shared memory for step m + 1. Static
//           shared memory: 2 C (C + 4) floats (34816 bytes at C = 64).
//   wy      grid (B * Hv * tiles, NT), tiles = ceil(K / 64) + ceil(V / 64): one block per (value
//           head, 64 columns of w or of u, chunk). Ai's lower part transposed in shared memory
//           (AiT[j][i]), the block's columns of the operand rounded to T, as f32; each thread 4
//           rows x 8 columns (two float4 groups 32 columns apart: conflict-free reads), the sum
//           over j <= i only (Ai is unit lower triangular: its upper part is ignored, its terms
//           would be exact zeros). Static shared memory: (C (C + 4) + 64 C + C) floats.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/gdn_intra.py checks them before any launch; the kernels
// trust them): kkt and wy: K % 4 == 0 (k read 4 elements a vector, aligned), wy: V % 4 == 0;
// kkt's dynamic shared memory within the per-block opt-in limit (227 KiB); blockDim.x ==
// tri_threads(C) for kkt and solve (a thread per lower tile), wy_threads(C) for wy; Hv % Hk == 0
// (the op's domain).
//
// Test-only mutant: KPARITY_MUTANT_DECAY_SIGN applies kkt's decay as exp(gc_j - gc_i).
#include "common.cuh"

#define GDN_CUMSUM_THREADS 128
#define GDN_WY_BN 64     // wy: output columns per block
#define GDN_WY_COLS 8    // wy: output columns per thread (two float4 groups, BN / 2 apart)

namespace gdn_intra_detail {

// Tiles of 4 x 4 in the lower triangle (diagonal tiles included) of a (C / 4) x (C / 4) grid,
// and the threads that hold one each (whole warps).
__host__ __device__ constexpr int lower_tiles(int c) { return (c / 4) * (c / 4 + 1) / 2; }
__host__ __device__ constexpr int tri_threads(int c) { return (lower_tiles(c) + 31) / 32 * 32; }
__host__ __device__ constexpr int wy_threads(int c) {
    return (c / 4) * (GDN_WY_BN / GDN_WY_COLS);
}

// The tile p of the packed lower triangle, row by row: p = ti (ti + 1) / 2 + tj, tj <= ti.
__device__ __forceinline__ void lower_tile(int p, int& ti, int& tj) {
    ti = 0;
    while ((ti + 1) * (ti + 2) / 2 <= p) ++ti;
    tj = p - ti * (ti + 1) / 2;
}

// 4 consecutive elements of T at p (4-element aligned: 16 bytes in f32, 8 in f16 / bf16),
// widened to f32 (exact).
template <typename T>
__device__ __forceinline__ float4 load4(const typename T::storage* p) {
    if constexpr (sizeof(typename T::storage) == 4) {
        return *reinterpret_cast<const float4*>(p);
    } else {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
        return make_float4(T::to_f32((unsigned short)(w.x & 0xffffu)),
                           T::to_f32((unsigned short)(w.x >> 16)),
                           T::to_f32((unsigned short)(w.y & 0xffffu)),
                           T::to_f32((unsigned short)(w.y >> 16)));
    }
}

// 4 f32 values rounded to T (RNE) and stored at p (4-element aligned).
template <typename T>
__device__ __forceinline__ void store4(typename T::storage* p, float4 v) {
    if constexpr (sizeof(typename T::storage) == 4) {
        *reinterpret_cast<float4*>(p) = v;
    } else {
        uint2 w;
        w.x = (unsigned)T::from_f32(v.x) | ((unsigned)T::from_f32(v.y) << 16);
        w.y = (unsigned)T::from_f32(v.z) | ((unsigned)T::from_f32(v.w) << 16);
        *reinterpret_cast<uint2*>(p) = w;
    }
}

__device__ __forceinline__ float at(const float4& v, int q) {
    return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;  // q a compile-time constant
}

// kkt's decay between token i (the row) and token j < i of one chunk.
__device__ __forceinline__ float decay(float gc_i, float gc_j) {
#ifdef KPARITY_MUTANT_DECAY_SIGN
    return expf(gc_j - gc_i);  // mutant: the ratio inverted (>= 1, may overflow)
#else
    return expf(gc_i - gc_j);  // the f32 difference, then its exp (the oracle's order)
#endif
}

}  // namespace gdn_intra_detail

// --- gdn_chunk_cumsum ----------------------------------------------------------------------------

template <typename T, int C>
__global__ void __launch_bounds__(GDN_CUMSUM_THREADS)
kp_gdn_chunk_cumsum(const float* __restrict__ g, float* __restrict__ gc, int tokens, int heads_v,
                    int n_chunks, int total) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;  // (b * NT + n) * Hv + h
    if (idx >= total) return;
    const int h = idx % heads_v, bn = idx / heads_v;
    const int n = bn % n_chunks, b = bn / n_chunks;
    const int t0 = n * C, valid = min(C, tokens - t0);
    const size_t base = ((size_t)b * tokens + t0) * heads_v + h;
    float x[C];
#pragma unroll
    for (int i = 0; i < C; ++i) x[i] = i < valid ? g[base + (size_t)i * heads_v] : 0.0f;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < C; ++i) {
        acc += x[i];  // sequential, ascending i
        if (i < valid) gc[base + (size_t)i * heads_v] = acc;
    }
}

// --- gdn_kkt -------------------------------------------------------------------------------------

// (minBlocksPerSM 1: with the thread count alone ptxas capped kkt at 48 registers and spilled)
template <typename T, int C>
__global__ void __launch_bounds__(gdn_intra_detail::tri_threads(C), 1)
kp_gdn_kkt(const typename T::storage* __restrict__ k, const float* __restrict__ beta,
           const float* __restrict__ gc, float* __restrict__ A, int tokens, int heads_k,
           int heads_v, int dim_k, int n_chunks) {
    using namespace gdn_intra_detail;
    constexpr int S = C + 4;  // row stride of kT and D, in floats (a multiple of 4: float4 rows)
    extern __shared__ __align__(16) float smem[];
    float* kT = smem;                    // [K][S]: kT[k][r] = k[t0 + r, kh, k], 0 past T
    float* D = smem;                     // [C][S]: the dots, once kT is no longer read
    float* gs = smem + max(dim_k, C) * S;  // [C]: gc of the chunk's tokens, one value head
    float* bs = gs + C;                  // [C]: beta, likewise
    const int group = heads_v / heads_k;
    const int b = blockIdx.x / heads_k, kh = blockIdx.x - b * heads_k;
    const int tid = threadIdx.x, k4s = dim_k / 4;
    const bool owner = tid < lower_tiles(C);  // holds one tile of the dot matrix
    int ti = 0, tj = 0;
    if (owner) lower_tile(tid, ti, tj);
    const int i0 = 4 * ti, j0 = 4 * tj;

    for (int n = blockIdx.y; n < n_chunks; n += gridDim.y) {
        const int t0 = n * C, valid = min(C, tokens - t0);
        const size_t tok0 = (size_t)b * tokens + t0;

        // 1. The chunk's k rows, f32, transposed. A warp loads 8 rows x 4 vectors (full 32-byte
        // sectors of each row) and stores them 2-way bank-conflicted at worst.
        for (int e = tid; e < C * k4s; e += blockDim.x) {
            const int rb = e / (8 * k4s), rem = e - rb * 8 * k4s;
            const int k4 = rem >> 3, r = rb * 8 + (rem & 7);
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < valid) x = load4<T>(k + ((tok0 + r) * heads_k + kh) * dim_k + 4 * k4);
            kT[(4 * k4 + 0) * S + r] = x.x;
            kT[(4 * k4 + 1) * S + r] = x.y;
            kT[(4 * k4 + 2) * S + r] = x.z;
            kT[(4 * k4 + 3) * S + r] = x.w;
        }
        __syncthreads();

        // 2. The dots of the thread's tile: rows i0.., columns j0.. (j0 <= i0), all K terms.
        float acc[4][4];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
        if (owner) {
#pragma unroll 4
            for (int kk = 0; kk < dim_k; ++kk) {
                const float4 a = *reinterpret_cast<const float4*>(kT + kk * S + i0);
                const float4 bb = *reinterpret_cast<const float4*>(kT + kk * S + j0);
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(at(a, r), at(bb, c), acc[r][c]);
            }
        }
        __syncthreads();  // every read of kT done: D overwrites it
        if (owner) {
#pragma unroll
            for (int r = 0; r < 4; ++r)
                *reinterpret_cast<float4*>(D + (i0 + r) * S + j0) =
                    make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        }

        // 3. Per value head of the group: A's rows t0 + i (i < valid), all C columns.
        for (int g = 0; g < group; ++g) {
            const int h = kh * group + g;
            for (int i = tid; i < C; i += blockDim.x) {
                const bool ok = i < valid;
                const size_t gi = (tok0 + i) * heads_v + h;
                gs[i] = ok ? gc[gi] : 0.0f;
                bs[i] = ok ? beta[gi] : 0.0f;
            }
            __syncthreads();  // D (first head), gs and bs written
            for (int e = tid; e < valid * (C / 4); e += blockDim.x) {
                const int i = e / (C / 4), j = 4 * (e - i * (C / 4));
                const float4 d = *reinterpret_cast<const float4*>(D + i * S + j);
                const float gi = gs[i], bi = bs[i];
                // D above the diagonal is unwritten or unused: selected away, never read into A
                const float4 out = make_float4(
                    j + 0 < i ? bi * d.x * decay(gi, gs[j + 0]) : 0.0f,
                    j + 1 < i ? bi * d.y * decay(gi, gs[j + 1]) : 0.0f,
                    j + 2 < i ? bi * d.z * decay(gi, gs[j + 2]) : 0.0f,
                    j + 3 < i ? bi * d.w * decay(gi, gs[j + 3]) : 0.0f);
                *reinterpret_cast<float4*>(A + ((tok0 + i) * heads_v + h) * C + j) = out;
            }
            __syncthreads();  // gs, bs (and after the last head D) read before they are rewritten
        }
    }
}

// --- gdn_solve_tril ------------------------------------------------------------------------------

template <typename T, int C>
__global__ void __launch_bounds__(gdn_intra_detail::tri_threads(C))
kp_gdn_solve_tril(const float* __restrict__ A, typename T::storage* __restrict__ Ai, int tokens,
                  int heads_v, int n_chunks) {
    using namespace gdn_intra_detail;
    constexpr int S = C + 4;
    __shared__ __align__(16) float Lt[C * S];  // Lt[m][i] = A[i][m] for m < i, else 0
    __shared__ __align__(16) float X[C * S];   // X's rows, each published once final
    const int b = blockIdx.x / heads_v, h = blockIdx.x - b * heads_v;
    const int tid = threadIdx.x;
    const bool owner = tid < lower_tiles(C);  // holds one 4 x 4 tile of X in registers
    int ti = 0, tj = 0;
    if (owner) lower_tile(tid, ti, tj);
    const int i0 = 4 * ti, j0 = 4 * tj;
    const size_t row = (size_t)heads_v * C;  // one token's stride in A and Ai

    for (int n = blockIdx.y; n < n_chunks; n += gridDim.y) {
        const int t0 = n * C, valid = min(C, tokens - t0);
        const size_t base = ((size_t)b * tokens + t0) * row + (size_t)h * C;

        // 1. L = A's strictly lower part, transposed (rows past T: 0, the oracle's padding).
        for (int e = tid; e < C * (C / 4); e += blockDim.x) {
            const int rb = e / (2 * C), rem = e - rb * 2 * C;  // 8 rows x C / 4 vectors
            const int m = 4 * (rem >> 3), i = rb * 8 + (rem & 7);
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i < valid) a = *reinterpret_cast<const float4*>(A + base + (size_t)i * row + m);
            Lt[(m + 0) * S + i] = m + 0 < i ? a.x : 0.0f;
            Lt[(m + 1) * S + i] = m + 1 < i ? a.y : 0.0f;
            Lt[(m + 2) * S + i] = m + 2 < i ? a.z : 0.0f;
            Lt[(m + 3) * S + i] = m + 3 < i ? a.w : 0.0f;
        }
        float x[4][4];  // X[i0 + r][j0 + c], starting as I
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int c = 0; c < 4; ++c) x[r][c] = i0 + r == j0 + c ? 1.0f : 0.0f;
        if (owner && ti == 0)  // row 0 of X is e_0, final from the start (tile (0, 0))
            *reinterpret_cast<float4*>(X + j0) = make_float4(x[0][0], x[0][1], x[0][2], x[0][3]);
        __syncthreads();

        // 2. Step m: rows i > m take -L[i][m] X[m][j] for j <= m (X[m][j] = 0 for j > m).
        for (int m = 0; m < C - 1; ++m) {
            if (owner && i0 + 3 > m && j0 <= m) {
                const float4 l = *reinterpret_cast<const float4*>(Lt + m * S + i0);
                const float4 xm = *reinterpret_cast<const float4*>(X + m * S + j0);
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int c = 0; c < 4; ++c)
                        if (i0 + r > m && j0 + c <= m)
                            x[r][c] = fmaf(-at(l, r), at(xm, c), x[r][c]);
            }
            const int r1 = m + 1 - i0;  // row m + 1 is final now: its tiles' owners publish it
            if (owner && r1 >= 0 && r1 < 4) {
#pragma unroll
                for (int r = 0; r < 4; ++r)
                    if (r == r1)
                        *reinterpret_cast<float4*>(X + (m + 1) * S + j0) =
                            make_float4(x[r][0], x[r][1], x[r][2], x[r][3]);
            }
            __syncthreads();  // row m + 1 visible before step m + 1 reads it
        }

        // 3. Ai's rows t0 + i (i < valid), all C columns: X on and below the diagonal (every
        // such entry published), exact 0 above it (X there unwritten: selected away).
        for (int e = tid; e < valid * (C / 4); e += blockDim.x) {
            const int i = e / (C / 4), j = 4 * (e - i * (C / 4));
            const float4 v = *reinterpret_cast<const float4*>(X + i * S + j);
            store4<T>(Ai + base + (size_t)i * row + j,
                      make_float4(j + 0 <= i ? v.x : 0.0f, j + 1 <= i ? v.y : 0.0f,
                                  j + 2 <= i ? v.z : 0.0f, j + 3 <= i ? v.w : 0.0f));
        }
        __syncthreads();  // X and Lt read before the next chunk rewrites them
    }
}

// --- gdn_wy --------------------------------------------------------------------------------------

template <typename T, int C>
__global__ void __launch_bounds__(gdn_intra_detail::wy_threads(C))
kp_gdn_wy(const typename T::storage* __restrict__ k, const typename T::storage* __restrict__ v,
          const float* __restrict__ beta, const float* __restrict__ gc,
          const typename T::storage* __restrict__ Ai, typename T::storage* __restrict__ w,
          typename T::storage* __restrict__ u, int tokens, int heads_k, int heads_v, int dim_k,
          int dim_v, int w_tiles, int tiles, int n_chunks) {
    using namespace gdn_intra_detail;
    using storage = typename T::storage;
    constexpr int S = C + 4;
    constexpr int BN = GDN_WY_BN, HALF = GDN_WY_BN / 2;
    __shared__ __align__(16) float AiT[C * S];  // AiT[j][i] = Ai[i][j] for j <= i, else 0
    __shared__ __align__(16) float op[C * BN];  // op[j][c]: the operand's column c0 + c, in T
    __shared__ float s[C];                      // beta_j exp(gc_j) (w) or beta_j (u)
    const int bh = blockIdx.x / tiles, tile = blockIdx.x - bh * tiles;
    const int b = bh / heads_v, h = bh - b * heads_v;
    const int kh = h / (heads_v / heads_k);
    const bool is_w = tile < w_tiles;
    const int dim = is_w ? dim_k : dim_v;
    const int c0 = (is_w ? tile : tile - w_tiles) * BN;
    const int width = min(BN, dim - c0);  // a multiple of 4
    // the operand's source rows: k [B, T, Hk, K] at head kh, or v [B, T, Hv, V] at head h
    const storage* src = is_w ? k : v;
    const size_t src_row = is_w ? (size_t)heads_k * dim_k : (size_t)heads_v * dim_v;
    const size_t src_col = (is_w ? (size_t)kh * dim_k : (size_t)h * dim_v) + c0;
    storage* dst = is_w ? w : u;  // w [B, T, Hv, K], u [B, T, Hv, V]
    const size_t dst_row = (size_t)heads_v * dim, dst_col = (size_t)h * dim + c0;
    const size_t ai_row = (size_t)heads_v * C;
    const int tid = threadIdx.x;

    for (int n = blockIdx.y; n < n_chunks; n += gridDim.y) {
        const int t0 = n * C, valid = min(C, tokens - t0);
        const size_t tok0 = (size_t)b * tokens + t0;

        // 1. The per-token factor (0 past T) and Ai's lower part, transposed.
        for (int j = tid; j < C; j += blockDim.x) {
            float f = 0.0f;
            if (j < valid) {
                const size_t gi = (tok0 + j) * heads_v + h;
                f = is_w ? beta[gi] * expf(gc[gi]) : beta[gi];
            }
            s[j] = f;
        }
        for (int e = tid; e < C * (C / 4); e += blockDim.x) {
            const int rb = e / (2 * C), rem = e - rb * 2 * C;  // 8 rows x C / 4 vectors
            const int j = 4 * (rem >> 3), i = rb * 8 + (rem & 7);
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i < valid) a = load4<T>(Ai + (tok0 + i) * ai_row + (size_t)h * C + j);
            AiT[(j + 0) * S + i] = j + 0 <= i ? a.x : 0.0f;
            AiT[(j + 1) * S + i] = j + 1 <= i ? a.y : 0.0f;
            AiT[(j + 2) * S + i] = j + 2 <= i ? a.z : 0.0f;
            AiT[(j + 3) * S + i] = j + 3 <= i ? a.w : 0.0f;
        }
        __syncthreads();  // s ready

        // 2. The operand: op[j][c] = T(x[t0 + j][c0 + c] * s_j), 0 past T and past the columns.
        for (int e = tid; e < C * (BN / 4); e += blockDim.x) {
            const int j = e / (BN / 4), c = 4 * (e - j * (BN / 4));
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (j < valid && c < width) {
                x = load4<T>(src + (tok0 + j) * src_row + src_col + c);
                const float f = s[j];
                x = make_float4(T::round(x.x * f), T::round(x.y * f), T::round(x.z * f),
                                T::round(x.w * f));
            }
            *reinterpret_cast<float4*>(op + j * BN + c) = x;
        }
        __syncthreads();

        // 3. The thread's rows i0.. and columns cc.. and cc + HALF..: sum_{j <= i} Ai[i][j]
        // op[j][c] (terms past row i are AiT's zeros; rows past T are not computed).
        for (int item = tid; item < (C / 4) * (BN / GDN_WY_COLS); item += blockDim.x) {
            const int ri = item / (BN / GDN_WY_COLS), ci = item - ri * (BN / GDN_WY_COLS);
            const int i0 = 4 * ri, cc = 4 * ci;
            if (i0 >= valid || cc >= width) continue;
            float acc[4][8];
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 8; ++c) acc[r][c] = 0.0f;
            const int j_end = min(i0 + 4, valid);
#pragma unroll 2
            for (int j = 0; j < j_end; ++j) {
                const float4 a = *reinterpret_cast<const float4*>(AiT + j * S + i0);
                const float4 o0 = *reinterpret_cast<const float4*>(op + j * BN + cc);
                const float4 o1 = *reinterpret_cast<const float4*>(op + j * BN + cc + HALF);
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        acc[r][c] = fmaf(at(a, r), at(o0, c), acc[r][c]);
                        acc[r][c + 4] = fmaf(at(a, r), at(o1, c), acc[r][c + 4]);
                    }
            }
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                if (i0 + r >= valid) break;
                storage* p = dst + (tok0 + i0 + r) * dst_row + dst_col;
                store4<T>(p + cc, make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
                if (cc + HALF < width)
                    store4<T>(p + cc + HALF,
                              make_float4(acc[r][4], acc[r][5], acc[r][6], acc[r][7]));
            }
        }
        __syncthreads();  // AiT, op and s read before the next chunk rewrites them
    }
}
