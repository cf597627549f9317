// kp_qgemv_mma<T, TILES, STAGES>: kparity's int4 GEMV on tensor cores (f16 / bf16 activations),
// built to stream the packed weights at the HBM limit.
//
//     out[r] = sum_g ( s[r,g] * sum_{d in g} q[r,d] x[d]  +  b[r,g] * sum_{d in g} x[d] )
//
// Why tensor cores: the FFMA kernel (kp_qgemv.cu) spends ~3.5 instructions per code (split,
// convert, FMA), about 6 us of issue at llama3-8b-up on an H100 against a ~12 us memory time.
// Here one mma.m16n8k16 does 256 code x activation products and the unpack is ~1.4 instructions
// per code (shift, LOP3, subtract, two codes per 32-bit register); the main loop is ~2.2 SASS
// instructions per code in all.
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
// belong to group g of the super-block, else 0. x is staged in fragment order (each 8 values
// x0..x7 as the words (x0, x4), (x1, x5), (x2, x6), (x3, x7)), so b0, b1 of a step are two
// consecutive words of the lane's 64 bytes of x. So C[r][n] = sum_{d in group n} q[r,d] x[d]
// exactly per group; at the end of each super-block the thread folds its C values (rows g,
// g + 8; columns 2c, 2c + 1) into f32 row sums with the groups' scales and biases and clears C.
//
// Streaming. A block owns 16 TILES rows; its WARPS warps split K, warp w taking a contiguous run
// of super-blocks (floor(w S / WARPS) .. floor((w + 1) S / WARPS)), so each warp reads one
// contiguous span of every row. Weights reach registers through shared memory: each lane runs
// its own cp.async pipeline of STAGES stages (one 128-code block of its rows each; STAGES - 1
// in flight), waits for the oldest with cp.async.wait_group, reads it back (its own 16-byte
// slots, so no barrier) and refills the stage it consumed one iteration earlier. Why not
// registers: the compiler gives all of a warp's global loads one scoreboard, so a register
// pipeline waits for every load in flight whenever it needs one of them (a ring of 4 took
// 23.9 us at llama3-8b-up, batches of 2 copied out of the way 17.9 us; this pipeline 15.6 us
// on an H100). Before the loop, by the whole block and as copy group 0: x, and the scales and
// biases of the block's rows (one contiguous run each, streamed in whole lines; loaded a
// super-block at a time from scattered rows they cost 2-7 us at the bench shapes on an H100,
// benchmarks/h100-2026-11-23-cp-async); then each group's sum of x and x's fragment order. At
// most 128 registers a thread (16 warps a block), so the launcher's ~2048 warps are resident at
// once; it picks WARPS for equal runs and STAGES that keep the blocks' shared memory within
// one wave (gemv.py). Dynamic shared memory: WARPS * STAGES * TILES * 1 KiB of stages,
// 128 TILES * groups bytes of scales and biases, 2 in bytes of x, 64 zero bytes (x where a lane
// is outside its column), 4 groups bytes of sums.
//
// Reductions (deterministic): the 4 quad threads' row sums by two shuffles, the block's warps in
// shared memory in warp order; each group's sum of x in 8 fixed chains.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/gemv.py): int4, T in {f16, bf16}, group_size in
// {32, 64, 128}, in % 128 == 0, in <= 16384 (x in shared memory), 16-byte aligned w, x,
// scales and biases; rows past `out` read row 0's codes and store nothing. Launched as a
// programmatic dependent launch: it waits for the kernels before it before any load, and lets
// the next one in after its main loop. Test-only mutants (tests/mutants.py):
// KPARITY_MUTANT_NIBBLE_ORDER, _GROUP_OFF_BY_ONE, _DROP_BIAS, _SKIP_LAST_GROUP.
#include "common.cuh"

#define KPM_MAX_WARPS 16

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

// 16 bytes global -> shared without passing through registers (sm_80+); the L2 fetches 128
// bytes around it (this lane's next block of the row). commit closes this thread's group of
// copies; wait<N> returns once at most N of its groups are still in flight, and the copies of
// the others are visible to this thread.
__device__ __forceinline__ void copy_async(uint4* dst, const uint4* src) {
    const unsigned shared = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" :: "r"(shared), "l"(src)
                 : "memory");
}

__device__ __forceinline__ void copy_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N>
__device__ __forceinline__ void copy_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
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

template <typename T, int TILES, int STAGES>
__global__ void __launch_bounds__(32 * KPM_MAX_WARPS)
kp_qgemv_mma(const uint4* __restrict__ w, const typename T::storage* __restrict__ scales,
             const typename T::storage* __restrict__ biases,
             const typename T::storage* __restrict__ x, typename T::storage* __restrict__ out,
             int out_dim, int in_dim, int group_size) {
    // Wait for the kernels before this one (the next kernel's blocks are let in at the end of
    // the main loop; see there).
#ifndef KPARITY_DIAG_EARLY_DEPENDENTS
    pdl_wait();
#else
    pdl_launch_dependents();
    pdl_wait();
#endif
    if constexpr (sizeof(typename T::storage) == 4) {
        __trap();  // f32 activations have no exact tensor-core path: the contract refuses them
    } else {
        constexpr int R = 2 * TILES;  // rows per thread: g and g + 8 of each m16 tile
        typedef typename T::storage S;
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

        // Dynamic shared memory: every warp's STAGES weight stages (R x 32 vectors each); the
        // block's rows' scales and biases ([16 TILES][groups] each, as in global memory); x in
        // fragment order; 64 zero bytes; the groups' sums of x.
        extern __shared__ uint4 kpm_shared[];
        uint4* stage_s = kpm_shared + warp * (STAGES * R * 32) + lane;  // this lane's slots
        S* scale_s = reinterpret_cast<S*>(kpm_shared + warps * (STAGES * R * 32));
        S* bias_s = scale_s + 16 * TILES * groups;
        uint4* x_s = reinterpret_cast<uint4*>(bias_s + 16 * TILES * groups);  // in / 8 vectors
        uint4* zero_s = x_s + in_dim / 8;                               // x where not "mine"
        float* xsum_s = reinterpret_cast<float*>(zero_s + 4);           // one per group
        __shared__ float partial[KPM_MAX_WARPS][16 * TILES];

        // This lane's rows (index 2 i + h: tile i, row g + 8 h), from this warp's first block.
        const uint4* wp[R];
        int gp[R];  // the row's first group in scales / biases
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const int row = row0 + 16 * (k >> 1) + g + 8 * (k & 1);
            const int r = row < out_dim ? row : 0;
            wp[k] = w + (size_t)r * (in_dim / 32) + 4 * b_begin + c;
            gp[k] = r * groups;
        }

        // Prologue. Copy group 0, by the whole block: x, and the scales and biases of the
        // block's rows, which are one contiguous run each (16 TILES rows of `groups` values
        // from row row0: 16-byte aligned, as 64 TILES groups bytes a block are a multiple of
        // 16), so they stream in whole lines; rows past `out` are not copied (their sums are
        // never stored). Groups 1 .. STAGES - 1: this lane's first STAGES - 1 blocks
        // (empty groups past the run keep the count uniform).
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        for (int v = threadIdx.x; v < in_dim / 8; v += blockDim.x)
            kpmma::copy_async(&x_s[v], &xv[v]);
        {
            const int count = min(16 * TILES, out_dim - row0) * groups;  // values to copy
            const size_t first = (size_t)row0 * groups;
            const uint4* sv = reinterpret_cast<const uint4*>(scales + first);
            const uint4* bv = reinterpret_cast<const uint4*>(biases + first);
            uint4* ssv = reinterpret_cast<uint4*>(scale_s);
            uint4* bsv = reinterpret_cast<uint4*>(bias_s);
            for (int v = threadIdx.x; v < count / 8; v += blockDim.x) {
                kpmma::copy_async(&ssv[v], &sv[v]);
                kpmma::copy_async(&bsv[v], &bv[v]);
            }
            for (int e = (count / 8) * 8 + threadIdx.x; e < count; e += blockDim.x) {
                scale_s[e] = scales[first + e];  // a tail shorter than 16 bytes
                bias_s[e] = biases[first + e];
            }
        }
        kpmma::copy_async_commit();
#pragma unroll
        for (int st = 0; st < STAGES - 1; ++st) {
            if (st < n) {
#pragma unroll
                for (int k = 0; k < R; ++k) kpmma::copy_async(&stage_s[(st * R + k) * 32], wp[k] + 4 * st);
            }
            kpmma::copy_async_commit();
        }
        if (threadIdx.x < 4) zero_s[threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
        kpmma::copy_async_wait<STAGES - 1>();  // x has landed (the weight groups may not have)
        __syncthreads();
        // Each group's sum of x (8 fixed chains), and its vectors put in fragment order: the
        // 8 values x0..x7 of a vector as the words (x0, x4), (x1, x5), (x2, x6), (x3, x7), which
        // are b0, b1 of mma steps with p = 0 and p = 2 (see the math below).
        for (int grp = threadIdx.x; grp < groups; grp += blockDim.x) {
            float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            for (int v = 0; v < group_size / 8; ++v) {
                uint4& vec = x_s[grp * (group_size / 8) + v];
                float f[8];
                Vec<T>::unpack(vec, f);
#pragma unroll
                for (int k = 0; k < 8; ++k) part[k] += f[k];
                vec = make_uint4(__byte_perm(vec.x, vec.z, 0x5410), __byte_perm(vec.x, vec.z, 0x7632),
                                 __byte_perm(vec.y, vec.w, 0x5410), __byte_perm(vec.y, vec.w, 0x7632));
            }
            xsum_s[grp] = ((part[0] + part[1]) + (part[2] + part[3])) +
                          ((part[4] + part[5]) + (part[6] + part[7]));
        }
        __syncthreads();

        float acc[R];
        float cacc[TILES][4];
#pragma unroll
        for (int k = 0; k < R; ++k) acc[k] = 0.0f;
        int sup = s_begin, pos = 0;  // super-block of the current block, and its place in it
        int stage = 0;               // the stage holding block i
        const uint4* xb = x_s + (size_t)b_begin * 16 + 4 * c;  // x of block i at this lane's codes
        for (int i = 0; i < n; ++i) {
            // Block i is copy group i + 1: wait until at most STAGES - 2 younger ones are in
            // flight, take it, and refill the stage taken last iteration (already consumed)
            // with block i + STAGES - 1.
            kpmma::copy_async_wait<STAGES - 2>();
            uint4 cur[R];
#pragma unroll
            for (int k = 0; k < R; ++k) cur[k] = stage_s[(stage * R + k) * 32];
            const int refill = stage == 0 ? STAGES - 1 : stage - 1;
            if (i + STAGES - 1 < n) {
#pragma unroll
                for (int k = 0; k < R; ++k)
                    kpmma::copy_async(&stage_s[(refill * R + k) * 32], wp[k] + 4 * (i + STAGES - 1));
            }
            kpmma::copy_async_commit();
            stage = stage == STAGES - 1 ? 0 : stage + 1;

#ifdef KPARITY_DIAG_LOAD_ONLY
            // timing diagnostic (wrong results): the copies and their reads, none of the math
#pragma unroll
            for (int k = 0; k < R; ++k)
                acc[k] += __uint_as_float((cur[k].x ^ cur[k].y ^ cur[k].z ^ cur[k].w) & 0x3fffffu);
            continue;
#endif
            if (pos == 0) {  // a super-block starts: clear C
#pragma unroll
                for (int t = 0; t < TILES; ++t)
                    cacc[t][0] = cacc[t][1] = cacc[t][2] = cacc[t][3] = 0.0f;
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
            const uint4* xs = column == g ? xb : zero_s;
            xb += 16;
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
                // fragment order: xr[4 wi + p] = x at codes (8wi+p, 8wi+p+4), xr[4 wi + p + 1]
                // = x at (8wi+p+1, 8wi+p+5): the codes of a[0], a[1] and of a[2], a[3].
                const unsigned b0 = xr[4 * wi + p], b1 = xr[4 * wi + p + 1];
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
            if (pos == bps - 1 || i == n - 1) {
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
                        const int at = (16 * (k >> 1) + g + 8 * (k & 1)) * groups + grp;
                        const float scale = T::to_f32(scale_s[at]);
#ifdef KPARITY_MUTANT_DROP_BIAS
                        acc[k] = fmaf(scale, q_x, acc[k]);
#else
                        const float bias = T::to_f32(bias_s[at]);
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
        kpmma::copy_async_wait<0>();  // no copy outlives the block (its shared memory)
#ifndef KPARITY_DIAG_EARLY_DEPENDENTS
        // Only now let the next kernel's blocks be scheduled: let in at the top, their waiting
        // blocks cost llama3-8b-up 1.3 us (17.1 us with PDL, 15.8 without, H100).
        pdl_launch_dependents();
#endif
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
