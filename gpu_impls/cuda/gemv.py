"""Quantized GEMV on CUDA: the FFAI / metaltile seed kernels ported (`kernels/dequant_gemv.cu`),
and kparity's own bandwidth-first kernel (`kernels/kp_qgemv.cu`). The seeds: metaltile-std
`src/ffai/dequant_gemv.rs`, `dequant_gemv_expert_indexed.rs` (`docs/seed_kernels.md`).

    out[r] = sum_d (q[r,d] * s[r, d // G] + b[r, d // G]) * x[d]     f32 inside, one rounding

Impls and their dispatch contracts (checked before any launch; every rule has a violating case):

* `cuda:dequant_gemv` (the seed's `dequant_gemv_int{2,3,4,5,6,8}`): one block of TPG = 64
  threads per row (the seed tests' TPG; a multiple of 32 by construction), pack-strided for
  bits 2, 4, 8 and element-strided over the bit stream for 3, 5, 6. Contract: the MLX layout
  (`quant_layout.LAYOUT`); in % G == 0 with G >= 32 already makes in * bits a whole number of
  words.
* `cuda:dequant_gemv_int4_fast` (the seed's `dequant_gemv_int4_fast`, MLX `affine_qmv_fast`):
  8 rows per block of 64 threads, 512 codes per warp step, algebraic split, mask without shift.
  Contract: bits == 4, group_size == 64, in % 512 == 0, out % 8 == 0.
* `cuda:dequant_gemv_int4_expert_indexed` (the seed's): the int4 scalar kernel on slab
  `expert_index[0]` of stacked [E, out, ...] weights, bit-identical to `cuda:dequant_gemv` on
  that slab (`exact_peer`). Contract: the layout, bits == 4, expert < experts (the kernel does
  not check the device index; the wrapper checks the case's).
* `cuda:kp_qgemv` (kparity): 16-byte weight chunks, ROWS = 4 rows per block of 1 to 4 warps
  that split K (enough warps that a lane has at most 8 chunks per row), each x load shared by
  the ROWS rows, the next chunks in flight during the math, codes to f32 by PRMT instead of
  I2F, launched as a programmatic dependent launch (waits for its predecessors before any
  load). Contract: bits in (4, 8). The kernel's own rules (whole 16-byte chunks of 128 / bits
  codes per row, a chunk inside one group) follow from the layout: G in {32, 64, 128} is a
  multiple of 32 and 16, and in % G == 0. Rows past `out` are bounds-checked, so any out.
* `cuda:kp_qgemv_mma` (kparity, tensor cores, the bandwidth kernel): int4 codes exact in f16 /
  bf16 A fragments of mma.m16n8k16 (the masked word read as q 2^-TINY, x pre-scaled by a power
  of two, where x's range allows; else (BASE + q) - BASE: the two agree bit for bit), f32
  accumulation, groups as B's 8 columns; a warp owns 16
  rows and one of `parts` K runs, a block `tiles` x `parts` warps; weights streamed through
  shared memory by a warp's cp.async pipeline of STAGES steps (16 rows x 256 bytes each, two
  contiguous 256-byte runs a copy instruction), x (in fragment order) and the group sums of x
  staged in shared memory; a programmatic dependent launch. Contract: bits == 4, f16/bf16,
  in % 128 == 0, in <= 16384.
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch, nearest_multiples
from gpu_impls.cuda._module import cuda_impl, kernel, launch as cuda_launch
from gpu_impls.impl import ExactPeer
from gpu_impls.quant_layout import EXPERT_IN_RANGE, LAYOUT, expert_slabs
from oracle.numerics import Numerics, plan
from oracle.quant import BITS, GROUP_SIZES

SEED = "dequant_gemv.cu"
KP = "kp_qgemv.cu"
SCALAR_TPG = 64        # threads per row block, as the seed's tests
FAST_ROWS = 8          # rows per block of the fast kernel (2 warps x 4)
FAST_BLOCK_K = 512     # codes per warp step of the fast kernel
# Rows per block of kp_qgemv: with scales and biases prefetched, 4 was the fastest of 2/4/8 at
# the four bench shapes on an H100, bf16 (benchmarks/HISTORY.md, h100-2026-11-23; before the
# prefetch 2 was).
KP_ROWS = 4
KP_ROWS_CHOICES = (2, 4, 8)  # instantiated, for A/B-ing the choice (scripts/kp_variants.py)
KP_BLOCK = 128         # threads per block of kp_qgemv at most (KPQ_BLOCK in the .cu)
KP_STEPS = 8           # chunks per lane per row the geometry aims under (more: more warps)
KP_BITS = (4, 8)
VEC_BYTES = 16

MMA = "kp_qgemv_mma.cu"
# Stages of kp_qgemv_mma's cp.async weight pipeline: each is 16 rows x 256 bytes (a step of 4
# blocks of 128 codes) of a warp's rows; STAGES - 1 in flight while one is consumed.
MMA_STAGES = 2
MMA_STAGE_CHOICES = (2, 3)  # instantiated, for A/B-ing the choice (scripts/kp_variants.py)
MMA_GROUPS = GROUP_SIZES  # one instance per group size (LAYOUT): the step laid out at compile time
MMA_STEP_BLOCKS = 4
MMA_STAGE_BYTES = 16 * 256
MMA_MAX_WARPS = 16     # warps per block (KPM_MAX_WARPS): tiles x K parts
# Warps the launcher aims the grid at: ~14 per SM of a 132-SM H100, all resident at once. A
# read of the same bytes in 8 rows x 256 bytes a warp step reached 87-94 % of the copy ceiling
# with 1792-2048 warps, 75 % with twice as many (two waves) and 68-78 % in kp_qgemv_mma's
# earlier 32 rows x 64 bytes steps (scripts/access_pattern.py,
# benchmarks/HISTORY.md, h100-2026-11-24-steps).
MMA_TARGET_WARPS = 14 * 132
# The GPUs the speed target names (H100, H200 SXM): 132 SMs of 228 KiB shared memory, 1 KiB of
# it reserved per block; at most 20 of these warps an SM (<= 96 registers a thread).
MMA_SMS = 132
MMA_SHARED_PER_SM = 228 * 1024
MMA_WARPS_PER_SM = 20
MMA_SHARED_PER_BLOCK = 227 * 1024  # the most a block may opt in to
MMA_MAX_IN = 16384     # x (2 bytes a value) and the group sums live in shared memory

KERNELS = [
    (SEED, "dequant_gemv", [(b,) for b in BITS]),
    (SEED, "dequant_gemv_int4_fast"),
    (SEED, "dequant_gemv_int4_expert_indexed"),
    (KP, "kp_qgemv", [(b, r) for b in KP_BITS for r in KP_ROWS_CHOICES]),
    (MMA, "kp_qgemv_mma", [(st, g) for st in MMA_STAGE_CHOICES for g in MMA_GROUPS]),
]


# --- geometry ------------------------------------------------------------------------------------

def _scalar_geometry(dims, params):
    return {"tpg": SCALAR_TPG}, Launch(grid=(dims["out"], 1, 1), block=(SCALAR_TPG, 1, 1))


def fast_geometry(dims, params):
    return {"tpg": 64}, Launch(grid=(max(dims["out"] // FAST_ROWS, 1), 1, 1), block=(64, 1, 1))


def kp_warps(dims) -> int:
    """Warps splitting K: enough that each lane has at most KP_STEPS chunks per row, 1..4."""
    chunks = dims["in"] * dims["bits"] // 128
    return max(1, min(KP_BLOCK // 32, -(-chunks // (32 * KP_STEPS))))


def kp_sum_orders(bits: int, warps: int, chunks: int) -> Numerics:
    """What kp_qgemv.cu computes, as `oracle/gemv.py`'s form "chunk_split" with the order of
    each sum (kp_qgemv.cu, "Error"):
      chunk_dot  a chunk's sum q x: 4 FMA chains (byte m of each 32-bit word: for int4 its even
                 and odd nibble, codes 8j + 2m and 8j + 2m + 1 of word j), words in order,
                 then (a0 + a1) + (a2 + a3)
      chunk_x    the chunk's sum of x, one chain of adds in code order
      row        per thread, one FMA chain over chunks c = step * threads + t in step order,
                 each adding b * xs then s * dot; a warp's 32 lanes by xor butterfly; the
                 warps in warp order.
    Every product is an explicit `fmaf` and nothing else is computed in f32 (no function, no
    division): one answer (`oracle/emulated.py`), which the check holds it to."""
    if bits == 4:
        chunk_dot = plan({"word": 4, "byte": 4, "nibble": 2},
                         ("word nibble", "fma"), ("byte", "pairwise"))
    else:
        chunk_dot = plan({"word": 4, "byte": 4}, ("word", "fma"), ("byte", "pairwise"))
    steps = -(-chunks // (32 * warps))
    row = plan({"step": steps, "warp": warps, "lane": 32, "term": 2},
               ("step term", "fma"), ("lane", "butterfly"), ("warp", "sequential"))
    return Numerics(form="chunk_split", sums=(
        ("chunk_dot", chunk_dot), ("chunk_x", plan({"code": 128 // bits}, ("code", "sequential"))),
        ("row", row)), one_answer=True)


def _kp_numerics(case) -> Numerics:
    d = case.dims
    return kp_sum_orders(d["bits"], kp_warps(d), d["in"] * d["bits"] // 128)


def _kp_geometry(dims, params, rows: int = KP_ROWS, warps: int | None = None):
    warps = warps or kp_warps(dims)
    return {"warps": warps}, Launch(grid=(-(-dims["out"] // rows), 1, 1),
                                    block=(32 * warps, 1, 1), extra={"rows": rows})


def _mma_shared(dims, tiles: int, parts: int, stages: int) -> int:
    """Dynamic shared bytes of a block: each warp's weight stages; the block's rows' scales and
    biases; x as T; 64 zero bytes (x outside a lane's column); the sums of x per group."""
    groups = dims["in"] // dims["group_size"]
    return (tiles * parts * stages * MMA_STAGE_BYTES + 2 * 2 * 16 * tiles * groups
            + 2 * dims["in"] + 64 + 4 * groups)


def _mma_waves(dims, tiles: int, parts: int, stages: int) -> int:
    """How many rounds of resident blocks the grid takes on MMA_SMS SMs."""
    blocks = -(-dims["out"] // (16 * tiles))
    per_sm = min((MMA_SHARED_PER_SM // (_mma_shared(dims, tiles, parts, stages) + 1024)),
                 MMA_WARPS_PER_SM // (tiles * parts))
    return -(-blocks // (MMA_SMS * per_sm)) if per_sm else 1 << 30


def mma_geometry(dims, params, stages: int | None = None, parts: int | None = None,
                  tiles: int | None = None):
    """A warp owns 16 rows (an m16 tile) and one of `parts` contiguous K runs (whole chunks of
    max(4 blocks, a super-block of 8 groups)); a block is `tiles` tiles x `parts` (block
    (32 tiles, parts)), so its warps share x and the tiles' scales and biases.
    Parts (unless given): as many as keep the grid near MMA_TARGET_WARPS, then the fewest that
    give the same longest run (llama3-8b-down's 28 chunks: 7 parts of 4).
    Parts fewer where their stages would not fit one block's shared memory.
    Tiles (unless given): the fewest rounds of resident blocks first, then a grid of at least
    MMA_SMS blocks (every SM streams), then the most (x staged by fewer blocks):
    Stages (unless given): 3 (two steps in flight a warp) where that grid is one round of
    resident blocks, else MMA_STAGES = 2 (H100 bf16: llama3-8b-up 15.4 us with 3, 17.6 with 2;
    qwen2.5-32b-up 31.8 us with 2, 44.8 with 3 in two rounds). At the issue's shapes (g64):
    llama3-8b-up 7 tiles x 2 parts, 3 stages; llama3-8b-down 2 x 7, 3; qwen2.5-32b-up 7 x 1, 2."""
    if stages is None:  # 3 where that grid is still one round of resident blocks, else 2
        more = max(MMA_STAGE_CHOICES)
        pick, launch = mma_geometry(dims, params, more, parts, tiles)
        if _mma_waves(dims, pick["tiles"], pick["parts"], more) == 1:
            return pick, launch
        stages = MMA_STAGES
    chunk = max(MMA_STEP_BLOCKS, dims["group_size"] // 16)
    chunks = -(-(dims["in"] // 128) // chunk)
    row_tiles = -(-dims["out"] // 16)
    if parts is None:
        most = max(1, min(MMA_MAX_WARPS, chunks, MMA_TARGET_WARPS // row_tiles))
        parts = min(range(1, most + 1), key=lambda p: (-(-chunks // p), p))
    parts = min(parts, chunks)
    while parts > 1 and _mma_shared(dims, 1, parts, stages) > MMA_SHARED_PER_BLOCK:
        parts -= 1  # in = 16384 with 3 stages: 16 parts' stages and x do not fit a block
    if tiles is not None:
        tiles = min(tiles, MMA_MAX_WARPS // parts)  # a block has at most KPM_MAX_WARPS warps
    else:
        tiles = min(range(1, min(MMA_MAX_WARPS // parts, row_tiles) + 1),
                    key=lambda t: (_mma_waves(dims, t, parts, stages),
                                   -(-row_tiles // t) < MMA_SMS, -t))
    return {"parts": parts, "tiles": tiles}, Launch(
        grid=(-(-row_tiles // tiles), 1, 1), block=(32 * tiles, parts, 1),
        shared_bytes=_mma_shared(dims, tiles, parts, stages), extra={"stages": stages})


# --- contracts -----------------------------------------------------------------------------------

GEMV_FALLBACK = "cuda:dequant_gemv (any MLX layout)"


def equals_invariant(name: str, value: int, why: str, bad: int,
                     fallback: str = GEMV_FALLBACK) -> Invariant:
    """`name == value`; the fix names `fallback`, an impl without the rule."""
    return Invariant(f"{name} == {value}", lambda ns: ns[name] == value, why,
                     lambda ns: f"{name} = {value}, or use {fallback}", {name: bad}, (name,))


def multiple_invariant(name: str, m: int, why: str, bad: int,
                       fallback: str = GEMV_FALLBACK) -> Invariant:
    """`name % m == 0`; the fix names `fallback`, an impl without the rule."""
    return Invariant(f"{name} % {m} == 0", lambda ns: ns[name] % m == 0, why,
                     lambda ns: f"{name} = {nearest_multiples(ns[name], m, m)}, or use "
                                f"{fallback}",
                     {name: bad}, (name,))


SCALAR = Contract(invariants=LAYOUT, geometry=_scalar_geometry)
FAST = Contract(
    invariants=(*LAYOUT,
                equals_invariant("bits", 4, "the kernel unpacks 8 nibbles per word: other "
                                 "widths misread every code", 8),
                equals_invariant("group_size", 64, "a lane's 16 codes take one scale and bias, "
                                 "located as k0 / 64", 32),
                multiple_invariant("in", FAST_BLOCK_K, "a warp steps over 512 codes with no "
                                   "bounds check: a partial step reads past the row", 576),
                multiple_invariant("out", FAST_ROWS, "a block writes 8 rows with no bounds "
                                   "check: a partial block writes past the output", 12)),
    geometry=fast_geometry)
EXPERT = Contract(
    invariants=(*LAYOUT, EXPERT_IN_RANGE,
                Invariant("bits == 4", lambda ns: ns["bits"] == 4,
                          "the seed ships only the int4 instance of the indexed kernel",
                          lambda ns: "bits = 4, or run cuda:dequant_gemv on the expert's slab",
                          {"bits": 8}, ("bits",))),
    geometry=_scalar_geometry)
MMA_CONTRACT = Contract(
    invariants=(*LAYOUT,
                Invariant("bits == 4", lambda ns: ns["bits"] == 4,
                          "the A fragments are built from nibble pairs (LOP3 0x000F000F)",
                          lambda ns: "bits = 4, or use cuda:kp_qgemv (int4/int8)", {"bits": 8},
                          ("bits",)),
                multiple_invariant("in", 128, "a warp walks K in blocks of 128 codes (64 bytes "
                                   "per row, 16 per quad thread) with no bounds check", 1568),
                Invariant(f"in <= {MMA_MAX_IN}", lambda ns: ns["in"] <= MMA_MAX_IN,
                          "x and the group sums of x are staged in shared memory",
                          lambda ns: f"in <= {MMA_MAX_IN}, or use cuda:kp_qgemv",
                          {"in": MMA_MAX_IN + 128}, ("in",))),
    dtypes=("f16", "bf16"),
    geometry=mma_geometry)
KP_CONTRACT = Contract(
    invariants=(*LAYOUT,
                Invariant("bits in (4, 8)", lambda ns: ns["bits"] in KP_BITS,
                          "codes are split into bytes (int8) or even/odd nibbles (int4) only",
                          lambda ns: "bits = 4 or 8, or use cuda:dequant_gemv", {"bits": 2},
                          ("bits",))),
    geometry=_kp_geometry)


# --- launch --------------------------------------------------------------------------------------

def _args(inputs, outputs, case, aligned: tuple = ()):
    """The kernel arguments; the inputs named in `aligned` must start on 16 bytes."""
    arrays = (inputs["w"], inputs["scales"], inputs["biases"], inputs["x"], outputs["out"])
    for key in aligned:
        if inputs[key].data.ptr % VEC_BYTES:
            raise ValueError(f"{key} is not {VEC_BYTES}-byte aligned: the kernel reads it in "
                             f"{VEC_BYTES}-byte vectors; pass a fresh CuPy array (256-byte "
                             "aligned) or a view at a multiple of 16 bytes")
    return arrays


def _scalar(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d = case.dims
        k = kernel(SEED, "dequant_gemv", case.dtype, defines, (d["bits"],))
        k(launch.grid, launch.block, (*_args(inputs, outputs, case), np.int32(d["in"]),
                                      np.int32(d["group_size"])))
    return run


def _fast(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d = case.dims
        k = kernel(SEED, "dequant_gemv_int4_fast", case.dtype, defines)
        k(launch.grid, launch.block, (*_args(inputs, outputs, case), np.int32(d["in"]),
                                      np.int32(d["group_size"])))
    return run


def _expert(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d = case.dims
        k = kernel(SEED, "dequant_gemv_int4_expert_indexed", case.dtype, defines)
        k(launch.grid, launch.block, (inputs["w"], inputs["scales"], inputs["biases"],
                                      inputs["x"], inputs["expert_index"], outputs["out"],
                                      np.int32(d["in"]), np.int32(d["group_size"]),
                                      np.int32(d["out"])))
    return run


def _aligned(source: str, name: str, template_args, pdl: bool = False,
             vectors: tuple = ("w", "x")):
    """Maker of kparity's GEMV launches (16-byte vector loads of the inputs in `vectors`, rows
    bounds-checked): `template_args(dims, launch)` picks the kernel instance. make(defines,
    pdl): pdl (default as given here) makes it a programmatic dependent launch
    (`_module.launch`), for kernels written for it."""
    def make(defines: tuple = (), pdl: bool = pdl):
        def run(launch, inputs, outputs, case):
            d = case.dims
            k = kernel(source, name, case.dtype, defines, template_args(d, launch))
            cuda_launch(k, launch.grid, launch.block,
                        (*_args(inputs, outputs, case, aligned=vectors), np.int32(d["out"]),
                         np.int32(d["in"]), np.int32(d["group_size"])), pdl=pdl,
                        shared_bytes=launch.shared_bytes)
        return run
    return make


def _kp_rows(d, launch):
    return d["bits"], launch.extra["rows"]


_kp = _aligned(KP, "kp_qgemv", _kp_rows, pdl=True)
_mma = _aligned(MMA, "kp_qgemv_mma",
                lambda d, launch: (launch.extra["stages"], d["group_size"]), pdl=True,
                vectors=("w", "x", "scales", "biases"))


register(
    cuda_impl("kp_qgemv_mma", "dequant_gemv", MMA_CONTRACT, _mma,
              "kparity tensor-core GEMV: int4 codes exact in f16/bf16 A fragments (no "
              "subtraction where x's range allows), x in B "
              "split by group over the 8 columns, f32 accumulation, scales per group after; "
              "K split over warps, cp.async weight pipeline, x in shared memory, PDL (scales "
              "and biases copied before the wait: static weights); "
              "f16/bf16, in % 128, in <= 16384"),
    cuda_impl("dequant_gemv", "dequant_gemv", SCALAR, _scalar,
              "seed dequant_gemv_int{2..8}: one 64-thread block per row, dequantize then dot"),
    cuda_impl("dequant_gemv_int4_fast", "dequant_gemv", FAST, _fast,
              "seed dequant_gemv_int4_fast (MLX qmv_fast): 8 rows per 64-thread block, "
              "algebraic split, mask without shift; int4, g64, in % 512, out % 8"),
    cuda_impl("dequant_gemv_int4_expert_indexed", "dequant_gemv_expert_indexed", EXPERT,
              _expert, "seed dequant_gemv_int4_expert_indexed: the int4 scalar kernel on the "
              "selected slab of stacked weights; index checked by the wrapper",
              exact_peer=ExactPeer("cuda:dequant_gemv", expert_slabs)),
    cuda_impl("kp_qgemv", "dequant_gemv", KP_CONTRACT, _kp,
              "kparity GEMV: 16-byte weight chunks, 4 rows per block split over K, x shared "
              "by the rows, next chunks in flight, PRMT code->f32; int4/int8",
              numerics=_kp_numerics),
)
