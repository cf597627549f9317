// kp_qgemv_mma: kparity's int4 GEMV on tensor cores (f16 / bf16 activations).
//
//     out[r] = sum_g ( s[r,g] * sum_{d in g} q[r,d] x[d]  +  b[r,g] * sum_{d in g} x[d] )
//
// Why: the FFMA kernel (kp_qgemv.cu) spends ~4 instructions per code (unpack, convert, FMA) and
// stays near 60% of the copy ceiling; here one mma.m16n8k16 does 256 code x activation products
// and the unpack is ~1 instruction per code.
//
// Exactness. A = codes q as T: (MAGIC | q) is the T value BASE + q exactly (bf16 128 + q,
// f16 1024 + q), and subtracting BASE (sub.rn.{bf16,f16}x2) gives q exactly. B = x in T, exact.
// Every product q * x is exact in f32 and the tensor core accumulates in f32; the scale and
// bias are applied in f32 per group after the products, as the algebraic split of the seed's
// fast kernels. The bound of oracle/gemv.py (f32 accumulation over `in` terms) covers it.
//
// Layout. A warp owns TILES m16 tiles (16 TILES rows; the tiles share B) and walks K in blocks
// of 128 codes (64 bytes per row): the
// quad thread c = lane % 4 loads 16 bytes (32 codes) of rows g = lane / 4 and g + 8: codes
// 32c .. 32c + 31 of the block. mma step s (0..7) of a block uses word s / 2 of those 16 bytes:
// nibble pairs (p, p + 4) land in one register as T x 2 (LOP3 with mask 0x000F000F), p = 0, 1
// for even s and 2, 3 for odd s. The k slots of A and B are the same slots (the sum is over
// slots; which code sits in which slot only has to agree), so B takes x at the same codes.
// Groups: B's 8 columns are 8 consecutive groups of a super-block (8 G codes): lane (g, c)
// holds x in column g only where its codes belong to group g of the super-block, else 0. So
// C[r][n] = sum_{d in group n} q[r,d] x[d] exactly per group; at the end of each super-block the
// thread folds its C values (rows g, g + 8; columns 2c, 2c + 1) into f32 row sums with the
// groups' scales and biases and clears C. The 4 quad threads' row sums meet by shuffles, the
// block's warps (which split K by super-blocks) in shared memory, in warp order.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/gemv.py): int4, T in {f16, bf16}, group_size in
// {32, 64, 128}, in % 128 == 0, 16-byte aligned w and x; rows past `out` read row 0 and store
// nothing. Blocks of 32 * WARPS threads (WARPS in 1..8) per 16 * TILES rows. Test-only mutants
// (tests/mutants.py): KPARITY_MUTANT_NIBBLE_ORDER, _GROUP_OFF_BY_ONE, _DROP_BIAS, _SKIP_LAST_GROUP.
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

template <typename T, int TILES>
__global__ void __launch_bounds__(32 * KPM_MAX_WARPS)
kp_qgemv_mma(const uint4* __restrict__ w, const typename T::storage* __restrict__ scales,
             const typename T::storage* __restrict__ biases,
             const typename T::storage* __restrict__ x, typename T::storage* __restrict__ out,
             int out_dim, int in_dim, int group_size) {
    if constexpr (sizeof(typename T::storage) == 4) {
        __trap();  // f32 activations have no exact tensor-core path: the contract refuses them
    } else {
        constexpr int R = 2 * TILES;  // rows per thread: g and g + 8 of each m16 tile
        typedef typename T::storage S;
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
        const int g = lane >> 2, c = lane & 3;
        const int row0 = blockIdx.x * 16 * TILES;
        const int chunks = in_dim / 32;          // 16-byte chunks of 32 codes per row
        const int groups = in_dim / group_size;
        const int blocks_per_super = group_size / 16;   // 8 groups of G codes / 128
        const int blocks = in_dim / 128;
        const int supers = (blocks + blocks_per_super - 1) / blocks_per_super;
        const uint4* xv = reinterpret_cast<const uint4*>(x);

        size_t wrow[R], grow[R];  // index 2 i + h: tile i, row g + 8 h
#pragma unroll
        for (int k = 0; k < R; ++k) {
            const int row = row0 + 16 * (k >> 1) + g + 8 * (k & 1);
            wrow[k] = (size_t)(row < out_dim ? row : 0) * chunks;
            grow[k] = (size_t)(row < out_dim ? row : 0) * groups;
        }
        float acc[R];
        uint4 next[R];  // the warp's next 16-byte chunks, in flight across super-blocks too
#pragma unroll
        for (int k = 0; k < R; ++k) {
            acc[k] = 0.0f;
            next[k] = warp < supers ? w[wrow[k] + 4 * warp * blocks_per_super + c]
                                    : make_uint4(0u, 0u, 0u, 0u);
        }
        for (int sup = warp; sup < supers; sup += warps) {
            const int b_first = sup * blocks_per_super;
            const int b_last = min(b_first + blocks_per_super, blocks);
            const int first = sup * 8;  // C column n <-> group first + n
            // This thread's fold inputs (columns 2c, 2c + 1 of its rows), loaded now and used
            // after the super-block's math, and the groups' sums of x (8 chains, fixed order).
            S sc[R][2], bi[R][2];
            float xs[2];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int grp = min(first + 2 * c + j, groups - 1);
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    sc[k][j] = scales[grow[k] + grp];
                    bi[k][j] = biases[grow[k] + grp];
                }
                float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                for (int v = 0; v < group_size / 8; ++v) {
                    float f[8];
                    Vec<T>::unpack(xv[(size_t)grp * (group_size / 8) + v], f);
#pragma unroll
                    for (int k = 0; k < 8; ++k) part[k] += f[k];
                }
                xs[j] = ((part[0] + part[1]) + (part[2] + part[3])) +
                        ((part[4] + part[5]) + (part[6] + part[7]));
            }
            float cacc[TILES][4];
#pragma unroll
            for (int i = 0; i < TILES; ++i) cacc[i][0] = cacc[i][1] = cacc[i][2] = cacc[i][3] = 0.0f;
            for (int blk = b_first; blk < b_last; ++blk) {
                uint4 cur[R];
#pragma unroll
                for (int k = 0; k < R; ++k) cur[k] = next[k];
                const int nb = blk + 1 < b_last ? blk + 1 : (sup + warps) * blocks_per_super;
                if (nb < blocks) {
#pragma unroll
                    for (int k = 0; k < R; ++k) next[k] = w[wrow[k] + 4 * nb + c];
                }
                // x at this thread's 32 codes, kept where they belong to column g's group.
                const int code0 = (blk - b_first) * 128 + 32 * c;
                int column = code0 / group_size;
#ifdef KPARITY_MUTANT_GROUP_OFF_BY_ONE
                // mutant: a group's last 32 codes are added into the next group
                if ((code0 + 32) % group_size == 0 && column + 1 < 8 && first + column + 1 < groups)
                    column += 1;
#endif
                const bool mine = column == g;
                unsigned xr[16];
#pragma unroll
                for (int v = 0; v < 4; ++v) {  // only the owning lanes read x
                    const uint4 q = mine ? xv[(size_t)blk * 16 + 4 * c + v]
                                         : make_uint4(0u, 0u, 0u, 0u);
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
                    for (int i = 0; i < TILES; ++i) {
                        const unsigned* wa = reinterpret_cast<const unsigned*>(&cur[2 * i]);
                        const unsigned* wb = reinterpret_cast<const unsigned*>(&cur[2 * i + 1]);
                        unsigned a[4];
                        a[0] = kpmma::nibble_pair<T>(wa[wi], 4 * p);      // row g,   (p, p+4)
                        a[1] = kpmma::nibble_pair<T>(wb[wi], 4 * p);      // row g+8, (p, p+4)
                        a[2] = kpmma::nibble_pair<T>(wa[wi], 4 * p + 4);  // row g,   (p+1, p+5)
                        a[3] = kpmma::nibble_pair<T>(wb[wi], 4 * p + 4);  // row g+8, (p+1, p+5)
                        kpmma::Mma<T>::mma(cacc[i], a, b0, b1);
                    }
                }
            }
            // Fold: C[row][col] is sum q x over group `first + col` of this super-block.
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int grp = first + 2 * c + j;
                if (grp >= groups) continue;
#ifdef KPARITY_MUTANT_SKIP_LAST_GROUP
                if (grp == groups - 1) continue;
#endif
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    const float q_x = cacc[k >> 1][2 * (k & 1) + j];
#ifdef KPARITY_MUTANT_DROP_BIAS
                    acc[k] = fmaf(T::load(&sc[k][j], 0), q_x, acc[k]);
#else
                    acc[k] = fmaf(T::load(&sc[k][j], 0), q_x,
                                  fmaf(T::load(&bi[k][j], 0), xs[j], acc[k]));
#endif
                }
            }
        }
        // The quad's 4 threads hold disjoint groups of the same rows: add them (fixed order).
#pragma unroll
        for (int k = 0; k < R; ++k) {
            acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], 1);
            acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], 2);
        }
        __shared__ float partial[KPM_MAX_WARPS][16 * TILES];
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
