// kp_gdn_chunk_h<T, KP>: kparity's inter-chunk stage of Gated DeltaNet's chunked pipeline (op
// `gdn_chunk_h`, oracle/gdn_chunked.py `chunk_h_stage`; FLA's `chunk_gated_delta_rule_fwd_h`),
// and kp_gdn_l2norm<T>, the l2 normalisation of q and k that the composition runs first.
//
// Per (batch b, value head h), kh = h / (Hv / Hk) the k head, the f32 state S [V, K] (V-major)
// starts at h0 and crosses the chunks in order, n = 0 .. NT - 1, the chunk's rows i < C
// (t = n C + i), `last` the chunk's last token below T, exactly the oracle's rounding points:
//
//   h[n]        = T(S)                                   stored (the state BEFORE chunk n)
//   v_new[i, v] = u[i, v] - sum_k w[i, k] T(S)[v, k]     f32 dot of T operands, stored in T
//   vdec[i, v]  = T(v_new[i, v] * exp(gc_last - gc_i))   v_new in f32 (before its store); 0 past T
//   S[v, k]     = exp(gc_last) S[v, k] + sum_i vdec[i, v] k[i, k]        f32
//
// and the final S is the `state` output (f32). Rows past T (the last chunk's padding) read w, u
// and k as 0 and give vdec = 0, as the oracle's zero padding; gc_last is gc at `last`.
//
// Geometry: grid (ceil(V / 32), min(B * Hv, 65535)), 256 threads = 8 warps. A block owns the 32
// state rows [32 x, 32 x + 32) of one (b, h) (rows past V held at 0, never stored) for the whole
// sequence: the chunk loop is sequential, so this is the pipeline's critical path, and the
// parallelism is the (V tile, b, h) blocks (128 at B = 1, Hv = 32, V = 128: one per SM). Past
// 65535 on grid.y a block strides over (b, h).
//
// The state lives in registers: warp w owns rows 4 w .. 4 w + 3, lane l the elements
// k = l + 32 j, j < KP / 32 (KP: K padded to an instance, 32 / 64 / 128 / 256; the elements past
// K are 0 and never stored). Shared memory (dynamic, f32, rows padded by 4 floats so that rows
// are 16-byte aligned and consecutive rows start 4 banks apart):
//   w_s [C][KP + 4]   chunk n's w rows    } staged from global as 16-byte vectors, widened to
//   k_s [C][KP + 4]   chunk n's k rows    } f32 once; chunk n + 1's are loaded into registers
//                                           while chunk n computes (the loads' latency hidden)
//   sh_s [32][KP + 4] T(S), the block's 32 rows
//   vd_s [C][36]      vdec, the chunk's C rows x 32 columns
// (2 C + 32)(KP + 4) + 36 C floats: 91.5 KiB at C = 64, KP = 128; 171.5 KiB at KP = 256.
//
// Per chunk, three barriers:
//   (1) T(S) from registers to sh_s and to h[n] (a warp stores 32 consecutive k of a row).
//       -- barrier A: sh_s and the staged tiles visible; then chunk n + 1's loads are issued
//   (2) v_new: thread (warp w, lane l) computes rows i = 8 w + 2 (l / 8) + a, a < 2, columns
//       v = l % 8 + 8 r, r < 4 (8 outputs) over K in float4 steps: per step 2 w_s and 4 sh_s
//       float4 loads for 32 FMAs, both conflict-free (rows 2 apart: 8 banks apart; rows 1 apart:
//       4 banks). Warps with 8 w >= C (chunks of 16 / 32) sit it out. It stores v_new (T) and
//       writes vdec to vd_s.
//       -- barrier B: vd_s visible
//   (3) S = exp(gc_last) S + vdec^T k: per row i one broadcast float4 of vd_s (the warp's 4
//       rows) and KP / 32 conflict-free loads of k_s, 4 KP / 32 FMAs.
//       -- barrier C: every read of w_s, k_s, sh_s, vd_s of this chunk done; then chunk n + 1's
//          staged registers are widened into w_s, k_s (made visible by the next barrier A).
// CUDA-core f32 FMAs throughout (the products of T-rounded operands accumulated in f32: the
// bound's gamma_{K+1} and gamma_{C+1}); expf (2 ULPs), as the bound charges.
//
// Layouts (elements, innermost last): k [B, T, Hk, K]; w [B, T, Hv, K]; u, v_new [B, T, Hv, V];
// gc [B, T, Hv] f32; h0, state [B, Hv, V, K] f32; h [B, NT, Hv, V, K].
//
// DISPATCH INVARIANTS (gpu_impls/cuda/gdn_chunk_h.py checks them before any launch; the kernel
// trusts them): K % 8 == 0 (rows of k and w start on 16-byte boundaries: the 16-byte staging
// loads), K <= KP (the instance: KP / 32 elements of each of a lane's 4 rows in registers), the
// dynamic shared memory above. The op's domain (checked when a case is made): chunk in
// {16, 32, 64} (C % 8 == 0: a warp's 8 rows of (2) are all in or all out), T >= 1,
// Hv % Hk == 0. Inputs are whole device arrays (256-byte aligned), as CuPy allocates them.
//
// Test-only mutant: KPARITY_MUTANT_UNSCALED_STATE carries the state into the next chunk without
// exp(gc_last): S = S + vdec^T k.
//
// kp_gdn_l2norm<T>: y = T(x * rsqrt(sum x^2 + eps)) per row of the last axis (oracle
// gdn_math.l2norm, then the store: oracle.gdn_chunked.normalised), the sum of squares in f32; a
// warp per row, 8 rows per block. y may be x (each element is read, then written, by one lane).
#include "common.cuh"

#define KP_GDN_H_THREADS 256  // 8 warps
#define KP_GDN_H_BV 32        // state rows (V) per block
#define KP_GDN_H_CMAX 64      // the largest chunk
#define KP_GDN_H_PAD 4        // floats of padding per shared row of w_s, k_s, sh_s
#define KP_GDN_H_VLD 36       // floats per vd_s row: BV + 4 (vdec writes conflict-free)
#define KP_GDN_L2_WARPS 8     // kp_gdn_l2norm: rows per block

namespace kp_gdn_chunk_h_detail {

constexpr int THREADS = KP_GDN_H_THREADS;
constexpr int BV = KP_GDN_H_BV;
constexpr int CMAX = KP_GDN_H_CMAX;
constexpr int VLD = KP_GDN_H_VLD;

// Chunk n + 1's w and k rows as raw 16-byte vectors, loaded while chunk n computes.
template <typename T, int KP>
struct Tiles {
    static constexpr int VW = Vec<T>::N;                               // elements per vector
    static constexpr int PER = (CMAX * KP / VW + THREADS - 1) / THREADS;  // vectors per thread
    uint4 w[PER], k[PER];
};

// A chunk's per-thread scalars for (2) and (3): u at the thread's 2 x 4 outputs (raw T), gc at
// its 2 rows, gc at the chunk's last valid token.
template <typename T>
struct Rows {
    typename T::storage u[2][4];
    float g[2];
    float g_last;
};

// Where a (b, h, V tile) block reads and writes; all offsets in elements.
struct Block {
    int b, h, kh, v0;
};

// Issue the loads of chunk n: its w and k rows (rows past T: zero), and this thread's u and gc.
// `rows0`: the thread's first row of (2); `in2`: whether its warp takes part in (2).
template <typename T, int KP>
__device__ __forceinline__ void load_chunk(Tiles<T, KP>& tl, Rows<T>& rw,
                                           const typename T::storage* __restrict__ k,
                                           const typename T::storage* __restrict__ w,
                                           const typename T::storage* __restrict__ u,
                                           const float* __restrict__ gc, const Block& bk, int n,
                                           int tokens, int heads_k, int heads_v, int dim_k,
                                           int dim_v, int chunk, int rows0, int vg, bool in2) {
    using TL = Tiles<T, KP>;
    const int t0 = n * chunk;
    const int valid = min(chunk, tokens - t0);  // rows of this chunk below T (>= 1)
    const size_t tok0 = (size_t)bk.b * tokens + t0;  // [B, T] index of row 0
    const int row_vecs = dim_k / TL::VW;
    const typename T::storage* w0 = w + (tok0 * heads_v + bk.h) * dim_k;
    const typename T::storage* k0 = k + (tok0 * heads_k + bk.kh) * dim_k;
    const size_t w_stride = (size_t)heads_v * dim_k, k_stride = (size_t)heads_k * dim_k;
#pragma unroll
    for (int s = 0; s < TL::PER; ++s) {
        const int idx = threadIdx.x + s * THREADS;
        const int row = idx / row_vecs, col = (idx - row * row_vecs) * TL::VW;
        tl.w[s] = tl.k[s] = make_uint4(0u, 0u, 0u, 0u);
        if (row < valid) {
            tl.w[s] = *reinterpret_cast<const uint4*>(w0 + row * w_stride + col);
            tl.k[s] = *reinterpret_cast<const uint4*>(k0 + row * k_stride + col);
        }
    }
#pragma unroll
    for (int a = 0; a < 2; ++a) {
        const int i = rows0 + a;
        const bool ok = in2 && i < valid;
        rw.g[a] = ok ? gc[(tok0 + i) * heads_v + bk.h] : 0.0f;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int v = bk.v0 + vg + 8 * r;
            rw.u[a][r] = (ok && v < dim_v) ? u[((tok0 + i) * heads_v + bk.h) * dim_v + v]
                                           : typename T::storage(0);
        }
    }
    rw.g_last = gc[(tok0 + valid - 1) * heads_v + bk.h];
}

// The staged rows widened to f32 into w_s, k_s: rows 0 .. chunk - 1 (those past T as zeros);
// the columns past dim_k are never written (zero since the kernel's start).
template <typename T, int KP>
__device__ __forceinline__ void store_tiles(const Tiles<T, KP>& tl, float* w_s, float* k_s,
                                            int dim_k, int chunk) {
    using TL = Tiles<T, KP>;
    constexpr int LD = KP + KP_GDN_H_PAD;
    const int row_vecs = dim_k / TL::VW;
#pragma unroll
    for (int s = 0; s < TL::PER; ++s) {
        const int idx = threadIdx.x + s * THREADS;
        const int row = idx / row_vecs, col = (idx - row * row_vecs) * TL::VW;
        if (row < chunk) {
            float fw[TL::VW], fk[TL::VW];
            Vec<T>::unpack(tl.w[s], fw);
            Vec<T>::unpack(tl.k[s], fk);
#pragma unroll
            for (int q = 0; q < TL::VW; q += 4) {
                *reinterpret_cast<float4*>(w_s + row * LD + col + q) =
                    make_float4(fw[q], fw[q + 1], fw[q + 2], fw[q + 3]);
                *reinterpret_cast<float4*>(k_s + row * LD + col + q) =
                    make_float4(fk[q], fk[q + 1], fk[q + 2], fk[q + 3]);
            }
        }
    }
}

__device__ __forceinline__ float dot4(float acc, const float4 a, const float4 b) {
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

}  // namespace kp_gdn_chunk_h_detail

template <typename T, int KP>
__global__ void __launch_bounds__(KP_GDN_H_THREADS, 1)
kp_gdn_chunk_h(const typename T::storage* __restrict__ k,
               const typename T::storage* __restrict__ w,
               const typename T::storage* __restrict__ u, const float* __restrict__ gc,
               const float* __restrict__ h0, typename T::storage* __restrict__ h,
               typename T::storage* __restrict__ v_new, float* __restrict__ state, int batch,
               int tokens, int heads_k, int heads_v, int dim_k, int dim_v, int chunk,
               int n_chunks) {
    using namespace kp_gdn_chunk_h_detail;
    static_assert(KP % 32 == 0 && KP >= 32, "KP: K padded to a multiple of 32");
    constexpr int LD = KP + KP_GDN_H_PAD;  // floats per row of w_s, k_s, sh_s
    constexpr int KPL = KP / 32;           // state elements per lane and row
    extern __shared__ __align__(16) float smem[];
    float* w_s = smem;              // [chunk][LD]
    float* k_s = w_s + chunk * LD;  // [chunk][LD]
    float* sh_s = k_s + chunk * LD;  // [BV][LD]
    float* vd_s = sh_s + BV * LD;   // [chunk][VLD]

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // (2)'s outputs: rows rows0, rows0 + 1; columns vg + 8 r
    const int vg = lane % 8, rows0 = 8 * warp + 2 * (lane / 8);
    const bool in2 = 8 * warp < chunk;  // warp-uniform (chunk % 8 == 0)

    // The tiles' columns past dim_k are never staged: zero, once.
    for (int e = threadIdx.x; e < 2 * chunk * LD; e += THREADS) smem[e] = 0.0f;
    __syncthreads();

    // Block-uniform: one (b, h) unless B * Hv passes 65535.
    for (int bh = blockIdx.y; bh < batch * heads_v; bh += gridDim.y) {
        Block bk;
        bk.b = bh / heads_v;
        bk.h = bh - bk.b * heads_v;
        bk.kh = bk.h / (heads_v / heads_k);
        bk.v0 = blockIdx.x * BV;
        const size_t st0 = (size_t)bh * dim_v * dim_k;  // h0, state at (b, h)

        // The state: rows v0 + 4 warp + r, elements lane + 32 j; 0 past V and K.
        float s[4][KPL];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int v = bk.v0 + 4 * warp + r;
#pragma unroll
            for (int j = 0; j < KPL; ++j) {
                const int kk = lane + 32 * j;
                s[r][j] = (v < dim_v && kk < dim_k) ? h0[st0 + (size_t)v * dim_k + kk] : 0.0f;
            }
        }

        // Chunk 0's tiles into shared memory (every read of the previous (b, h)'s tiles came
        // before its last barrier C), its rows into `cur`.
        Tiles<T, KP> tl;
        Rows<T> cur, nxt;
        load_chunk<T, KP>(tl, cur, k, w, u, gc, bk, 0, tokens, heads_k, heads_v, dim_k, dim_v,
                          chunk, rows0, vg, in2);
        store_tiles<T, KP>(tl, w_s, k_s, dim_k, chunk);

        for (int n = 0; n < n_chunks; ++n) {
            const int t0 = n * chunk;
            const int valid = min(chunk, tokens - t0);
            const size_t tok0 = (size_t)bk.b * tokens + t0;

            // (1) T(S) to sh_s and h[n].
            const size_t hn = (((size_t)bk.b * n_chunks + n) * heads_v + bk.h) * dim_v * dim_k;
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int vl = 4 * warp + r, v = bk.v0 + vl;
#pragma unroll
                for (int j = 0; j < KPL; ++j) {
                    const int kk = lane + 32 * j;
                    sh_s[vl * LD + kk] = T::round(s[r][j]);
                    if (v < dim_v && kk < dim_k) T::store(h, hn + (size_t)v * dim_k + kk, s[r][j]);
                }
            }
            __syncthreads();  // A: sh_s, and the tiles of chunk n, visible

            const bool more = n + 1 < n_chunks;
            if (more)
                load_chunk<T, KP>(tl, nxt, k, w, u, gc, bk, n + 1, tokens, heads_k, heads_v,
                                  dim_k, dim_v, chunk, rows0, vg, in2);

            // (2) v_new = u - w T(S)^T for the thread's 2 x 4 outputs, then vdec.
            if (in2) {
                float acc[2][4];
#pragma unroll
                for (int a = 0; a < 2; ++a)
#pragma unroll
                    for (int r = 0; r < 4; ++r) acc[a][r] = 0.0f;
                const float* wp = w_s + rows0 * LD;
                const float* sp = sh_s + vg * LD;
#pragma unroll 4
                for (int kk = 0; kk < KP; kk += 4) {
                    const float4 w0 = *reinterpret_cast<const float4*>(wp + kk);
                    const float4 w1 = *reinterpret_cast<const float4*>(wp + LD + kk);
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        const float4 sv = *reinterpret_cast<const float4*>(sp + 8 * r * LD + kk);
                        acc[0][r] = dot4(acc[0][r], w0, sv);
                        acc[1][r] = dot4(acc[1][r], w1, sv);
                    }
                }
#pragma unroll
                for (int a = 0; a < 2; ++a) {
                    const int i = rows0 + a;
                    const bool ok = i < valid;
                    const float d = ok ? expf(cur.g_last - cur.g[a]) : 0.0f;
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        const int vl = vg + 8 * r, v = bk.v0 + vl;
                        const float vn = T::load(&cur.u[a][r], 0) - acc[a][r];
                        const bool out = ok && v < dim_v;
                        if (out) T::store(v_new, ((tok0 + i) * heads_v + bk.h) * dim_v + v, vn);
                        vd_s[i * VLD + vl] = out ? T::round(vn * d) : 0.0f;
                    }
                }
            }
            __syncthreads();  // B: vd_s visible

            // (3) S = exp(gc_last) S + vdec^T k over the chunk's rows.
#ifdef KPARITY_MUTANT_UNSCALED_STATE
            const float decay = 1.0f;  // mutant: the state carried unscaled into the next chunk
#else
            const float decay = expf(cur.g_last);
#endif
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int j = 0; j < KPL; ++j) s[r][j] *= decay;
#pragma unroll 4
            for (int i = 0; i < chunk; ++i) {
                const float4 dv = *reinterpret_cast<const float4*>(vd_s + i * VLD + 4 * warp);
                float kv[KPL];
#pragma unroll
                for (int j = 0; j < KPL; ++j) kv[j] = k_s[i * LD + lane + 32 * j];
#pragma unroll
                for (int j = 0; j < KPL; ++j) {
                    s[0][j] = fmaf(dv.x, kv[j], s[0][j]);
                    s[1][j] = fmaf(dv.y, kv[j], s[1][j]);
                    s[2][j] = fmaf(dv.z, kv[j], s[2][j]);
                    s[3][j] = fmaf(dv.w, kv[j], s[3][j]);
                }
            }
            __syncthreads();  // C: every read of this chunk's shared tiles done

            if (more) {
                store_tiles<T, KP>(tl, w_s, k_s, dim_k, chunk);
                cur = nxt;
            }
        }

        // The final state.
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int v = bk.v0 + 4 * warp + r;
#pragma unroll
            for (int j = 0; j < KPL; ++j) {
                const int kk = lane + 32 * j;
                if (v < dim_v && kk < dim_k) state[st0 + (size_t)v * dim_k + kk] = s[r][j];
            }
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(KP_GDN_L2_WARPS * 32)
kp_gdn_l2norm(const typename T::storage* x, typename T::storage* y, long long rows, int dim,
              float eps) {
    const long long row = (long long)blockIdx.x * KP_GDN_L2_WARPS + threadIdx.x / 32;
    if (row >= rows) return;  // warp-uniform
    const int lane = threadIdx.x % 32;
    const size_t base = (size_t)row * dim;
    float ss = 0.0f;
    for (int e = lane; e < dim; e += 32) {
        const float v = T::load(x, base + e);
        ss = fmaf(v, v, ss);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, offset);
    const float inv = rsqrtf(ss + eps);
    for (int e = lane; e < dim; e += 32) T::store(y, base + e, T::load(x, base + e) * inv);
}
