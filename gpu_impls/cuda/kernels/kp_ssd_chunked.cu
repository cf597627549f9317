// kparity's chunked SSD (Mamba-2's state-space-duality scan, op `ssd_chunked`,
// oracle/ssd_chunked.py): three kernels that `cuda:kp_ssd_chunked` (gpu_impls/cuda/ssd.py) runs
// in this order on one stream.
//
//   kp_ssd_cb<T>     CB[b, n, g, l, s] = C_l . B_s (N-term f32 dot) per chunk n and B/C group g,
//                    for the 64 x 64 blocks of (l, s) on or below the block diagonal: the C.B^T
//                    of a chunk, shared by the H / G heads of a group (computed once, not per head)
//   kp_ssd_state<T>  the chunk states and their passing, sequential over the chunks per
//                    (b, h, 32 columns p of the state): S_0 = h0; the state before chunk n,
//                    S_n, stored to the workspace `states`; S_{n+1} = exp(cs_last) S_n + st_n,
//                    st_n = sum_s x_s (B_s * (exp(cs_last - cs_s) dt_s)); the last S is `state`
//   kp_ssd_out<T>    y per 64 rows l of a chunk, per (b, h, 64 columns p):
//                    y_l = (C_l . S_n) exp(cs_l)
//                          + sum_{s <= l} (CB[l, s] exp(cs_l - cs_s) dt_s) x_s
//                          + D x_l, then y *= silu(z) with the gate, rounded to T once at the store
//
// The math and its rounding points are the oracle's kernel path (oracle/ssd_chunked.py
// `chunked_kernel`): dt = min(max(softplus(dt_raw + dt_bias), dt_min), dt_max) in f32 (softplus
// as log1pf(expf(z)), z above 20 taken as z, as torch and mamba_ssm's Triton do); A = -expf(A_log);
// a = dt A (rounded: __fmul_rn keeps it from being fused into the cumsum); cs = the chunk-local
// inclusive cumsum of a (a warp scan, then the warps' totals in order: a sum of the prefix in
// one fixed order, so both kernels that form it get the same bits); seg = cs_l - cs_s and its
// expf, an exact 1 on the diagonal, 0 above it and for tokens past T; the tile (CB L) dt_s; the
// chunk state's B_s (exp(cs_last - cs_s) dt_s) (the kernel path's association); the passing
// fmaf(S, exp(cs_last), st) (one rounding where the model has two: within its bound); Y_off as
// the N-term dot C.S, then times exp(cs_l), then the tile x terms added to it (Q + 1 terms summed
// in one order); D x added by fmaf; silu(z) = z / (1 + expf(-z)). Every dot is f32 operands and
// f32 CUDA-core FMAs: admitted under either value of the op's param `dots` (which lets a kernel
// round three operands to T, and does not make it). Tokens past T (the last chunk's padding) read
// x, B and C as 0 and have dt = 0; the state's decay uses cs at the last token below T.
//
// Workspace (f32, allocated by the wrapper per shape): states [B, NT, H, N, PP] (S_n transposed,
// p innermost, PP = P rounded up to 4 so that rows take float4 stores; the columns past P hold 0)
// and cb [B, NT, G, Q, Q] (row l, column s; only the blocks with s-block <= l-block are written
// and read).
//
// Geometry (256 threads = 8 warps in every kernel; grid.y is capped at 65535 by the wrapper and
// a block strides over the rest, so every loop bound below is block-uniform):
//   kp_ssd_cb     grid (ceil(T / 64), B G): the 64 rows l of row block x against each column
//                 block s <= it. Thread (lq, sq): rows 4 lq + r, columns sq + 16 c (r, c < 4).
//   kp_ssd_state  grid (ceil(P / 32), B H): chunks in order, each in sub-blocks of 64 tokens; the
//                 state's 32 x 128 (p, n) elements in registers, 4 x 4 a thread (p = 4 pq + c,
//                 n = 4 nq + d). The next sub-block's x and B rows (and the next chunk's dt_raw)
//                 are loaded into registers while this one computes.
//   kp_ssd_out    grid (ceil(T / 64), B H ceil(P / 64)): y's 64 x 64 (l, p) tile, 4 x 4 a thread
//                 (l = 4 lq + r, p = 4 pq + c); warp w owns rows 8 w .. 8 w + 7, so the diagonal
//                 block's sum over s stops at 8 w + 8.
// Shared memory (f32, rows padded by 4 floats: 16-byte aligned rows, conflict-free float4 reads):
//   kp_ssd_cb     C rows [64][132], B rows [64][132]                           66 KiB dynamic
//   kp_ssd_state  x rows [64][36], B*w rows [64][132], dt, cs, w [256]           45 KiB static
//   kp_ssd_out    C rows [64][132], S_n^T [128][68], x rows [64][68], tile [64][68],
//                 dt, cs [256]                                                103 KiB dynamic
// The sizes do not depend on the dims: N is padded to 128 (zeros), P and T are tiled.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/ssd.py checks them before any launch; the kernels trust
// them): chunk in {64, 128, 256} (sub-blocks of 64; one thread per token of a chunk for dt and
// cs); dim_n <= 128 (the padded N of every tile and of the state's registers). Any P, any N up to
// 128 and any T: 16-byte vector loads where the rows allow them (P, resp. N, a multiple of the
// vector's elements), element loads otherwise. The op's domain (checked when a case is made):
// H % G == 0, T >= 1, finite inputs. Inputs are whole device arrays (256-byte aligned), as CuPy
// allocates them; the wrapper checks 16-byte alignment.
//
// Test-only mutants: KPARITY_MUTANT_GROUP_MODULO (head h reads B/C group h % G, not
// h / (H / G)); KPARITY_MUTANT_DROP_D_SKIP (y without D x).
#include "common.cuh"

#define KP_SSD_THREADS 256  // 8 warps, every kernel
#define KP_SSD_SB 64        // tokens per sub-block (rows of every tile)
#define KP_SSD_NP 128       // N padded: the largest N
#define KP_SSD_PT 32        // state columns p per kp_ssd_state block
#define KP_SSD_PO 64        // y columns p per kp_ssd_out block
#define KP_SSD_QMAX 256     // the largest chunk
#define KP_SSD_PAD 4        // floats of padding per shared row

namespace kp_ssd_detail {

constexpr int THREADS = KP_SSD_THREADS;
constexpr int SB = KP_SSD_SB;
constexpr int NP = KP_SSD_NP;
constexpr int PT = KP_SSD_PT;
constexpr int PO = KP_SSD_PO;
constexpr int QMAX = KP_SSD_QMAX;
constexpr int LDN = NP + KP_SSD_PAD;  // floats per shared row of C or B (over n)
constexpr int LDT = PT + KP_SSD_PAD;  // x rows of kp_ssd_state
constexpr int LDO = PO + KP_SSD_PAD;  // S_n^T and x rows of kp_ssd_out
constexpr int LDQ = SB + KP_SSD_PAD;  // rows of kp_ssd_out's tile
constexpr int WARPS = THREADS / 32;
constexpr unsigned FULL = 0xffffffffu;

static_assert(THREADS >= QMAX, "one thread per token of a chunk in chunk_time");
static_assert(WARPS == 8, "the thread layouts below assume 8 warps");

// The B/C group head h reads.
__device__ __forceinline__ int group_of(int h, int heads, int groups) {
#ifdef KPARITY_MUTANT_GROUP_MODULO
    return h % groups;  // mutant: the heads of a group interleaved
#else
    return h / (heads / groups);
#endif
}

// dt = min(max(softplus(raw + bias), lo), hi) in f32.
__device__ __forceinline__ float time_step(float raw, float bias, float lo, float hi) {
    const float z = raw + bias;
    const float dt = z > 20.0f ? z : log1pf(expf(z));
    return fminf(fmaxf(dt, lo), hi);
}

// dt_t and the chunk-local inclusive cumsum cs_t of a_t = dt_t A over the chunk's first m tokens
// (thread t holds token t; `raw` its dt_raw, read for t < m only), into tdt[t] and tcs[t] for
// t < q (tdt 0 past m; tcs past m is never read). Every thread of the block calls it; it returns
// after a barrier, with tdt and tcs visible. Its first barrier orders every earlier read of
// tdt, tcs (and `scratch`) before its writes.
__device__ __forceinline__ void chunk_time(float raw, int m, int q, float A, float bias, float lo,
                                           float hi, float* tdt, float* tcs, float* scratch) {
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    float dt = 0.0f, v = 0.0f;
    if (t < m) {
        dt = time_step(raw, bias, lo, hi);
        v = __fmul_rn(dt, A);
    }
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const float u = __shfl_up_sync(FULL, v, off);
        if (lane >= off) v += u;
    }
    if (lane == 31) scratch[warp] = v;
    __syncthreads();
    float base = 0.0f;
    for (int w = 0; w < warp; ++w) base += scratch[w];
    if (t < q) {
        tdt[t] = dt;
        tcs[t] = warp ? base + v : v;
    }
    __syncthreads();
}

// A tile of ROWS x WIDTH elements of a row-major global matrix (row stride `stride` elements),
// staged in shared memory as f32 rows of `ld` floats, zero at rows >= `rows` and columns >=
// `cols`, optionally each row scaled by scale[row] (an f32 product, rounded). Vector path (`vec`:
// the base, the row stride and `cols` all multiples of the vector's Vec<T>::N elements, so a
// 16-byte vector is wholly inside or outside): fetch() issues the 16-byte loads into registers
// and commit() widens them into shared memory, so the loads can be in flight while the block
// computes. Element path (any shape): fetch() only records where, commit() loads element by
// element. Either way commit() writes every element of [ROWS][WIDTH].
template <typename T, int ROWS, int WIDTH>
struct Tile {
    typedef typename T::storage storage;
    static constexpr int VW = Vec<T>::N;
    static constexpr int VPR = WIDTH / VW;  // vectors per row
    static constexpr int PER = ROWS * VPR / THREADS;
    static_assert(WIDTH % VW == 0 && (ROWS * VPR) % THREADS == 0 && VW % 4 == 0, "tile shape");
    uint4 v[PER];
    const storage* base;
    size_t stride;
    int rows, cols;
    bool vec;

    __device__ __forceinline__ void fetch(const storage* base_, size_t stride_, int rows_,
                                          int cols_, bool vec_) {
        base = base_;
        stride = stride_;
        rows = rows_;
        cols = cols_;
        vec = vec_;
        if (!vec) return;
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int idx = threadIdx.x + k * THREADS;
            const int r = idx / VPR, c = (idx % VPR) * VW;
            v[k] = make_uint4(0u, 0u, 0u, 0u);
            if (r < rows && c < cols)
                v[k] = *reinterpret_cast<const uint4*>(base + (size_t)r * stride + c);
        }
    }

    __device__ __forceinline__ void commit(float* sm, int ld, const float* scale) const {
        if (vec) {
#pragma unroll
            for (int k = 0; k < PER; ++k) {
                const int idx = threadIdx.x + k * THREADS;
                const int r = idx / VPR, c = (idx % VPR) * VW;
                float f[VW];
                Vec<T>::unpack(v[k], f);
                if (scale) {
                    const float s = scale[r];
#pragma unroll
                    for (int e = 0; e < VW; ++e) f[e] = __fmul_rn(f[e], s);
                }
#pragma unroll
                for (int e = 0; e < VW; e += 4)
                    *reinterpret_cast<float4*>(sm + r * ld + c + e) =
                        make_float4(f[e], f[e + 1], f[e + 2], f[e + 3]);
            }
        } else {
            for (int idx = threadIdx.x; idx < ROWS * WIDTH; idx += THREADS) {
                const int r = idx / WIDTH, c = idx % WIDTH;
                float f = (r < rows && c < cols) ? T::load(base, (size_t)r * stride + c) : 0.0f;
                if (scale) f = __fmul_rn(f, scale[r]);
                sm[r * ld + c] = f;
            }
        }
    }
};

__device__ __forceinline__ void to_array(const float4 v, float (&f)[4]) {
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
}

// acc[r][c] += sum_k a[r][k] b[k][c] over four k: a[r] holds row r's four k values, b[k] row k's
// four c values (k in order).
__device__ __forceinline__ void mac_rows(float (&acc)[4][4], const float4 (&a)[4],
                                         const float4 (&b)[4]) {
    float bk[4][4];
#pragma unroll
    for (int k = 0; k < 4; ++k) to_array(b[k], bk[k]);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        float ar[4];
        to_array(a[r], ar);
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(ar[k], bk[k][c], acc[r][c]);
    }
}

}  // namespace kp_ssd_detail

// --- kp_ssd_cb: C . B^T per chunk and group ------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(KP_SSD_THREADS, 2)
kp_ssd_cb(const typename T::storage* __restrict__ Bm, const typename T::storage* __restrict__ Cm,
          float* __restrict__ cb, int batch, int tokens, int groups, int dim_n, int chunk,
          int n_chunks) {
    using namespace kp_ssd_detail;
    extern __shared__ __align__(16) float smem[];
    float* c_s = smem;            // [SB][LDN]: the block's C rows
    float* b_s = c_s + SB * LDN;  // [SB][LDN]: one column block's B rows

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int lq = 2 * warp + lane / 16, sq = lane % 16;  // rows 4 lq + r, columns sq + 16 c
    const int per = chunk / SB;
    const int n = blockIdx.x / per, j = blockIdx.x % per;  // chunk, row block in the chunk
    const int t0 = n * chunk, l0 = j * SB;
    const int m = min(chunk, tokens - t0);  // the chunk's tokens below T (> l0)
    const bool vec = dim_n % Vec<T>::N == 0;
    const size_t stride = (size_t)groups * dim_n;

    for (int u = blockIdx.y; u < batch * groups; u += gridDim.y) {
        const int b = u / groups, g = u - b * groups;
        const typename T::storage* c0 = Cm + ((size_t)b * tokens * groups + g) * dim_n;
        const typename T::storage* b0 = Bm + ((size_t)b * tokens * groups + g) * dim_n;
        float* out = cb + (((size_t)b * n_chunks + n) * groups + g) * chunk * chunk;
        __syncthreads();  // the previous (b, g)'s reads of c_s and b_s are done
        Tile<T, SB, NP> tile;
        tile.fetch(c0 + (size_t)(t0 + l0) * stride, stride, m - l0, dim_n, vec);
        tile.commit(c_s, LDN, nullptr);
        for (int i = 0; i <= j; ++i) {
            if (i) __syncthreads();  // the reads of the previous column block's b_s are done
            tile.fetch(b0 + (size_t)(t0 + i * SB) * stride, stride, m - i * SB, dim_n, vec);
            tile.commit(b_s, LDN, nullptr);
            __syncthreads();  // c_s, b_s visible
            float acc[4][4];
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
#pragma unroll 1
            for (int k = 0; k < NP; k += 4) {
                float a[4][4], bb[4][4];
#pragma unroll
                for (int r = 0; r < 4; ++r)
                    to_array(*reinterpret_cast<const float4*>(c_s + (4 * lq + r) * LDN + k), a[r]);
#pragma unroll
                for (int c = 0; c < 4; ++c)
                    to_array(*reinterpret_cast<const float4*>(b_s + (sq + 16 * c) * LDN + k),
                             bb[c]);
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int c = 0; c < 4; ++c)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[r][c] = fmaf(a[r][e], bb[c][e], acc[r][c]);
            }
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 4; ++c)
                    out[(size_t)(l0 + 4 * lq + r) * chunk + i * SB + sq + 16 * c] = acc[r][c];
        }
    }
}

// --- kp_ssd_state: chunk states and their passing ------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(KP_SSD_THREADS, 1)
kp_ssd_state(const typename T::storage* __restrict__ x,
             const typename T::storage* __restrict__ dt_raw, const float* __restrict__ A_log,
             const float* __restrict__ dt_bias, const typename T::storage* __restrict__ Bm,
             const float* __restrict__ h0, float* __restrict__ states, float* __restrict__ state,
             int batch, int tokens, int heads, int dim_p, int groups, int dim_n, int chunk,
             int n_chunks, float dt_min, float dt_max) {
    using namespace kp_ssd_detail;
    typedef typename T::storage storage;
    __shared__ __align__(16) float x_s[SB * LDT];  // the sub-block's x rows (32 columns p)
    __shared__ __align__(16) float b_s[SB * LDN];  // its B rows times w_s
    __shared__ float tdt[QMAX], tcs[QMAX], tw[QMAX], scratch[WARPS];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int pq = 4 * (warp % 2) + lane / 8, nq = 8 * (warp / 2) + lane % 8;
    const int p0 = blockIdx.x * PT;
    const int pp = (dim_p + 3) & ~3;  // the workspace's row length
    const int xcols = min(PT, dim_p - p0);
    const bool xvec = dim_p % Vec<T>::N == 0, bvec = dim_n % Vec<T>::N == 0;
    const size_t x_stride = (size_t)heads * dim_p, b_stride = (size_t)groups * dim_n;

    for (int bh = blockIdx.y; bh < batch * heads; bh += gridDim.y) {
        const int b = bh / heads, h = bh - b * heads;
        const int g = group_of(h, heads, groups);
        const float A = -expf(A_log[h]), bias = dt_bias[h];
        const storage* xh = x + ((size_t)b * tokens * heads + h) * dim_p + p0;  // + t x_stride
        const storage* bg = Bm + ((size_t)b * tokens * groups + g) * dim_n;     // + t b_stride
        const storage* dth = dt_raw + (size_t)b * tokens * heads + h;            // + t heads

        // The state S[p][n], p = p0 + 4 pq + c, n = 4 nq + d: 0 past P and N.
        float S[4][4];
#pragma unroll
        for (int c = 0; c < 4; ++c)
#pragma unroll
            for (int d = 0; d < 4; ++d) {
                const int p = p0 + 4 * pq + c, nn = 4 * nq + d;
                S[c][d] = (p < dim_p && nn < dim_n) ? h0[((size_t)bh * dim_p + p) * dim_n + nn]
                                                    : 0.0f;
            }

        // Chunk 0: its dt, cs and w, and its first sub-block staged.
        __syncthreads();  // the previous (b, h)'s reads of x_s, b_s, tw are done
        int m = min(chunk, tokens);
        float raw = threadIdx.x < m ? T::load(dth, (size_t)threadIdx.x * heads) : 0.0f;
        Tile<T, SB, PT> xt;
        Tile<T, SB, NP> bt;
        xt.fetch(xh, x_stride, min(SB, m), xcols, xvec);
        bt.fetch(bg, b_stride, min(SB, m), dim_n, bvec);
        chunk_time(raw, m, chunk, A, bias, dt_min, dt_max, tdt, tcs, scratch);
        float e;  // exp(cs_last) of the chunk being computed
        {
            const float last = tcs[m - 1];
            if (threadIdx.x < chunk)
                tw[threadIdx.x] = threadIdx.x < m
                    ? __fmul_rn(expf(last - tcs[threadIdx.x]), tdt[threadIdx.x]) : 0.0f;
            e = expf(last);
        }
        __syncthreads();  // tw visible
        xt.commit(x_s, LDT, nullptr);
        bt.commit(b_s, LDN, tw);
        __syncthreads();  // x_s, b_s visible

        for (int n = 0; n < n_chunks; ++n) {
            const int t0 = n * chunk;
            m = min(chunk, tokens - t0);
            const int nsb = (m + SB - 1) / SB;  // sub-blocks with a token below T

            // S_n, the state before chunk n, to the workspace: for each n a float4 over 4 p.
            if (p0 + 4 * pq < pp) {
                float* sn = states + (((size_t)b * n_chunks + n) * heads + h) * dim_n * pp
                            + p0 + 4 * pq;
#pragma unroll
                for (int d = 0; d < 4; ++d) {
                    const int nn = 4 * nq + d;
                    if (nn < dim_n)
                        *reinterpret_cast<float4*>(sn + (size_t)nn * pp) =
                            make_float4(S[0][d], S[1][d], S[2][d], S[3][d]);
                }
            }

            float st[4][4];
#pragma unroll
            for (int c = 0; c < 4; ++c)
#pragma unroll
                for (int d = 0; d < 4; ++d) st[c][d] = 0.0f;
            float e_next = 0.0f;
            for (int j = 0; j < nsb; ++j) {
                // The next sub-block: (n, j + 1), or (n + 1, 0), or none.
                const bool in_chunk = j + 1 < nsb;
                const bool new_chunk = !in_chunk && n + 1 < n_chunks;
                const int nt0 = in_chunk ? t0 + (j + 1) * SB : t0 + chunk;
                const int m_next = new_chunk ? min(chunk, tokens - nt0) : m;
                const int rows_next = in_chunk ? min(SB, m - (j + 1) * SB) : min(SB, m_next);
                if (in_chunk || new_chunk) {
                    xt.fetch(xh + (size_t)nt0 * x_stride, x_stride, rows_next, xcols, xvec);
                    bt.fetch(bg + (size_t)nt0 * b_stride, b_stride, rows_next, dim_n, bvec);
                }
                if (new_chunk)
                    raw = threadIdx.x < m_next
                        ? T::load(dth, (size_t)(nt0 + threadIdx.x) * heads) : 0.0f;

                // st += x^T (B w) over the sub-block's 64 rows (rows past T are 0).
#pragma unroll 4
                for (int s = 0; s < SB; ++s) {
                    float xv[4], bv[4];
                    to_array(*reinterpret_cast<const float4*>(x_s + s * LDT + 4 * pq), xv);
                    to_array(*reinterpret_cast<const float4*>(b_s + s * LDN + 4 * nq), bv);
#pragma unroll
                    for (int c = 0; c < 4; ++c)
#pragma unroll
                        for (int d = 0; d < 4; ++d) st[c][d] = fmaf(xv[c], bv[d], st[c][d]);
                }
                __syncthreads();  // every read of x_s and b_s (and of tw, by the commits) done

                if (new_chunk) {  // chunk n + 1's dt, cs, w (chunk n's are no longer read)
                    chunk_time(raw, m_next, chunk, A, bias, dt_min, dt_max, tdt, tcs, scratch);
                    const float last = tcs[m_next - 1];
                    if (threadIdx.x < chunk)
                        tw[threadIdx.x] = threadIdx.x < m_next
                            ? __fmul_rn(expf(last - tcs[threadIdx.x]), tdt[threadIdx.x]) : 0.0f;
                    e_next = expf(last);
                    __syncthreads();  // tw visible
                }
                if (in_chunk || new_chunk) {
                    xt.commit(x_s, LDT, nullptr);
                    bt.commit(b_s, LDN, tw + (in_chunk ? (j + 1) * SB : 0));
                    __syncthreads();  // x_s, b_s visible
                }
            }
            // The passing: S_{n+1} = exp(cs_last) S_n + st_n.
#pragma unroll
            for (int c = 0; c < 4; ++c)
#pragma unroll
                for (int d = 0; d < 4; ++d) S[c][d] = fmaf(S[c][d], e, st[c][d]);
            e = e_next;
        }

        // The final state.
#pragma unroll
        for (int c = 0; c < 4; ++c)
#pragma unroll
            for (int d = 0; d < 4; ++d) {
                const int p = p0 + 4 * pq + c, nn = 4 * nq + d;
                if (p < dim_p && nn < dim_n) state[((size_t)bh * dim_p + p) * dim_n + nn] = S[c][d];
            }
    }
}

// --- kp_ssd_out: y per 64 rows of a chunk --------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(KP_SSD_THREADS, 2)
kp_ssd_out(const typename T::storage* __restrict__ x,
           const typename T::storage* __restrict__ dt_raw, const float* __restrict__ A_log,
           const float* __restrict__ dt_bias, const typename T::storage* __restrict__ Cm,
           const float* __restrict__ D, const typename T::storage* __restrict__ z,
           const float* __restrict__ states, const float* __restrict__ cb,
           typename T::storage* __restrict__ y, int batch, int tokens, int heads, int dim_p,
           int groups, int dim_n, int chunk, int n_chunks, int gate, float dt_min, float dt_max) {
    using namespace kp_ssd_detail;
    typedef typename T::storage storage;
    extern __shared__ __align__(16) float smem[];
    float* c_s = smem;              // [SB][LDN]: C rows of the block's 64 rows
    float* s_s = c_s + SB * LDN;    // [NP][LDO]: S_n^T, 64 columns p
    float* x_s = s_s + NP * LDO;    // [SB][LDO]: x rows of one column block, 64 columns p
    float* q_s = x_s + SB * LDO;    // [SB][LDQ]: the tile (CB L) dt of one column block
    float* tdt = q_s + SB * LDQ;    // [QMAX]
    float* tcs = tdt + QMAX;        // [QMAX]
    float* scratch = tcs + QMAX;    // [WARPS]

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int lq = 2 * warp + lane / 16, pq = lane % 16;  // rows 4 lq + r, columns 4 pq + c
    const int per = chunk / SB;
    const int n = blockIdx.x / per, j = blockIdx.x % per;  // chunk, row block in the chunk
    const int t0 = n * chunk, l0 = j * SB;
    const int m = min(chunk, tokens - t0);  // the chunk's tokens below T (> l0)
    const int rows = min(SB, m - l0);       // the block's rows below T
    const int pp = (dim_p + 3) & ~3;
    const int ptiles = (dim_p + PO - 1) / PO;
    const bool xvec = dim_p % Vec<T>::N == 0, cvec = dim_n % Vec<T>::N == 0;
    const size_t x_stride = (size_t)heads * dim_p, c_stride = (size_t)groups * dim_n;

    for (int u = blockIdx.y; u < batch * heads * ptiles; u += gridDim.y) {
        const int b = u / (heads * ptiles), rest = u - b * heads * ptiles;
        const int h = rest / ptiles, p0 = (rest - h * ptiles) * PO;
        const int g = group_of(h, heads, groups);
        const float A = -expf(A_log[h]), bias = dt_bias[h];
        const int xcols = min(PO, dim_p - p0);
        const storage* xh = x + ((size_t)b * tokens * heads + h) * dim_p + p0;  // + t x_stride
        const storage* dth = dt_raw + (size_t)b * tokens * heads + h;            // + t heads

        __syncthreads();  // the previous (b, h, p tile)'s reads of shared memory are done
        const float raw = threadIdx.x < m ? T::load(dth, (size_t)(t0 + threadIdx.x) * heads)
                                          : 0.0f;
        Tile<T, SB, NP> ct;
        ct.fetch(Cm + (((size_t)b * tokens + t0 + l0) * groups + g) * dim_n, c_stride, rows,
                 dim_n, cvec);
        chunk_time(raw, m, chunk, A, bias, dt_min, dt_max, tdt, tcs, scratch);
        ct.commit(c_s, LDN, nullptr);
        // S_n^T: rows n < N, columns p0 .. p0 + 63 below PP; zeros elsewhere.
        const float* sn = states + (((size_t)b * n_chunks + n) * heads + h) * dim_n * pp;
        for (int idx = threadIdx.x; idx < NP * (PO / 4); idx += THREADS) {
            const int nn = idx / (PO / 4), c4 = (idx % (PO / 4)) * 4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (nn < dim_n && p0 + c4 < pp)
                v = *reinterpret_cast<const float4*>(sn + (size_t)nn * pp + p0 + c4);
            *reinterpret_cast<float4*>(s_s + nn * LDO + c4) = v;
        }
        __syncthreads();  // c_s, s_s visible

        // Y_off = (C . S_n) exp(cs_l).
        float acc[4][4];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
#pragma unroll 1
        for (int k = 0; k < NP; k += 4) {
            float4 a[4], bk[4];
#pragma unroll
            for (int r = 0; r < 4; ++r)
                a[r] = *reinterpret_cast<const float4*>(c_s + (4 * lq + r) * LDN + k);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                bk[kk] = *reinterpret_cast<const float4*>(s_s + (k + kk) * LDO + 4 * pq);
            mac_rows(acc, a, bk);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const float el = expf(tcs[l0 + 4 * lq + r]);
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[r][c] = __fmul_rn(acc[r][c], el);
        }

        // Y_diag: the column blocks i <= j of the chunk, the tile (CB L) dt_s times x_s.
        const float* cbr = cb + ((((size_t)b * n_chunks + n) * groups + g) * chunk + l0) * chunk;
        for (int i = 0; i <= j; ++i) {
            __syncthreads();  // the previous column block's reads of x_s and q_s are done
            Tile<T, SB, PO> xt;
            xt.fetch(xh + (size_t)(t0 + i * SB) * x_stride, x_stride, m - i * SB, xcols, xvec);
            // Branch-free: every element is formed and the ones above the diagonal or past T
            // are selected away (their expf may overflow: a select, never a product, drops it).
#pragma unroll 2
            for (int it = 0; it < SB * SB / 4 / THREADS; ++it) {
                const int idx = threadIdx.x + it * THREADS;
                const int l = idx / (SB / 4), s4 = (idx % (SB / 4)) * 4;
                const int lg = l0 + l;  // row and columns in the chunk
                float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if (lg < m)
                    to_array(*reinterpret_cast<const float4*>(cbr + (size_t)l * chunk + i * SB
                                                              + s4), f);
                const float cl = tcs[lg];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int sg = i * SB + s4 + e;
                    const float decay = sg == lg ? 1.0f : expf(cl - tcs[sg]);
                    const float v = __fmul_rn(__fmul_rn(f[e], decay), tdt[sg]);
                    f[e] = lg < m && sg <= lg ? v : 0.0f;  // sg <= lg < m: a token below T
                }
                *reinterpret_cast<float4*>(q_s + l * LDQ + s4) =
                    make_float4(f[0], f[1], f[2], f[3]);
            }
            xt.commit(x_s, LDO, nullptr);
            __syncthreads();  // x_s, q_s visible
            const int kmax = i == j ? 8 * warp + 8 : SB;  // warp-uniform: its rows' causal end
#pragma unroll 1
            for (int k = 0; k < kmax; k += 4) {
                float4 a[4], bk[4];
#pragma unroll
                for (int r = 0; r < 4; ++r)
                    a[r] = *reinterpret_cast<const float4*>(q_s + (4 * lq + r) * LDQ + k);
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)
                    bk[kk] = *reinterpret_cast<const float4*>(x_s + (k + kk) * LDO + 4 * pq);
                mac_rows(acc, a, bk);
            }
        }

        // D x (x_s holds the diagonal block: the block's own rows), the gate, one rounding.
        const float dh = D[h];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int l = 4 * lq + r;
            if (l >= rows) continue;
            const size_t row = ((size_t)b * tokens + t0 + l0 + l) * heads + h;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int p = p0 + 4 * pq + c;
                if (p >= dim_p) continue;
#ifdef KPARITY_MUTANT_DROP_D_SKIP
                float v = acc[r][c];  // mutant: the D skip dropped
                (void)dh;
#else
                float v = fmaf(dh, x_s[l * LDO + 4 * pq + c], acc[r][c]);
#endif
                if (gate) {
                    const float zv = T::load(z, row * dim_p + p);
                    v = v * (zv / (1.0f + expf(-zv)));
                }
                T::store(y, row * dim_p + p, v);
            }
        }
    }
}
