// kp_ssm_step_hpn<T, NPL>, kp_ssm_step_hnp<T, NPL>: kparity's Mamba-2 decode step (op `ssm_step`,
// oracle/ssd.py; the recurrence of oracle/ssd_math.py for one token), one kernel per state
// layout. Per (batch b, head h), g = h / (H / G) the B/C group (NOT h % G), the f32 state
// S [P, N] ("hpn": [B, H, P, N], contiguous along N) or its transpose ("hnp": [B, H, N, P],
// contiguous along P) is read once and written once:
//
//   dt     = softplus(dt_raw + dt_bias)   f32; log1pf(expf(v)) up to v = 20, v above (mamba_ssm's
//                                         Triton softplus: the two agree to f32 there)
//   dt     = clamp(dt, dt_min, dt_max)    compares, so a NaN dt stays NaN (fmaxf would drop it)
//   decay  = exp(dt A),  A = -exp(A_log)
//   S[p,n] = S[p,n] decay + (dt x[p]) B[n]
//   y[p]   = sum_n S[p,n] C[n] + D x[p];  y *= z / (1 + exp(-z)) with the gate;  rounded to T once
//
// The step is a read-modify-write of the state: bandwidth-bound. Both layouts split a head's P
// values over blocks of KP_SSM_WARPS warps (16 values of p a block: 4 blocks a head at P = 64,
// 256 blocks at Nemotron's 64 heads and batch 1), so that a batch of 1 still spreads its state
// over the SMs; every block issues its state loads first, 16-byte vectors along the contiguous
// axis, then the small vectors (B, C, x) while those are in flight.
//
// hpn: a warp owns KP_SSM_ROWS whole rows p of S; lane l holds NPL = N / 32 elements of a row,
//      as W-float vectors at n = (32 j + l) W + w (W the widest of 4, 2, 1 dividing NPL: one
//      float4 a lane at N = 128, a row's 512 bytes in one warp load), as kp_gdn_step. y[p] is a
//      warp butterfly (every lane holds the same bits); lane r stores row r's y.
// hnp: a block owns KP_SSM_COLS consecutive columns p of S and every row n: thread t holds the
//      float4 of columns p0 + 4 (t % 4) .. + 3 on the rows n = t / 4 + 32 i (i < NPL = N / 32):
//      a warp load covers 8 rows x 64 bytes. y[p] sums over n: each thread's NPL rows, then the
//      8 row groups of a warp (butterfly over lanes 4, 8, 16 apart: the same columns), then the
//      4 warps in shared memory, added in warp order by thread p - p0.
//
// Numerics: f32 throughout; the sums over n in the orders above (the contract admits any);
// expf and log1pf are CUDA's (2 and 1 ULPs; CuPy adds -ftz, not fast math); products and adds may
// contract to FMAs (fewer roundings than the bound charges). The state may alias state_out (an
// in-place update): each element is read by the thread that writes it, before it writes it, so
// the state pointers carry no __restrict__.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/ssm.py checks them before any launch): N % 32 == 0 and
// N <= 256 (the instances: NPL = N / 32 in 1..8); hnp: P % 4 == 0 (a float4 of columns is whole
// or wholly past P). The grid is flat: blockIdx.x = (b H + h) slices + slice, slices =
// ceil(P / 16), so no grid dimension limits B or H. H % G == 0 is the op's domain.
//
// Test-only mutant: KPARITY_MUTANT_SOFTPLUS_TWICE applies softplus again to the activated dt
// inside the decay (exp(softplus(dt) A)); the input term dt x B keeps the right dt. A zero state
// hides it (the decay multiplies 0).
#include "common.cuh"
#include "floatvec.cuh"

#define KP_SSM_WARPS 4   // warps per block: 128 threads (both layouts)
#define KP_SSM_ROWS 4    // hpn: rows p of S per warp (KP_SSM_WARPS * KP_SSM_ROWS = 16 a block)
#define KP_SSM_COLS 16   // hnp: columns p of S per block (4 float4 columns x 32 row groups)

namespace kp_ssm_detail {

using kp_floatvec::FloatVec;

// mamba_ssm's softplus: log1p(exp(v)) up to 20, v above (log1p(exp(-20)) < half an f32 ULP of
// 20); a NaN compares false and passes through.
__device__ __forceinline__ float softplus(float v) {
    return v <= 20.0f ? log1pf(expf(v)) : v;
}

// The per-(b, h) scalars: the clamped dt, the decay exp(dt A), the skip D.
struct Head {
    float dt, decay, d;
};

template <typename T>
__device__ __forceinline__ Head head_scalars(const typename T::storage* dt_raw,
                                             const float* a_log, const float* dt_bias,
                                             const float* d_skip, int bh, int h, float dt_min,
                                             float dt_max) {
    float dt = softplus(T::load(dt_raw, bh) + dt_bias[h]);
    dt = dt < dt_min ? dt_min : dt;  // compares: NaN stays NaN
    dt = dt > dt_max ? dt_max : dt;  // dt_max = +inf: no upper clamp
    const float a = -expf(a_log[h]);
#ifdef KPARITY_MUTANT_SOFTPLUS_TWICE
    const float decay = expf(softplus(dt) * a);  // mutant: dt activated twice in the decay
#else
    const float decay = expf(dt * a);
#endif
    return Head{dt, decay, d_skip[h]};
}

// y = (s + D x) * silu(z) (the gate), rounded to T once at the store.
template <typename T>
__device__ __forceinline__ void store_y(typename T::storage* y, const typename T::storage* z,
                                        size_t i, float s, float d, float x, int gate) {
    float v = s + d * x;
    if (gate) {
        const float zz = T::load(z, i);
        v *= zz / (1.0f + expf(-zz));
    }
    T::store(y, i, v);
}

}  // namespace kp_ssm_detail

// x, z, y [B, H, P] (T); dt_raw [B, H] (T); A_log, dt_bias, D [H] (f32); Bm, Cm [B, G, N] (T);
// state_in, state_out [B, H, P, N] (f32). Block: KP_SSM_WARPS * 32 threads; grid: B H slices.
template <typename T, int NPL>
__global__ void __launch_bounds__(KP_SSM_WARPS * 32)
kp_ssm_step_hpn(const typename T::storage* __restrict__ x,
                const typename T::storage* __restrict__ dt_raw, const float* __restrict__ a_log,
                const float* __restrict__ dt_bias, const typename T::storage* __restrict__ bm,
                const typename T::storage* __restrict__ cm, const float* __restrict__ d_skip,
                const typename T::storage* __restrict__ z, const float* state_in,
                float* state_out, typename T::storage* __restrict__ y, int heads, int dim_p,
                int groups, int slices, int gate, float dt_min, float dt_max) {
    using namespace kp_ssm_detail;
    constexpr int W = NPL % 4 == 0 ? 4 : NPL % 2 == 0 ? 2 : 1;  // floats per vector
    constexpr int NV = NPL / W;                                  // vectors per lane
    constexpr int dim_n = 32 * NPL;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int slice = blockIdx.x % slices;
    const int bh = blockIdx.x / slices;  // b * H + h
    const int b = bh / heads, h = bh - b * heads;
    const int g = h / (heads / groups);
    const int row0 = (slice * KP_SSM_WARPS + warp) * KP_SSM_ROWS;
    if (row0 >= dim_p) return;  // warp-uniform: a whole warp past the last row (no barrier)
    const int rows = min(KP_SSM_ROWS, dim_p - row0);

    // 1. The warp's state rows, first (the bytes that matter); rows past P hold 0.
    const size_t base = ((size_t)bh * dim_p + row0) * dim_n;
    float s[KP_SSM_ROWS][NPL];
#pragma unroll
    for (int r = 0; r < KP_SSM_ROWS; ++r)
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            if (r < rows)
                FloatVec<W>::load(state_in + base + (size_t)r * dim_n + (j * 32 + lane) * W,
                                  &s[r][j * W]);
            else
#pragma unroll
                for (int w = 0; w < W; ++w) s[r][j * W + w] = 0.0f;
        }

    // 2. B and C of group g at this lane's n, x of the warp's rows, the head's scalars.
    const size_t bc = ((size_t)b * groups + g) * dim_n;
    float bb[NPL], cc[NPL];
#pragma unroll
    for (int j = 0; j < NV; ++j)
#pragma unroll
        for (int w = 0; w < W; ++w) {
            const int n = (j * 32 + lane) * W + w;
            bb[j * W + w] = T::load(bm, bc + n);
            cc[j * W + w] = T::load(cm, bc + n);
        }
    const size_t xo = (size_t)bh * dim_p + row0;  // x, z, y: [B, H, P]
    float xs[KP_SSM_ROWS];
#pragma unroll
    for (int r = 0; r < KP_SSM_ROWS; ++r) xs[r] = r < rows ? T::load(x, xo + r) : 0.0f;
    const Head k = head_scalars<T>(dt_raw, a_log, dt_bias, d_skip, bh, h, dt_min, dt_max);

    // 3. The update and each row's dot with C (rows interleaved for ILP).
    float out[KP_SSM_ROWS];
#pragma unroll
    for (int r = 0; r < KP_SSM_ROWS; ++r) {
        const float u = k.dt * xs[r];
        out[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < NPL; ++e) {
            s[r][e] = s[r][e] * k.decay + u * bb[e];
            out[r] += s[r][e] * cc[e];
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
#pragma unroll
        for (int r = 0; r < KP_SSM_ROWS; ++r)
            out[r] += __shfl_xor_sync(0xffffffffu, out[r], offset);

    // 4. The state rows back, and each row's y once (lane r).
#pragma unroll
    for (int r = 0; r < KP_SSM_ROWS; ++r) {
        if (r >= rows) break;
#pragma unroll
        for (int j = 0; j < NV; ++j)
            FloatVec<W>::store(state_out + base + (size_t)r * dim_n + (j * 32 + lane) * W,
                               &s[r][j * W]);
        if (lane == r) store_y<T>(y, z, xo + r, out[r], k.d, xs[r], gate);
    }
}

// The same arguments, state_in, state_out [B, H, N, P] (f32). Block: KP_SSM_WARPS * 32 threads;
// grid: B H slices, slices = ceil(P / KP_SSM_COLS).
template <typename T, int NPL>
__global__ void __launch_bounds__(KP_SSM_WARPS * 32)
kp_ssm_step_hnp(const typename T::storage* __restrict__ x,
                const typename T::storage* __restrict__ dt_raw, const float* __restrict__ a_log,
                const float* __restrict__ dt_bias, const typename T::storage* __restrict__ bm,
                const typename T::storage* __restrict__ cm, const float* __restrict__ d_skip,
                const typename T::storage* __restrict__ z, const float* state_in,
                float* state_out, typename T::storage* __restrict__ y, int heads, int dim_p,
                int groups, int slices, int gate, float dt_min, float dt_max) {
    using namespace kp_ssm_detail;
    constexpr int VC = KP_SSM_COLS / 4;           // float4 columns per row: 4
    constexpr int RG = KP_SSM_WARPS * 32 / VC;    // row groups: 32
    static_assert(RG == 32, "NPL = N / 32 rows per thread needs 32 row groups");
    constexpr int dim_n = RG * NPL;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int vc = tid % VC, rg = tid / VC;
    const int slice = blockIdx.x % slices;
    const int bh = blockIdx.x / slices;  // b * H + h
    const int b = bh / heads, h = bh - b * heads;
    const int g = h / (heads / groups);
    const int col0 = slice * KP_SSM_COLS;
    const int p = col0 + vc * 4;     // this thread's first column
    const bool live = p < dim_p;     // P % 4 == 0: the float4 is whole or wholly past P

    // 1. The thread's state vectors, first; columns past P hold 0 (no early return: the
    //    block meets at a barrier below).
    const size_t base = (size_t)bh * dim_n * dim_p + p;
    float s[NPL][4];
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
        if (live)
            FloatVec<4>::load(state_in + base + (size_t)(rg + RG * i) * dim_p, s[i]);
        else
#pragma unroll
            for (int w = 0; w < 4; ++w) s[i][w] = 0.0f;
    }

    // 2. B and C of group g at this thread's rows, x at its columns, the head's scalars.
    const size_t bc = ((size_t)b * groups + g) * dim_n;
    float bb[NPL], cc[NPL];
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
        bb[i] = T::load(bm, bc + rg + RG * i);
        cc[i] = T::load(cm, bc + rg + RG * i);
    }
    const size_t xo = (size_t)bh * dim_p;  // x, z, y: [B, H, P]
    float xs[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) xs[w] = live ? T::load(x, xo + p + w) : 0.0f;
    const Head k = head_scalars<T>(dt_raw, a_log, dt_bias, d_skip, bh, h, dt_min, dt_max);

    // 3. The update and the partial dots over this thread's rows.
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const float u = k.dt * xs[w];
#pragma unroll
        for (int i = 0; i < NPL; ++i) {
            s[i][w] = s[i][w] * k.decay + u * bb[i];
            part[w] += s[i][w] * cc[i];
        }
    }

    // 4. The state back (each element by the thread that read it).
    if (live) {
#pragma unroll
        for (int i = 0; i < NPL; ++i)
            FloatVec<4>::store(state_out + base + (size_t)(rg + RG * i) * dim_p, s[i]);
    }

    // 5. y: the 8 row groups of a warp (lanes VC apart hold the same columns), then the warps.
#pragma unroll
    for (int offset = 16; offset >= VC; offset >>= 1)
#pragma unroll
        for (int w = 0; w < 4; ++w) part[w] += __shfl_xor_sync(0xffffffffu, part[w], offset);
    __shared__ float partial[KP_SSM_WARPS][KP_SSM_COLS];
    if (lane < VC) {  // lane = vc here
#pragma unroll
        for (int w = 0; w < 4; ++w) partial[warp][lane * 4 + w] = part[w];
    }
    __syncthreads();
    const int col = col0 + tid;
    if (tid < KP_SSM_COLS && col < dim_p) {
        float sum = 0.0f;
#pragma unroll
        for (int wp = 0; wp < KP_SSM_WARPS; ++wp) sum += partial[wp][tid];
        store_y<T>(y, z, xo + col, sum, k.d, T::load(x, xo + col), gate);
    }
}
