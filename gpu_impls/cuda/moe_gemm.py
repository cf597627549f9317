"""The MoE grouped GEMM on CUDA (issue 31): `cuda:kp_moe_grouped_gemm` (`kernels/kp_moe_gemm.cu`).

    y[i, n] = sum_k x[i, k] W[e(i), n, k]        rows sorted by expert, offsets [E+1] on the device

One launch for all experts, dense (f32 / f16 / bf16) or affine4 (MLX int4, group 64) weights,
no host sync: the grid is sized from the dims (an upper bound of row tiles, min(M, M / TM +
min(E, M)), times the slabs of output columns) and each block finds its (expert, row tile) from
the offsets in the kernel; blocks past the last tile exit. Empty experts own no tile; an expert
over several tiles owns several. The host picks one of two kernels by dims, never by offsets:

* kp_moe_gemm_mma (prefill): f16/bf16, K % 64 == 0 and M >= 8 E (on average 8 rows an expert
  or more): tiles of 64 rows x 64 columns, 4 warps of mma.m16n8k16 with f32 accumulation, K in
  steps of 64 staged through shared memory (affine4: the codes as exact T values, each group's
  sums scaled and biased in f32 after its products);
* kp_moe_qgemv_mma (decode, affine4: `kernels/kp_qgemv_mma.cu`): f16/bf16, M <= E (about one
  row an expert), K % 128 == 0, K <= 16384, N K / 64 % 8 == 0: kp_qgemv_mma's tensor-core GEMV,
  one x row per grid row, each row on its expert's slabs (found by a binary search over the
  offsets), the grid sized by kp_qgemv_mma's geometry for the M GEMVs together;
* kp_moe_gemv (decode, small M, f32; dense; affine4 off kp_moe_qgemv_mma's shapes): tiles of MT rows (M / E rounded up to a power of two, at
  most 8: 1 at decode, where each of the k rows has its own expert), blocks of 4 output columns
  x 1-4 warps splitting K in 16-byte weight chunks, kp_qgemv's streaming design.

Both are programmatic dependent launches (they wait for the kernels before them before any
load). Deterministic (fixed orders, no atomics). Numerics: the default (any-order f32 sums;
every product exact or one f32 rounding; affine4 in the algebraic-split form).

Contract (every rule has a violating case; tests/test_cuda_moe_gemm.py): E <= 1024 (the offsets
staged in shared memory); affine4 K % 64 == 0 (whole groups: also the op's domain); dense K a
whole number of 16-byte vectors (K % 4 in f32, K % 8 in f16/bf16). x and w must start on 16
bytes (checked at launch). The layout itself (offsets non-decreasing, offsets[0] = 0,
offsets[E] = M) is the dispatch's; the kernels clamp every offset to [0, M], so a bad one can
misplace rows but never address outside x or y.

Test-only mutant (tests/mutants.py): `cuda:mutant_kp_moe_tile_first_row`
(KPARITY_MUTANT_TILE_FIRST_ROW), every tile of an expert starting at the expert's first row.
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch, nearest_multiples
from gpu_impls.cuda._module import cuda_impl, kernel, launch as cuda_launch
from gpu_impls.cuda.gemv import MMA, MMA_MAX_IN, MMA_STAGE_CHOICES, mma_geometry
from oracle.moe_gemm import GROUP

SOURCE = "kp_moe_gemm.cu"
MAX_EXPERTS = 1024       # KPMOE_MAX_EXPERTS: offsets staged in shared memory
GEMV_ROWS = 4            # KPMOE_ROWS: output columns per kp_moe_gemv block
GEMV_MAX_WARPS = 4       # KPMOE_GEMV_MAX_WARPS
GEMV_STEPS = 8           # chunks per lane the warp count aims under (as kp_qgemv's KP_STEPS)
GEMV_MT = (1, 2, 4, 8)   # rows per kp_moe_gemv tile: the instances
MMA_TM = 64              # KPMOE_TM
MMA_TN = 64              # KPMOE_TN
MMA_TK = 64              # KPMOE_TK
MMA_THREADS = 128        # KPMOE_MMA_THREADS
MMA_MIN_ROWS_PER_EXPERT = 8  # M >= 8 E: tensor-core tiles (fewer rows: mostly padding)
MMA_DTYPES = ("f16", "bf16")
VEC_BYTES = 16
ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
CODES_PER_CHUNK = 32     # int4 codes per 16-byte chunk
QGEMV_K = 128            # kp_qgemv_mma walks K in blocks of 128 codes
KERNELS = [(SOURCE, "kp_moe_gemv", [(a, mt) for a in (0, 1) for mt in GEMV_MT]),
           (SOURCE, "kp_moe_gemm_mma", [(0,), (1,)]),
           (MMA, "kp_moe_qgemv_mma", [(st, GROUP) for st in MMA_STAGE_CHOICES])]


def _affine(params) -> bool:
    return params["weights"] == "affine4"


def uses_mma(dims, params) -> bool:
    """The tensor-core kernel: f16/bf16, whole 64-element K steps, >= 8 rows an expert."""
    return (params["dtype"] in MMA_DTYPES and dims["in"] % MMA_TK == 0
            and dims["rows"] >= MMA_MIN_ROWS_PER_EXPERT * dims["experts"])


def uses_qgemv(dims, params) -> bool:
    """kp_moe_qgemv_mma: affine4 in f16/bf16 at decode (rows <= experts), on kp_qgemv_mma's
    shapes (K % 128, K <= 16384) with each expert's scales on 16 bytes (N K / 64 % 8)."""
    return (_affine(params) and params["dtype"] in MMA_DTYPES
            and dims["rows"] <= dims["experts"] and dims["in"] % QGEMV_K == 0
            and dims["in"] <= MMA_MAX_IN and dims["out"] * (dims["in"] // GROUP) % 8 == 0)


# kp_moe_qgemv_mma's pipeline stages and tiles a block, as measured (H100, Nemotron up at T = 1:
# 11.02 us against 12.43 with kp_qgemv_mma's own pick, 3 stages x 4 tiles;
# benchmarks/data/moe-h100/qgemv-variants.txt)
QGEMV_STAGES = 2
QGEMV_TILES = 2


def _qgemv_geometry(dims, stages=QGEMV_STAGES, parts=None, tiles=QGEMV_TILES):
    """kp_qgemv_mma's geometry for the M GEMVs as one of M x N rows: its parts (the K split)
    for the whole grid's warps; stages and tiles as measured (QGEMV_*;
    scripts/moe_qgemv_variants.py times others); grid (row blocks of one GEMV, M)."""
    pick, launch = mma_geometry({"out": dims["rows"] * dims["out"], "in": dims["in"],
                                  "group_size": GROUP}, {}, stages, parts, tiles)
    row_tiles = -(-dims["out"] // 16)  # a warp's m16 tile of output columns
    blocks = -(-row_tiles // pick["tiles"])
    derived = {"mma": 0, "qgemv": 1, "mt": 0, "tiles": dims["rows"], "slabs": blocks,
               "stages": launch.extra["stages"]}
    return derived, Launch(grid=(blocks, dims["rows"], 1), block=launch.block,
                           shared_bytes=launch.shared_bytes, extra=derived)


def tile_bound(rows: int, experts: int, tm: int) -> int:
    """At most this many row tiles of tm rows: sum_e ceil(c_e / tm) <= M // tm + (experts that
    own rows, <= min(E, M)); and each tile has a row."""
    return min(rows, rows // tm + min(experts, rows))


def _gemv_mt(dims) -> int:
    """Rows per tile: M / E rounded up to a power of two, at most 8."""
    per_expert = -(-dims["rows"] // dims["experts"])
    return min(GEMV_MT[-1], 1 << (per_expert - 1).bit_length())


def _gemv_warps(dims, params) -> int:
    """Warps splitting K: enough that a lane has at most GEMV_STEPS chunks a row, 1..4."""
    codes = CODES_PER_CHUNK if _affine(params) else VEC_BYTES // ELEMENT_BYTES[params["dtype"]]
    chunks = dims["in"] // codes
    return max(1, min(GEMV_MAX_WARPS, -(-chunks // (32 * GEMV_STEPS))))


def _geometry(dims, params):
    if uses_qgemv(dims, params):
        return _qgemv_geometry(dims)
    if uses_mma(dims, params):
        mma, tm, mt, cols, threads = 1, MMA_TM, 0, MMA_TN, MMA_THREADS
    else:
        mt = _gemv_mt(dims)
        mma, tm, cols, threads = 0, mt, GEMV_ROWS, 32 * _gemv_warps(dims, params)
    tiles = tile_bound(dims["rows"], dims["experts"], tm)
    slabs = -(-dims["out"] // cols)
    derived = {"mma": mma, "qgemv": 0, "mt": mt, "tiles": tiles, "slabs": slabs}
    return derived, Launch(grid=(tiles * slabs, 1, 1), block=(threads, 1, 1), extra=derived)


EXPERTS_MAX = Invariant(
    name=f"experts <= {MAX_EXPERTS}", holds=lambda ns: ns["experts"] <= MAX_EXPERTS,
    why=f"the block stages offsets [E+1] in shared memory ({MAX_EXPERTS + 1} ints) to find its "
        "expert and row tile",
    fix=lambda ns: f"experts <= {MAX_EXPERTS}, or torch:grouped_linear",
    violation={"experts": MAX_EXPERTS + 1, "weights": "dense", "in": 8, "out": 1},
    shows=("experts",))
AFFINE_GROUPS = Invariant(
    name=f"weights == 'dense' or in % {GROUP} == 0",
    holds=lambda ns: ns["weights"] == "dense" or ns["in"] % GROUP == 0,
    why=f"affine4 K is read in 16-byte chunks of 32 codes, two per group of {GROUP} (one scale "
        "and bias a chunk) and, on tensor cores, in steps of one group",
    fix=lambda ns: f"in = {nearest_multiples(ns['in'], GROUP, GROUP)}",
    violation={"weights": "affine4", "in": 96}, shows=("weights", "in"))
DENSE_VECTORS = Invariant(
    name="weights == 'affine4' or in % (16 / element bytes) == 0",
    holds=lambda ns: (ns["weights"] == "affine4"
                      or ns["in"] % (VEC_BYTES // ELEMENT_BYTES[ns["dtype"]]) == 0),
    why="dense rows of x and W are read in 16-byte vectors with no tail loop",
    fix=lambda ns: (f"in = {nearest_multiples(ns['in'], VEC_BYTES // ELEMENT_BYTES[ns['dtype']])}"
                    ", or torch:grouped_linear"),
    violation={"weights": "dense", "in": 66}, shows=("weights", "in", "dtype"))
CONTRACT = Contract(invariants=(EXPERTS_MAX, AFFINE_GROUPS, DENSE_VECTORS), geometry=_geometry)


def _kp_moe(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, e = case.dims, launch.extra
        affine = _affine(case.params)
        w = inputs["w_q"] if affine else inputs["w"]
        for name, array in (("x", inputs["x"]), ("w_q" if affine else "w", w)):
            if array.data.ptr % VEC_BYTES:
                raise ValueError(f"cuda:kp_moe_grouped_gemm: {name} is not {VEC_BYTES}-byte "
                                 "aligned (the kernels read 16-byte vectors): pass a fresh "
                                 "CuPy array or a view at a multiple of 16 bytes")
        if e["qgemv"]:
            for name in ("scales", "biases"):
                if inputs[name].data.ptr % VEC_BYTES:
                    raise ValueError(f"cuda:kp_moe_grouped_gemm: {name} is not {VEC_BYTES}-byte"
                                     " aligned (kp_moe_qgemv_mma copies 16-byte vectors)")
            k = kernel(MMA, "kp_moe_qgemv_mma", case.dtype, defines, (e["stages"], GROUP))
            cuda_launch(k, launch.grid, launch.block,
                        (w, inputs["scales"], inputs["biases"], inputs["x"], outputs["y"],
                         np.int32(d["out"]), np.int32(d["in"]), np.int32(GROUP),
                         inputs["offsets"], np.int32(d["experts"]), np.int32(d["rows"])),
                        pdl=True, shared_bytes=launch.shared_bytes)
            return
        args = (inputs["x"], w, inputs["scales"], inputs["biases"], inputs["offsets"],
                outputs["y"], np.int32(d["rows"]), np.int32(d["experts"]), np.int32(d["out"]),
                np.int32(d["in"]), np.int32(e["slabs"]))
        if e["mma"]:
            k = kernel(SOURCE, "kp_moe_gemm_mma", case.dtype, defines, (int(affine),))
        else:
            k = kernel(SOURCE, "kp_moe_gemv", case.dtype, defines, (int(affine), e["mt"]))
        cuda_launch(k, launch.grid, launch.block, args, pdl=True)
    return run


register(cuda_impl(
    "kp_moe_grouped_gemm", "moe_grouped_gemm", CONTRACT, _kp_moe,
    "kparity grouped GEMM, one launch, offsets on the device: each block finds its (expert, row "
    "tile); tensor-core 64x64 tiles (f16/bf16, M >= 8 E) or a GEMV per expert tile (decode); "
    "dense or affine4"))
