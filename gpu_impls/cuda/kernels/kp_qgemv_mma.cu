// kp_qgemv_mma<T, TILES, DEPTH>: kparity's int4 GEMV on tensor cores (f16 / bf16 activations),
// built to stream the packed weights at the HBM limit.
//
//     out[r] = sum_g ( s[r,g] * sum_{d in g} q[r,d] x[d]  +  b[r,g] * sum_{d in g} x[d] )
//
// Why tensor cores: the FFMA kernel (kp_qgemv.cu) spends ~3.5 instructions per code (split,
// convert, FMA), about 6 us of issue at llama3-8b-up on an H100 against a ~12 us memory time.
// Here one mma.m16n8k16 does 256 code x activation products and the unpack is ~1.4 instructions
// per code (shift, LOP3, subtract, two codes per 32-bit register), so the math hides under the
// loads.
//
// Exactness. A = codes q as T: (MAGIC | q) is the T value BASE + q exactly (bf16 128 + q,
// f16 1024 + q), and subtracting BASE (sub.rn.{bf16,f16}x2) gives q exactly. B = x in T, exact.
// Every product q * x is exact in f32 and the tensor core accumulates in f32; the scale and
// bias are applied in f32 per group after the products, as the algebraic split of the seed's
// fast kernels. The bound of oracle/gemv.py (f32 accumulation over `in` terms) covers it.
//
// Fragments. A warp owns TILES m16 tiles (16 TILES rows; the tiles share B) and walks K in
// blocks of 128 codes (64 bytes per row): the quad thread c = lane % 4 loads 16 bytes (32 codes)
// of rows g = lane / 4 and g + 8: codes 32c .. 32c + 31 of the block. mma step s (0..7) of a
// block uses word s / 2 of those 16 bytes: nibble pairs (p, p + 4) land in one register as
// T x 2 (LOP3 with mask 0x000F000F), p = 0, 1 for even s and 2, 3 for odd s. The k slots of A
// and B are the same slots (the sum is over slots; which code sits in which slot only has to
// agree), so B takes x at the same codes. Groups: B's 8 columns are 8 consecutive groups of a
// super-block (8 G codes, G / 16 blocks): lane (g, c) holds x in column g only where its codes
// belong to group g of the super-block, else 0. So C[r][n] = sum_{d in group n} q[r,d] x[d]
// exactly per group; at the end of each super-block the thread folds its C values (rows g,
// g + 8; columns 2c, 2c + 1) into f32 row sums with the groups' scales and biases and clears C.
//
// Streaming. A block owns 16 TILES rows; its WARPS warps split K, warp w taking a contiguous run
// of super-blocks (floor(w S / WARPS) .. floor((w + 1) S / WARPS)), so each warp reads one
// contiguous span of every row. Loads go in batches of DEPTH blocks: a lane takes the batch in
// flight into registers, puts the next batch in flight, then does the math of the one it took.
// Why batches and not a ring refilled one block at a time: the compiler gives all of a warp's
// global loads one scoreboard, and waiting for any of them waits for all, so a ring waits a
// full memory latency per block (H100, llama3-8b-up, one tile: a ring of 4 took 23.9 us,
// batches of 4 22.5 us, batches of 2 20.4 us; benchmarks/h100-2026-11-23-mma). A
// super-block's scales and biases are loaded one super-block ahead of their use. The launcher
// picks WARPS (gemv.py) so that about 2048 warps share the GPU and the warps of a block get
// equal runs. x (as T) and the sum of x over every group are staged once per block
// in shared memory (in * 2 + 64 + 4 * groups bytes, dynamic: x, 64 zero bytes that lanes
// outside a column read instead of x, the sums) by cp.async, while the first batch of weights
// is in flight.
//
// Reductions (deterministic): the 4 quad threads' row sums by two shuffles, the block's warps in
// shared memory in warp order; each group's sum of x in 8 fixed chains.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/gemv.py): int4, T in {f16, bf16}, group_size in
// {32, 64, 128}, in % 128 == 0, in <= 16384 (x in shared memory), 16-byte aligned w and x; rows
// past `out` read row 0 and store nothing. Launched as a programmatic dependent launch: it
// waits for the kernels before it before any load. Test-only mutants (tests/mutants.py):
// KPARITY_MUTANT_NIBBLE_ORDER, _GROUP_OFF_BY_ONE, _DROP_BIAS, _SKIP_LAST_GROUP.
#include "common.cuh"

#define KPM_MAX_WARPS 8

namespace kpmma {

// The 16-bit types' tensor-core pieces: MAGIC = BASE twice (bf16 128.0, f16 1024.0), under
// whose mantissa a 4-bit code reads as BASE + q exactly.
template <typename T> constexpr bool IS_BF16 = false;
template <> constexpr bool IS_BF16<BF16> = true;

template <typename T>
struct Mma {
    static constexpr unsigned MAGIC = IS_BF16<T> ? 0x43004300u : 0x64006400u;
    // (BASE + q) - BASE, both halves: q exactly.
    static __device__ __forceinline__ unsigned codes(unsigned m) {
        unsigned r;
        if constexpr (IS_BF16<T>)
            asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(m), "r"(MAGIC));
        else
            asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(m), "r"(MAGIC));
        return r;
    }
    // c += A (16 x 16, T) B (16 x 8, T), f32 accumulation.
    static __device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
        if constexpr (IS_BF16<T>)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                         "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
        else
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                         "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// 16 bytes global -> shared without passing through registers (sm_80+), and the wait for all of
// this thread's copies.
__device__ __forceinline__ void copy_async(uint4* dst, const uint4* src) {
    const unsigned shared = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(shared), "l"(src) : "memory");
}

__device__ __forceinline__ void copy_async_wait_all() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}

// T x 2 of nibbles (p, p + 4) of `word` (p = shift / 4): the exact codes.
template <typename T>
__device__ __forceinline__ unsigned nibble_pair(unsigned word, int shift) {
    unsigned m;
#ifdef KPARITY_MUTANT_NIBBLE_ORDER  // mutant: nibbles of a word read in reverse order
    word = __byte_perm(word, 0u, 0x0123);
    word = ((word >> 4) & 0x0F0F0F0Fu) | ((word & 0x0F0F0F0Fu) << 4);
#endif
    const unsigned v = word >> shift;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(m) : "r"(v), "r"(0x000F000Fu),
        "r"(Mma<T>::MAGIC));  // (v & mask) | magic
    return Mma<T>::codes(m);
}

}  // namespace kpmma

template <typename T, int TILES, int DEPTH>
__global__ void __launch_bounds__(32 * KPM_MAX_WARPS)
kp_qgemv_mma(const uint4* __restrict__ w, const typename T::storage* __restrict__ scales,
             const typename T::storage* __restrict__ biases,
             const typename T::storage* __restrict__ x, typename T::storage* __restrict__ out,
             int out_dim, int in_dim, int group_size) {
    // Let the next kernel's blocks be scheduled now; wait for the kernels before this one.
    pdl_launch_dependents();
    pdl_wait();
    if constexpr (sizeof(typename T::storage) == 4) {
        __trap();  // f32 activations have no exact tensor-core path: the contract refuses them
    } else {
        constexpr int R = 2 * TILES;  // rows per thread: g and g + 8 of each m16 tile
        typedef typename T::storage S;
        extern __shared__ uint4 kpm_shared[];
        uint4* x_s = kpm_shared;                        // in / 8 vectors of x
        uint4* zero_s = kpm_shared + in_dim / 8;        // 4 zero vectors: x where not "mine"
        float* xsum_s = reinterpret_cast<float*>(zero_s + 4);  // one per group
        __shared__ float partial[KPM_MAX_WARPS][16 * TILES];

        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
        const int g = lane >> 2, c = lane & 3;
        const int row0 = blockIdx.x * 16 * TILES;
        const int groups = in_dim / group_size;
        const int group_shift = 31 - __clz(group_size);  // G is a power of two (32, 64, 128)
        const int bps = group_size / 16;         // 128-code blocks per super-block of 8 groups
        const int blocks = in_dim / 128;
        const int supers = (blocks + bps - 1) / bps;
        const int s_begin = warp * supers / warps, s_end = (warp + 1) * supers / warps;
        const int b_begin = s_begin * bps, b_end = min(s_end * bps, blocks);
        const int n = b_end - b_begin;           // this warp's blocks (0 if more warps than supers)

        // This lane's rows (index 2 i + h: tile i, row g + 8 h), from this warp's first block.
        const uint4* wp[R];
        const S* sp[R];
        const S* bp[R];
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const int row = row0 + 16 * (k >> 1) + g + 8 * (k & 1);
            const size_t r = row < out_dim ? row : 0;
            wp[k] = w + r * (in_dim / 32) + 4 * b_begin + c;
            sp[k] = scales + r * groups;
            bp[k] = biases + r * groups;
        }

        // Prologue: this warp's first DEPTH blocks and its first super-block's scales and
        // biases in flight, then x and the groups' sums of x into shared memory.
        uint4 batch[DEPTH][R];  // the next DEPTH blocks of this lane's rows, in flight
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
#pragma unroll
            for (int k = 0; k < R; ++k)
                batch[d][k] = d < n ? wp[k][4 * d] : make_uint4(0u, 0u, 0u, 0u);
        }
        // Scales and biases (raw bits, widened to 32-bit registers) of columns 2c, 2c + 1 of
        // the next super-block, one super-block ahead of their use.
        unsigned next_s[R][2], next_b[R][2];
        auto load_groups = [&](int sup) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int grp = min(8 * sup + 2 * c + j, groups - 1);
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    next_s[k][j] = sp[k][grp];
                    next_b[k][j] = bp[k][grp];
                }
            }
        };
        if (n > 0) load_groups(s_begin);
        // x by cp.async: every copy in flight at once (a load-store loop would wait for each).
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        for (int v = threadIdx.x; v < in_dim / 8; v += blockDim.x)
            kpmma::copy_async(&x_s[v], &xv[v]);
        if (threadIdx.x < 4) zero_s[threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
        kpmma::copy_async_wait_all();
        __syncthreads();
        for (int grp = threadIdx.x; grp < groups; grp += blockDim.x) {
            float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            for (int v = 0; v < group_size / 8; ++v) {
                float f[8];
                Vec<T>::unpack(x_s[grp * (group_size / 8) + v], f);
#pragma unroll
                for (int k = 0; k < 8; ++k) part[k] += f[k];
            }
            xsum_s[grp] = ((part[0] + part[1]) + (part[2] + part[3])) +
                          ((part[4] + part[5]) + (part[6] + part[7]));
        }
        __syncthreads();

        float acc[R];
        float cacc[TILES][4];
        unsigned cur_s[R][2], cur_b[R][2];
#pragma unroll
        for (int k = 0; k < R; ++k) acc[k] = 0.0f;
        int sup = s_begin, pos = 0;  // super-block of the current block, and its place in it
        for (int i0 = 0; i0 < n; i0 += DEPTH) {
            // Take this batch (one wait: a warp's loads share one scoreboard, so waiting for any
            // of them waits for all), then put the next batch in flight during its math.
            uint4 now[DEPTH][R];
#pragma unroll
            for (int d = 0; d < DEPTH; ++d) {
#pragma unroll
                for (int k = 0; k < R; ++k) now[d][k] = batch[d][k];
            }
#pragma unroll
            for (int d = 0; d < DEPTH; ++d) {
#pragma unroll
                for (int k = 0; k < R; ++k)
                    if (i0 + DEPTH + d < n) batch[d][k] = wp[k][4 * (i0 + DEPTH + d)];
            }
#pragma unroll
            for (int d = 0; d < DEPTH; ++d) {
                if (i0 + d >= n) break;
                const uint4 (&cur)[R] = now[d];
                if (pos == 0) {  // a super-block starts: clear C, take its groups, fetch the next's
#pragma unroll
                    for (int t = 0; t < TILES; ++t)
                        cacc[t][0] = cacc[t][1] = cacc[t][2] = cacc[t][3] = 0.0f;
#pragma unroll
                    for (int k = 0; k < R; ++k) {
                        cur_s[k][0] = next_s[k][0];
                        cur_s[k][1] = next_s[k][1];
                        cur_b[k][0] = next_b[k][0];
                        cur_b[k][1] = next_b[k][1];
                    }
                    if (sup + 1 < s_end) load_groups(sup + 1);
                }
                // x at this thread's 32 codes where they belong to column g's group, else 0.
                const int code0 = pos * 128 + 32 * c;
                int column = code0 >> group_shift;
#ifdef KPARITY_MUTANT_GROUP_OFF_BY_ONE
                // mutant: a group's last 32 codes are added into the next group
                if (((code0 + 32) & (group_size - 1)) == 0 && column + 1 < 8 &&
                    8 * sup + column + 1 < groups)
                    column += 1;
#endif
                const uint4* xs = column == g ? x_s + (size_t)(b_begin + i0 + d) * 16 + 4 * c
                                              : zero_s;
                unsigned xr[16];
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    const uint4 q = xs[v];
                    xr[4 * v] = q.x;
                    xr[4 * v + 1] = q.y;
                    xr[4 * v + 2] = q.z;
                    xr[4 * v + 3] = q.w;
                }
#pragma unroll
                for (int s = 0; s < 8; ++s) {
                    const int wi = s >> 1, p = (s & 1) * 2;  // word, first nibble of the pair
                    // x at codes 8 wi + (p, p+4) and (p+1, p+5): x[2i] is the low half of xr[i]
                    const unsigned lo = xr[4 * wi + (p >> 1)], hi = xr[4 * wi + 2 + (p >> 1)];
                    const unsigned b0 = __byte_perm(lo, hi, 0x5410);   // x[8wi+p], x[8wi+p+4]
                    const unsigned b1 = __byte_perm(lo, hi, 0x7632);   // x[8wi+p+1], x[8wi+p+5]
#pragma unroll
                    for (int t = 0; t < TILES; ++t) {
                        const unsigned* wa = reinterpret_cast<const unsigned*>(&cur[2 * t]);
                        const unsigned* wb = reinterpret_cast<const unsigned*>(&cur[2 * t + 1]);
                        unsigned a[4];
                        a[0] = kpmma::nibble_pair<T>(wa[wi], 4 * p);      // row g,   (p, p+4)
                        a[1] = kpmma::nibble_pair<T>(wb[wi], 4 * p);      // row g+8, (p, p+4)
                        a[2] = kpmma::nibble_pair<T>(wa[wi], 4 * p + 4);  // row g,   (p+1, p+5)
                        a[3] = kpmma::nibble_pair<T>(wb[wi], 4 * p + 4);  // row g+8, (p+1, p+5)
                        kpmma::Mma<T>::mma(cacc[t], a, b0, b1);
                    }
                }
                if (pos == bps - 1 || i0 + d == n - 1) {
                    // Fold: C[row][col] is sum q x over group 8 sup + col of this super-block.
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const int grp = 8 * sup + 2 * c + j;
                        if (grp >= groups) continue;
#ifdef KPARITY_MUTANT_SKIP_LAST_GROUP
                        if (grp == groups - 1) continue;
#endif
                        const float xsum = xsum_s[grp];
#pragma unroll
                        for (int k = 0; k < R; ++k) {
                            const float q_x = cacc[k >> 1][2 * (k & 1) + j];
                            const float scale = T::to_f32((S)cur_s[k][j]);
#ifdef KPARITY_MUTANT_DROP_BIAS
                            acc[k] = fmaf(scale, q_x, acc[k]);
#else
                            const float bias = T::to_f32((S)cur_b[k][j]);
                            acc[k] = fmaf(scale, q_x, fmaf(bias, xsum, acc[k]));
#endif
                        }
                    }
                }
                if (++pos == bps) {
                    pos = 0;
                    ++sup;
                }
            }
        }
        // The quad's 4 threads hold disjoint groups of the same rows: add them (fixed order).
#pragma unroll
        for (int k = 0; k < R; ++k) {
            acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], 1);
            acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], 2);
        }
        if (c == 0) {
#pragma unroll
            for (int k = 0; k < R; ++k) partial[warp][16 * (k >> 1) + g + 8 * (k & 1)] = acc[k];
        }
        __syncthreads();
        if (threadIdx.x < 16 * TILES && row0 + (int)threadIdx.x < out_dim) {
            float v = partial[0][threadIdx.x];
            for (int j = 1; j < warps; ++j) v += partial[j][threadIdx.x];
            T::store(out, row0 + threadIdx.x, v);
        }
    }
}
