// kp_qgemv_mma<T, STAGES, G>: kparity's int4 GEMV on tensor cores (f16 / bf16 activations),
// built to stream the packed weights at the HBM limit; one instance per group size G.
//
//     out[r] = sum_g ( s[r,g] * sum_{d in g} q[r,d] x[d]  +  b[r,g] * sum_{d in g} x[d] )
//
// Why tensor cores: the FFMA kernel (kp_qgemv.cu) spends ~3.5 instructions per code (split,
// convert, FMA), about 6 us of issue at llama3-8b-up on an H100 against a ~12 us memory time.
// Here one mma.m16n8k16 does 256 code x activation products and the unpack is ~1.4 instructions
// per code (shift, LOP3, subtract, two codes per 32-bit register); the main loop is ~2.2 SASS
// instructions per code in all.
//
// Exactness. Two exact paths; the block picks one from x's range (the same in every block).
// Subtraction path: A = codes q as T: (MAGIC | q) is the T value BASE + q exactly (bf16
// 128 + q, f16 1024 + q), and subtracting BASE (sub.rn.{bf16,f16}x2) gives q exactly; B = x.
// Fast path, no subtraction: a T bit pattern below 2^(mantissa bits + 1) is that integer times
// 2^-TINY (bf16 2^-133, f16 2^-24: subnormals and the first binade), so the masked word itself
// is A = q 2^-TINY (low nibble of a half) or 16 q 2^-TINY (high nibble): 5 instructions per 8
// codes instead of 11. B = x 2^k (low-nibble slots) and x 2^(k - 4) (high-nibble slots), staged
// once per block, so every product is q x 2^(k - TINY), and the fold multiplies the sums by
// 2^(TINY - k). Where x lies in the window of Mma::fast (bf16: all nonzero |x| normal, below
// 2^114, within 2^90 of each other; f16: |x| < 4096) every B is exact and every nonzero product
// a normal f32 at least 2^28 above the smallest normal, so the tensor core computes the same
// sums scaled by a power of two: the two paths agree bit for bit (tests/test_gpu.py, on x in and
// out of the window; KPARITY_DIAG_SUBTRACT forces the subtraction path). Every product q x is
// exact in f32 and the tensor core accumulates in f32; the scale and bias are applied in f32
// per group after the products, as the algebraic split of the seed's fast kernels. The bound
// of oracle/gemv.py (f32 accumulation over `in` terms) covers it.
//
// Fragments. A warp owns one m16 tile (16 rows) and walks K in blocks of 128 codes (64 bytes
// per row): the quad thread c = lane % 4 reads 16 bytes (32 codes) of rows g = lane / 4 and
// g + 8: codes 32c .. 32c + 31 of the block. mma step s (0..7) of a
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
// Streaming. A block is (32 tiles, parts) threads: warp (tile, part) owns rows 16 tile ..
// 16 tile + 15 of the block's and K part `part`, a contiguous run of whole chunks (max(4
// blocks, a super-block)), so each warp reads one contiguous span of each of its rows. Weights
// reach registers through shared memory, a step of 4 blocks at a time: 16 rows x 256 bytes,
// which the warp copies with cp.async as two contiguous 256-byte runs per instruction. A
// read-only kernel in such 8-16 row x 256-byte steps streams at 87-94 % of the copy ceiling,
// in the earlier 32 rows x 64 bytes (each lane copying its own fragments) at 68-78 %
// (scripts/access_pattern.py; benchmarks/HISTORY.md, h100-2026-11-24-steps). The warp runs a
// pipeline of STAGES steps (STAGES - 1 in flight): it waits for the oldest with
// cp.async.wait_group, a __syncwarp makes every lane's copies visible to all (and ends the reads of
// the stage it refills), and the stage consumed one iteration earlier is refilled. Why not
// registers: the compiler gives all of a warp's global loads one scoreboard, so a register pipeline
// waits for every load in flight whenever it needs one of them. Stages are swizzled (vector u of
// row r at u ^ 4 (r & 1)), so the quarter warps' 16-byte reads are free of bank conflicts. Before
// the loop, by the whole block: the scales and biases of the block's rows (copy group 0, one
// contiguous run each, streamed in whole lines; loaded a super-block at a time from scattered
// rows they cost 2-7 us at the bench shapes on an H100, benchmarks/HISTORY.md,
// h100-2026-11-23-cp-async), then x (group 1); then each group's sum of x and x's fragment order.
// The launch (benchmarks/HISTORY.md, h100-2026-11-24-prewait): the next kernel is let in at the
// start, and the scales and biases (11 % of the bytes at g64) are copied before the wait for the
// kernels before, so in a chain of launches a block that finds an SM free copies them while the
// kernel before computes its last steps and the memory would idle: 9-10 % less time per call in the
// bench's PDL chain at the issue's shapes (H100 bf16: 12.7 us against 14.0 at llama3-8b). The
// first steps of w copied before the wait as well were up to 32 % slower: x, copied after the
// wait, then lands behind them.
// The launcher (gemv.py) aims at ~14 warps an SM, all resident at once, and picks parts for
// equal runs, tiles and STAGES (3 where one round of blocks still fits, else 2) from the
// blocks' shared memory: tiles * parts * STAGES * 4 KiB of stages, 64 tiles * groups bytes of
// scales and biases, 2 in bytes of x, 64 zero bytes (x where a lane is outside its column),
// 4 groups bytes of sums.
//
// Where the time goes (H100 bf16 llama3-8b-up; scripts/mma_trace.py, which builds this file with
// KPARITY_DIAG_TRACE, and ncu; benchmarks/HISTORY.md, h100-2026-11-24-trace, -subnormal): the first
// step lands ~4.5 us after the start; then a warp takes ~1.5 us to compute a step on the fast path
// (~1.7 us subtracting), close to what the memory takes to deliver the next (~2.2 us), so the
// last step's math and the blocks' uneven ends (~1 us) are what the copies alone do not pay.
// Over the kernel a scheduler issued ~0.5 instructions a cycle with 3.5 warps (subtraction
// path), most stalls waiting on dependent ALU results; the 4 blocks of a step are unrolled
// (1-2 % faster than a loop). Tried and equal or slower: two accumulator chains (twice), shifts
// as multiply-highs (IMAD.HI: 8-12 % slower), the last 4 blocks as two steps of 2 (and again
// on the fast path, as 2 or 4 steps: 0-5 % slower), steps 1 .. STAGES - 2 copied only after x
// landed, each step's copies from one pointer and a row stride (1-4 % slower), the weight,
// scale and bias copies issued before the wait for the kernel before (0-12 % slower with
// PDL, 7-19 % without); and (benchmarks/HISTORY.md, h100-2026-11-24-mlx-cuda) steps of 2
// blocks (16 rows x 128 bytes) with 6 stages or with twice the warps (0-11 % slower, the
// copies alone 2-5 %), a step held in registers so its slot is refilled before the math (the
// copies alone 1 % faster, with the math 2-6 % slower at 125 registers), one accumulator chain
// per block of a step (4-8 % slower), the fold's scales and biases swizzled free of the 8-way
// bank conflicts ncu counts at llama3-8b-up and the prologue's x pass rotated (no gain), a
// pool of the block's steps claimed by whichever warp refills first, partial sums added in a
// fixed order (the copies alone 2 % faster at llama3-8b-up, the kernel not faster). Static
// shared memory is exactly `partial` (1024 bytes): 16 bytes more moved the dynamic stages 16
// bytes off the 1024-byte boundary they start on and cost 3.3-4.7 us at the bench shapes
// (which alignment the copies need was not isolated).
//
// Instructions (H100 bf16, benchmarks/HISTORY.md, h100-2026-11-24-g-template): with G a template
// argument the place of each block of a step in its super-block, its x vectors (bit j of a per-lane
// mask: the lane's codes in column g's group or not) and its stage vectors (two per-lane bases,
// immediate offsets) are fixed before the loop, so the unrolled step does no address or
// group arithmetic: ~60 SASS instructions a block (8 HMMA, 6 LDS.128, 40 for the codes),
// against ~90 when G was a run-time argument; the fold loads scale, bias and x-sum pairs as
// one word where the group count is even; full steps run unguarded. 2-3 % faster at the
// issue's shapes. Measured there, and not kept: the math alone (no copies) took 10.3 us at
// llama3-8b-up with the old loop, so it was the bound beside the memory (12.8 us); an HMMA
// m16n8k16 has 24.7 cycles of latency and an SM issues at most 0.66 a cycle, so neither the
// accumulator chain (two chains: no change) nor the tensor pipe is the limit; an L2 bulk
// prefetch of later steps was 17-27 % slower (its copies alone 7-19 %), the scales and biases
// copied after the last step (the group sums held in registers) 6-11 % slower (its copies
// alone 1.3-2.2 us slower), and each row's address as a fixed offset from the warp's first
// row 2 % slower at llama3-8b-down.
//
// The tail (benchmarks/HISTORY.md, h100-2026-11-24-balance; scripts/mma_trace.py's per-warp table):
// 14 warps sit 4, 4, 3, 3 on an SM's four sub-partitions, and the warps of the full two compute
// ~12 % slower and end ~0.7 us after the others; and the memory serves the SMs unevenly (at
// llama3-8b-up the median warp's last step lands 9.0-11.4 us in, the same SMs slow from run to
// run), so the kernel waits for its slowest SMs. Tried and slower: K split unevenly so that
// every sub-partition has 14 steps (4-7 %: the warps with more steps stream longer), the
// block's steps interleaved over 8, 12 or 16 equal warps (up to 13 %), steps claimed across
// the grid with each step's row sums published to the tile's last arriver (1.5-2x: the
// release of each step's sums waits for the copies in flight).
// Also not faster (benchmarks/HISTORY.md, h100-2026-11-24-chains): 2 or 4 accumulator chains
// (0.6-1.3 %, within the A/B's 2 % delta) and each row's copy address as a base plus a 32-bit byte
// offset (2 SASS instructions a row instead of 4; 2 % slower at llama3-8b-up); nor a step's copies
// waited for in 2 or 4 groups, or the bias terms added before the loop
// (benchmarks/HISTORY.md, h100-2026-11-24-split).
//
// Reductions (deterministic): the 4 quad threads' row sums by two shuffles, a tile's K parts in
// shared memory in part order; each group's sum of x in 8 fixed chains.
//
// DISPATCH INVARIANTS (gpu_impls/cuda/gemv.py): int4, T in {f16, bf16}, group_size in
// {32, 64, 128} (the instance's G; any other value traps), in % 128 == 0, in <= 16384 (x in
// shared memory), 16-byte aligned w, x, scales and biases; rows past `out` read the last row's
// codes and store nothing. Launched as a programmatic dependent launch: it lets the next kernel
// in at its start, and copies scales and biases before it waits for the kernels before it, so
// those kernels must not write them (weights are static); w and x are read, and out written,
// only after the wait. Test-only mutants (tests/mutants.py): KPARITY_MUTANT_NIBBLE_ORDER,
// _GROUP_OFF_BY_ONE, _DROP_BIAS, _SKIP_LAST_GROUP (on both paths).
#include "common.cuh"
#include "mma16.cuh"

#define KPM_MAX_WARPS 16

#ifdef KPARITY_DIAG_TRACE
// Timing diagnostic (scripts/mma_trace.py): lane 0 of each warp records when its phases end.
// Per warp, from the wait for the kernels before on: [0] globaltimer then, [1] SM | %warpid << 16
// (%warpid % 4: the SM sub-partition the warp runs on), [2] its steps, [3] clock64 then, [4] x
// landed, [5] the prologue done, [6 + 2 i] step i landed, [7 + 2 i] step i computed
// (i < KPM_TRACE_STEPS), [38] the end, [39] globaltimer then.
#define KPM_TRACE_STEPS 16
#define KPM_TRACE_EVENTS 40
#define KPM_TRACE_WARPS 16384
__device__ long long kpm_trace[KPM_TRACE_WARPS][KPM_TRACE_EVENTS];
#define KPM_MARK(e, v) \
    if (lane == 0 && trace_warp < KPM_TRACE_WARPS) kpm_trace[trace_warp][e] = (v)
#define KPM_CLOCK(e) KPM_MARK(e, clock64())
#define KPM_STEP_CLOCK(e) if (i < KPM_TRACE_STEPS) KPM_CLOCK(e)
#else
#define KPM_STEP_CLOCK(e)
#define KPM_MARK(e, v)
#define KPM_CLOCK(e)
#endif

namespace kpmma {

// The 16-bit types' tensor-core pieces: MAGIC = BASE twice (bf16 128.0, f16 1024.0), under
// whose mantissa a 4-bit code reads as BASE + q exactly.
using kp_mma16::IS_BF16;

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
    // Codes without the subtraction (the fast path): a bit pattern P < 2^(mantissa bits + 1) of T
    // is P 2^-TINY exactly (exponent field 0 or 1: bf16 P < 0x100, TINY = 133; f16 P < 0x800,
    // TINY = 24), so w & 0x000F000F holds two codes as q 2^-TINY and w & 0x00F000F0 two as
    // q 2^(4 - TINY), each one LOP3 from the packed word.
    static constexpr int TINY = IS_BF16<T> ? 133 : 24;
    // The fast path's x: B = x 2^k in the low nibbles' k slots, x 2^(k - 4) in the high ones, so
    // every product is q x 2^(k - TINY). Where `fast`: every nonzero |x| in a window where these
    // B values are exact T and every nonzero product is a normal f32 at least 2^28 above the
    // smallest normal (what a tensor core might flush is far below the f32 bound); the sums
    // then scale back by `unscale` = 2^(TINY - k) exactly. hi, lo: the largest and the smallest
    // nonzero |x| bit patterns of the whole x. Else the subtraction path runs.
    //   bf16: all nonzero |x| normal, below 2^114, within 2^90 of each other; k = 252 - the
    //     largest exponent field (B < 2^126; products >= 2^(-8 - 90) = 2^-98).
    //   f16: |x| < 4096 (16 x exact, finite); k = 4 (products >= 2^-24 2^-20, normal).
    static __device__ __forceinline__ bool fast(unsigned hi, unsigned lo) {
        if constexpr (IS_BF16<T>)
            return hi == 0 || (lo >= 0x80u && hi < (241u << 7) && (hi >> 7) - (lo >> 7) <= 90u);
        else
            return hi < 0x6C00u;
    }
    static __device__ __forceinline__ int k(unsigned hi) {
        return IS_BF16<T> ? 252 - (int)(hi >> 7) : 4;
    }
    static __device__ __forceinline__ float unscale(unsigned hi) {  // 2^(TINY - k)
        return IS_BF16<T> ? __uint_as_float(((hi >> 7) + 8u) << 23) : 1048576.0f;
    }
    // Both halves of `pair` times 2^e, exact under `fast` (bf16: add to the exponent field).
    static __device__ __forceinline__ unsigned scaled(unsigned pair, int e) {
        unsigned out = 0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            unsigned short v = (unsigned short)(pair >> (16 * h));
            if constexpr (IS_BF16<T>)
                v = (v & 0x7FFFu) ? (unsigned short)(v + (e << 7)) : v;
            else
                v = F16::from_f32(F16::to_f32(v) * (float)(1 << e));
            out |= (unsigned)v << (16 * h);
        }
        return out;
    }
    // c += A (16 x 16, T) B (16 x 8, T), f32 accumulation (kernels/mma16.cuh).
    static __device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
        kp_mma16::mma<T>(c, a, b0, b1);
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

// A packed word as the kernel reads it (the identity, but for a test-only mutant).
__device__ __forceinline__ unsigned codes_word(unsigned word) {
#ifdef KPARITY_MUTANT_NIBBLE_ORDER  // mutant: nibbles of a word read in reverse order
    word = __byte_perm(word, 0u, 0x0123);
    word = ((word >> 4) & 0x0F0F0F0Fu) | ((word & 0x0F0F0F0Fu) << 4);
#endif
    return word;
}

// T x 2 of nibbles (p, p + 4) of `word` (p = shift / 4): the exact codes (subtraction path).
template <typename T>
__device__ __forceinline__ unsigned nibble_pair(unsigned word, int shift) {
    unsigned m;
    const unsigned v = codes_word(word) >> shift;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(m) : "r"(v), "r"(0x000F000Fu),
        "r"(Mma<T>::MAGIC));  // (v & mask) | magic
    return Mma<T>::codes(m);
}

template <bool B>
struct Flag {
    static constexpr bool value = B;
};

}  // namespace kpmma

// The GEMV of one weight matrix w [out, in] (and its scales, biases) against one x row: the body
// of both kernels below.
template <typename T, int STAGES, int G>
__device__ __forceinline__ void
kpm_gemv(const uint4* __restrict__ w, const typename T::storage* __restrict__ scales,
         const typename T::storage* __restrict__ biases, const typename T::storage* __restrict__ x,
         typename T::storage* __restrict__ out, int out_dim, int in_dim, int group_size_arg,
         float (*partial)[16]) {
    if constexpr (sizeof(typename T::storage) == 4) {
        __trap();  // f32 activations have no exact tensor-core path: the contract refuses them
    } else {
        typedef typename T::storage S;
        constexpr int STEP = 4;  // 128-code blocks per step: 256 bytes of each of 16 rows
        const int lane = threadIdx.x & 31, tile = threadIdx.x >> 5, tiles = blockDim.x >> 5;
        const int part = threadIdx.y, parts = blockDim.y;
        const int warp = part * tiles + tile;
#ifdef KPARITY_DIAG_TRACE
        const int trace_warp = blockIdx.x * tiles * parts + warp;
#endif
        const int g = lane >> 2, c = lane & 3;
        const int block_row0 = blockIdx.x * 16 * tiles;
        const int row0 = block_row0 + 16 * tile;  // this warp's 16 rows
        static_assert(G == 32 || G == 64 || G == 128, "group_size: 32, 64 or 128");
        if (group_size_arg != G) __trap();  // the launcher picks the instance of the case's G
        constexpr int group_size = G;
        constexpr int group_shift = G == 32 ? 5 : G == 64 ? 6 : 7;
        constexpr int bps = G / 16;              // 128-code blocks per super-block of 8 groups
        const int groups = in_dim / group_size;
        const int blocks = in_dim / 128;
        // K parts: runs of whole chunks (a step and a super-block both divide a chunk).
        const int chunk = max(STEP, bps);
        const int chunks = (blocks + chunk - 1) / chunk;
        const int b_begin = min(part * chunks / parts * chunk, blocks);
        const int b_end = min((part + 1) * chunks / parts * chunk, blocks);
        const int n = b_end - b_begin;           // this warp's blocks
        const int steps = (n + STEP - 1) / STEP;

        // Dynamic shared memory: every warp's STAGES stages (16 rows x 16 vectors, swizzled:
        // vector u of row r at u ^ 4 (r & 1), so the 8 lanes of a quarter warp reading rows
        // g, g + 1 at vectors 4 j + c hit distinct banks); the block's rows' scales and biases
        // ([16 tiles][groups] each, as in global memory); x in fragment order; 64 zero bytes;
        // the groups' sums of x.
        extern __shared__ uint4 kpm_shared[];
        uint4* stage_s = kpm_shared + warp * (STAGES * 256);
        S* scale_s = reinterpret_cast<S*>(kpm_shared + parts * tiles * (STAGES * 256));
        S* bias_s = scale_s + 16 * tiles * groups;
        uint4* x_s = reinterpret_cast<uint4*>(bias_s + 16 * tiles * groups);  // in / 8 vectors
        uint4* zero_s = x_s + in_dim / 8;                               // x where not "mine"
        float* xsum_s = reinterpret_cast<float*>(zero_s + 4);           // one per group

        // Copies: step st (blocks b_begin + 4 st ..) of the warp's 16 rows, lane l taking
        // vector l % 16 of rows 2 k + l / 16 (k = 0..7): each copy instruction reads two
        // contiguous 256-byte runs. Rows past `out` read the last row (their sums are never
        // stored).
        const int half = lane >> 4, u = lane & 15;
        const uint4* wl = w + 4 * b_begin + u;
        const int row_vectors = in_dim / 32;
        auto copy_step = [&](int slot, int st) {
            const int nb = min(STEP, n - STEP * st);  // blocks in this step
            uint4* dst = stage_s + slot * 256;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const int r = 2 * k + half;
                const int row = min(row0 + r, out_dim - 1);
                if (u < 4 * nb)
                    kpmma::copy_async(&dst[r * 16 + (u ^ ((r & 1) << 2))],
                                      wl + (size_t)row * row_vectors + 16 * st);
            }
        };

        // Prologue. Copy group 0, by the whole block and before the wait for the kernels
        // before: the scales and biases of the block's rows, which are one contiguous run each
        // (16 tiles rows of `groups` values from row block_row0: 16-byte aligned, as 32 groups
        // bytes a tile are a multiple of 16), so they stream in whole lines; rows past `out`
        // are not copied. They are weights, which no kernel before this one writes (DISPATCH
        // INVARIANTS), so a block let in early copies them while the kernel before finishes.
        // Then the wait; group 1: x (perhaps the kernel before's output); groups 2 .. STAGES:
        // this warp's first STAGES - 1 steps (empty groups past the run keep the count uniform).
        const int threads = blockDim.x * blockDim.y;
        const int tid = threadIdx.y * blockDim.x + threadIdx.x;
        {
            const int count = min(16 * tiles, out_dim - block_row0) * groups;  // values
            const size_t first = (size_t)block_row0 * groups;
            const uint4* sv = reinterpret_cast<const uint4*>(scales + first);
            const uint4* bv = reinterpret_cast<const uint4*>(biases + first);
            uint4* ssv = reinterpret_cast<uint4*>(scale_s);
            uint4* bsv = reinterpret_cast<uint4*>(bias_s);
            for (int v = tid; v < count / 8; v += threads) {
                kpmma::copy_async(&ssv[v], &sv[v]);
                kpmma::copy_async(&bsv[v], &bv[v]);
            }
            for (int e = (count / 8) * 8 + tid; e < count; e += threads) {
                scale_s[e] = scales[first + e];  // a tail shorter than 16 bytes
                bias_s[e] = biases[first + e];
            }
        }
        kpmma::copy_async_commit();
        pdl_wait();
#ifdef KPARITY_DIAG_TRACE
        {
            long long now;
            unsigned sm, hw_warp;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            asm volatile("mov.u32 %0, %%warpid;" : "=r"(hw_warp));
            KPM_MARK(0, now);
            KPM_MARK(1, sm | hw_warp << 16);
            KPM_MARK(2, steps);
            KPM_CLOCK(3);
        }
#endif
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        for (int v = tid; v < in_dim / 8; v += threads) kpmma::copy_async(&x_s[v], &xv[v]);
        kpmma::copy_async_commit();
#pragma unroll
        for (int st = 0; st < STAGES - 1; ++st) {
            if (st < steps) copy_step(st, st);
            kpmma::copy_async_commit();
        }
        if (tid < 4) zero_s[tid] = make_uint4(0u, 0u, 0u, 0u);
        // The largest and the smallest nonzero |x| bit patterns, in `partial` (used only at the
        // end): static shared memory stays 1024 bytes, so the dynamic stages keep starting on a
        // 1024-byte boundary (16 bytes more cost 3.3 us at llama3-8b-up, H100).
        unsigned* x_range = reinterpret_cast<unsigned*>(&partial[0][0]);
        if (tid == 0) {
            x_range[0] = 0u;
            x_range[1] = 0xFFFFu;
        }
        kpmma::copy_async_wait<STAGES - 1>();  // x and the scales landed (the steps may not have)
        __syncthreads();
        KPM_CLOCK(4);
        {  // x's range decides the path (the same in every block: all read the whole x)
            unsigned hi = 0u, lo = 0xFFFFu;
            for (int v = tid; v < in_dim / 8; v += threads) {
                const uint4 vec = x_s[v];
                const unsigned w[4] = {vec.x, vec.y, vec.z, vec.w};
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const unsigned a = (w[e >> 1] >> (16 * (e & 1))) & 0x7FFFu;
                    hi = max(hi, a);
                    lo = a ? min(lo, a) : lo;
                }
            }
            hi = __reduce_max_sync(0xffffffffu, hi);
            lo = __reduce_min_sync(0xffffffffu, lo);
            if (lane == 0) {
                atomicMax(&x_range[0], hi);
                atomicMin(&x_range[1], lo);
            }
        }
        __syncthreads();
#ifndef KPARITY_DIAG_SUBTRACT
        const bool fast = kpmma::Mma<T>::fast(x_range[0], x_range[1]);
#else
        const bool fast = false;  // timing diagnostic: always the subtraction path
#endif
        const int k_lo = kpmma::Mma<T>::k(x_range[0]);
        const float unscale = fast ? kpmma::Mma<T>::unscale(x_range[0]) : 1.0f;
        // Each group's sum of x (8 fixed chains), and its vectors put in fragment order: the
        // 8 values x0..x7 of a vector as the words (x0, x4), (x1, x5), (x2, x6), (x3, x7), which
        // are b0, b1 of mma steps with p = 0 and p = 2 (see the math below); on the fast path
        // scaled by 2^k (b0: low nibbles) and 2^(k - 4) (b1: high nibbles).
        for (int grp = tid; grp < groups; grp += threads) {
            float partsum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            for (int v = 0; v < group_size / 8; ++v) {
                uint4& vec = x_s[grp * (group_size / 8) + v];
                float f[8];
                Vec<T>::unpack(vec, f);
#pragma unroll
                for (int k = 0; k < 8; ++k) partsum[k] += f[k];
                uint4 frag = make_uint4(__byte_perm(vec.x, vec.z, 0x5410),
                                        __byte_perm(vec.x, vec.z, 0x7632),
                                        __byte_perm(vec.y, vec.w, 0x5410),
                                        __byte_perm(vec.y, vec.w, 0x7632));
                if (fast)
                    frag = make_uint4(kpmma::Mma<T>::scaled(frag.x, k_lo),
                                      kpmma::Mma<T>::scaled(frag.y, k_lo - 4),
                                      kpmma::Mma<T>::scaled(frag.z, k_lo),
                                      kpmma::Mma<T>::scaled(frag.w, k_lo - 4));
                vec = frag;
            }
            xsum_s[grp] = ((partsum[0] + partsum[1]) + (partsum[2] + partsum[3])) +
                          ((partsum[4] + partsum[5]) + (partsum[6] + partsum[7]));
        }
        __syncthreads();
        KPM_CLOCK(5);

        float acc[2] = {0.0f, 0.0f};  // rows g, g + 8
        float cacc[4];
        // Everything a block's loads and its place in a super-block need is fixed per lane or
        // known at compile time (G, the block j of a step), so the unrolled step does no
        // address arithmetic. A part starts on a super-block (chunks are whole super-blocks
        // and steps), so block j of step i is block pos = (4 i + j) % bps of its super-block:
        // j % bps for G <= 64, 4 (i & 1) + j for G = 128.
        // Which of the 8 blocks t = 4 (i & 1) + j of two steps have this lane's codes in column
        // g's group (x from x_s; else the zero vectors): bit t of `mine`.
        unsigned mine = 0u;
#pragma unroll
        for (int t = 0; t < 8; ++t)
            mine |= (unsigned)((((t % bps) * 128 + 32 * c) >> group_shift) == g) << t;
        // The stage vectors this lane reads: vector 4 j + c of row g (and g + 8, 128 vectors
        // on), swizzled: (4 j + c) ^ 4 (g & 1) = 4 j + c + 4 (g & 1) (j even), - 4 (g & 1) (odd).
        const int lane_even = g * 16 + c + 4 * (g & 1), lane_odd = g * 16 + c - 4 * (g & 1);
        // The main loop, on one of the two exact paths (`fast`: codes without the subtraction).
        auto main_loop = [&](auto path) {
            for (int i = 0; i < steps; ++i) {
                // Step i is copy group i + 2: wait until at most STAGES - 2 younger ones are in
                // flight; the warp's barrier makes every lane's copies visible to all and ends
                // every lane's reads of the slot taken last iteration, which is refilled with
                // step i + STAGES - 1.
                kpmma::copy_async_wait<STAGES - 2>();
                __syncwarp();
                KPM_STEP_CLOCK(6 + 2 * i);
                const int slot = i % STAGES;
                if (i + STAGES - 1 < steps) copy_step((i + STAGES - 1) % STAGES, i + STAGES - 1);
                kpmma::copy_async_commit();
                const uint4* cur_even = stage_s + slot * 256 + lane_even;
                const uint4* cur_odd = stage_s + slot * 256 + lane_odd;
                const int b0_step = b_begin + STEP * i;  // the step's first block
                const uint4* x_step = x_s + (size_t)b0_step * 16 + 4 * c;
                const unsigned mine_step = G == 128 ? mine >> (4 * (i & 1)) : mine;
                const int nb = min(STEP, n - STEP * i);  // <= STEP: unrolled, guarded
                auto block = [&](const int j) {
                    const uint4* cur_s = (j & 1) ? cur_odd : cur_even;
                    uint4 cur[2];
                    cur[0] = cur_s[4 * j];
                    cur[1] = cur_s[4 * j + 128];
#ifdef KPARITY_DIAG_LOAD_ONLY
                    // timing diagnostic (wrong results): the copies and their reads, no math
#pragma unroll
                    for (int k = 0; k < 2; ++k)
                        acc[k] += __uint_as_float((cur[k].x ^ cur[k].y ^ cur[k].z ^ cur[k].w)
                                                  & 0x3fffffu);
                    return;
#endif
                    // pos: compile-time for G <= 64; for G = 128, 4 (i & 1) + j
                    const int pos = G == 128 ? 4 * (i & 1) + j : j % bps;
                    if (pos == 0)  // a super-block starts
                        cacc[0] = cacc[1] = cacc[2] = cacc[3] = 0.0f;
                    // x at this thread's 32 codes where they belong to column g's group, else 0.
#ifndef KPARITY_MUTANT_GROUP_OFF_BY_ONE
                    const bool x_mine = (mine_step >> j) & 1u;
#else
                    // mutant: a group's last 32 codes are added into the next group
                    const int sup = (b0_step + j) / bps, code0 = pos * 128 + 32 * c;
                    int column = code0 >> group_shift;
                    if (((code0 + 32) & (group_size - 1)) == 0 && column + 1 < 8 &&
                        8 * sup + column + 1 < groups)
                        column += 1;
                    const bool x_mine = column == g;
#endif
                    const uint4* xs = x_mine ? x_step + 16 * j : zero_s;
                    unsigned xr[16];
#pragma unroll
                    for (int v = 0; v < 4; ++v) {
                        const uint4 q = xs[v];
                        xr[4 * v] = q.x;
                        xr[4 * v + 1] = q.y;
                        xr[4 * v + 2] = q.z;
                        xr[4 * v + 3] = q.w;
                    }
                    const unsigned* wa = reinterpret_cast<const unsigned*>(&cur[0]);
                    const unsigned* wb = reinterpret_cast<const unsigned*>(&cur[1]);
#pragma unroll
                    for (int s = 0; s < 8; ++s) {
                        const int wi = s >> 1, p = (s & 1) * 2;  // word, first nibble of the pair
                        // fragment order: xr[4 wi + p] = x at codes (8wi+p, 8wi+p+4), xr[4 wi + p
                        // + 1] = x at (8wi+p+1, 8wi+p+5): the codes of a[0], a[1] and a[2], a[3].
                        const unsigned b0 = xr[4 * wi + p], b1 = xr[4 * wi + p + 1];
                        unsigned a[4];
                        if constexpr (decltype(path)::value) {  // codes q 2^-TINY, 16 q 2^-TINY
                            const unsigned va = kpmma::codes_word(wa[wi]) >> (4 * p);
                            const unsigned vb = kpmma::codes_word(wb[wi]) >> (4 * p);
                            a[0] = va & 0x000F000Fu;  // row g,   (p, p+4)
                            a[1] = vb & 0x000F000Fu;  // row g+8, (p, p+4)
                            a[2] = va & 0x00F000F0u;  // row g,   (p+1, p+5)
                            a[3] = vb & 0x00F000F0u;  // row g+8, (p+1, p+5)
                        } else {  // codes q: (BASE + q) - BASE
                            a[0] = kpmma::nibble_pair<T>(wa[wi], 4 * p);      // row g,   (p, p+4)
                            a[1] = kpmma::nibble_pair<T>(wb[wi], 4 * p);      // row g+8, (p, p+4)
                            a[2] = kpmma::nibble_pair<T>(wa[wi], 4 * p + 4);  // row g,   (p+1, p+5)
                            a[3] = kpmma::nibble_pair<T>(wb[wi], 4 * p + 4);  // row g+8, (p+1, p+5)
                        }
                        kpmma::Mma<T>::mma(cacc, a, b0, b1);
                    }
                    if (pos == bps - 1 || STEP * i + j == n - 1) {
                        // Fold: C[row][col] is sum q x over group 8 sup + col of this super-block.
                        const int sup = (b0_step + j) / bps;
                        const int grp0 = 8 * sup + 2 * c;
                        // acc[h] += scale q x + bias sum x of group grp, rows g + 8 h
                        auto add = [&](int h, int grp, float q_x, float scale, float bias,
                                       float xsum) {
#ifdef KPARITY_MUTANT_SKIP_LAST_GROUP
                            if (grp == groups - 1) return;
#endif
#ifdef KPARITY_MUTANT_DROP_BIAS
                            acc[h] = fmaf(scale, q_x, acc[h]);
#else
                            acc[h] = fmaf(scale, q_x, fmaf(bias, xsum, acc[h]));
#endif
                        };
                        if ((groups & 1) == 0 && grp0 + 1 < groups) {
                            // both groups exist; an even groups count makes the pairs 4-byte
                            // aligned: one load per pair of scales, biases, sums of x
                            const float2 xs2 = *reinterpret_cast<const float2*>(&xsum_s[grp0]);
                            unsigned sp[2], bp[2];
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const int at = (16 * tile + g + 8 * h) * groups + grp0;
                                sp[h] = *reinterpret_cast<const unsigned*>(&scale_s[at]);
                                bp[h] = *reinterpret_cast<const unsigned*>(&bias_s[at]);
                            }
#pragma unroll
                            for (int jj = 0; jj < 2; ++jj)
#pragma unroll
                                for (int h = 0; h < 2; ++h)
                                    add(h, grp0 + jj, cacc[2 * h + jj] * unscale,
                                        T::to_f32((S)(sp[h] >> (16 * jj))),
                                        T::to_f32((S)(bp[h] >> (16 * jj))), jj ? xs2.y : xs2.x);
                            return;
                        }
#pragma unroll
                        for (int jj = 0; jj < 2; ++jj) {  // the last super-block, odd groups
                            const int grp = grp0 + jj;
                            if (grp >= groups) continue;
                            const float xsum = xsum_s[grp];
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const float q_x = cacc[2 * h + jj] * unscale;  // exact
                                const int at = (16 * tile + g + 8 * h) * groups + grp;
                                add(h, grp, q_x, T::to_f32(scale_s[at]), T::to_f32(bias_s[at]),
                                    xsum);
                            }
                        }
                    }
                };
                if (nb == STEP) {  // every step but maybe a run's last: no guards
#pragma unroll
                    for (int j = 0; j < STEP; ++j) block(j);
                } else {
#pragma unroll
                    for (int j = 0; j < STEP; ++j)
                        if (j < nb) block(j);
                }
                KPM_STEP_CLOCK(7 + 2 * i);
            }
        };
        if (fast)
            main_loop(kpmma::Flag<true>());
        else
            main_loop(kpmma::Flag<false>());
        kpmma::copy_async_wait<0>();  // no copy outlives the block (its shared memory)
#ifdef KPARITY_DIAG_LATE_DEPENDENTS
        pdl_launch_dependents();  // timing diagnostic: the next kernel let in only now, as before
#endif
        // The quad's 4 threads hold disjoint groups of the same rows: add them (fixed order).
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 1);
            acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 2);
        }
        if (c == 0) {
            partial[warp][g] = acc[0];
            partial[warp][g + 8] = acc[1];
        }
        __syncthreads();
        // Row r of the block: its tile's K parts added in part order.
        if (tid < 16 * tiles && block_row0 + tid < out_dim) {
            const int t = tid >> 4, r = tid & 15;
            float v = partial[t][r];
            for (int q = 1; q < parts; ++q) v += partial[q * tiles + t][r];
            T::store(out, block_row0 + tid, v);
        }
#ifdef KPARITY_DIAG_TRACE
        KPM_CLOCK(38);
        {
            long long now;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
            KPM_MARK(39, now);
        }
#endif
    }
}

template <typename T, int STAGES, int G>
__global__ void __maxnreg__(96)  // 20 warps an SM (gemv.py MMA_WARPS_PER_SM); blocks <= 16
kp_qgemv_mma(const uint4* __restrict__ w, const typename T::storage* __restrict__ scales,
             const typename T::storage* __restrict__ biases,
             const typename T::storage* __restrict__ x, typename T::storage* __restrict__ out,
             int out_dim, int in_dim, int group_size_arg) {
    // The next kernel is let in at once; this one waits for the kernels before it after its
    // scale and bias copies (the prologue of kpm_gemv).
#ifndef KPARITY_DIAG_LATE_DEPENDENTS
    pdl_launch_dependents();
#endif
    // static shared memory: `partial` alone (1024 bytes), so the dynamic stages start on a
    // 1024-byte boundary (tests/test_cuda_build.py)
    __shared__ float partial[KPM_MAX_WARPS][16];
    kpm_gemv<T, STAGES, G>(w, scales, biases, x, out, out_dim, in_dim, group_size_arg, partial);
}

// kp_moe_qgemv_mma: the MoE grouped GEMV at decode (gpu_impls/cuda/moe_gemm.py): the same
// GEMV, one x row per grid row. Row m = blockIdx.y of x [M, in] (rows sorted by expert, CSR
// offsets [E+1] on the device) belongs to the expert e with offsets[e] <= m < offsets[e + 1]
// (a binary search over the offsets clamped to [0, M]); its blocks run kpm_gemv on expert e's
// slabs of w [E, out, in / 32 vectors], scales and biases [E, out, in / G] into y row m. Each
// row reads its expert's weights, so an expert with several rows is read once per row (through
// the L2): the host takes this kernel only where the rows are at most the experts (decode).
// The offsets (the dispatch's output) are read after the wait for the kernels before, so the
// scales are copied after it too (kp_qgemv_mma copies them before). A row in no segment (a
// malformed layout) is not written. Host-side invariants (moe_gemm.py): out * in / G % 8 == 0
// (each expert's scales and biases start on 16 bytes), and kp_qgemv_mma's own.
template <typename T, int STAGES, int G>
__global__ void __maxnreg__(96)
kp_moe_qgemv_mma(const uint4* __restrict__ w, const typename T::storage* __restrict__ scales,
                 const typename T::storage* __restrict__ biases,
                 const typename T::storage* __restrict__ x, typename T::storage* __restrict__ y,
                 int out_dim, int in_dim, int group_size_arg, const int* __restrict__ offsets,
                 int experts, int rows_m) {
    __shared__ float partial[KPM_MAX_WARPS][16];  // as kp_qgemv_mma's
    pdl_launch_dependents();
    pdl_wait();
    const int m = blockIdx.y;
    auto at = [&](int e) { return min(max(offsets[e], 0), rows_m); };
    int lo = 0, hi = experts - 1;  // the last e in [0, E) with at(e) <= m
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (at(mid) <= m) lo = mid; else hi = mid - 1;
    }
    if (!(at(lo) <= m && m < at(lo + 1))) return;  // block-uniform: no barrier skipped
    const size_t e = (size_t)lo, groups = (size_t)(in_dim / G);
    kpm_gemv<T, STAGES, G>(w + e * out_dim * (size_t)(in_dim / 32), scales + e * out_dim * groups,
                           biases + e * out_dim * groups, x + (size_t)m * in_dim,
                           y + (size_t)m * out_dim, out_dim, in_dim, group_size_arg, partial);
}
