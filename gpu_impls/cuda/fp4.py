"""NVFP4 and MXFP4 on CUDA (issue 31): kparity's own kernels (`oracle/fp4.py`,
`oracle/fp4_gemv.py`).

* `cuda:kp_fp4_dequantize` (`kernels/kp_fp4.cu`): a thread per 4-byte word of codes (8
  elements of one block), e2m1(q) * scale * tensor_scale exact in double, rounded once to f32
  and once to T, one 16-byte store (two in f32). Contract: K % block == 0.
* `cuda:kp_fp4_gemv` (`kernels/kp_fp4.cu`): y = x W^T over FP4 W [N, K], x [M, K], M <= 4.
  4 weight rows a block, 1..4 warps splitting K in 16-byte chunks of 32 codes (one MXFP4
  block, two NVFP4 blocks), the next chunks and scale bytes in flight during the math, x read
  per half chunk and shared by the 4 rows, E2M1 through a 16-entry f32 table in shared memory;
  per block the sum of q x, then the block scale by an FMA, the tensor scale on the finished
  dot (the oracle's admissible forms). Instances MAXM 1 and 4 per format. Contract: in % 32 ==
  0 (whole chunks), m <= 4.
* `cuda:kp_fp4_quantize` (`kernels/kp_fp4_quantize.cu`): NVFP4 "exact" (an amax kernel, then a
  thread per block) and MXFP4 "ocp" / "ceil" (a thread per block), bit for bit as the oracle
  with E2M1 RNE. Contract: K % block == 0, scale_rule in (exact, ocp, ceil): the "mlx" rules
  round nearest-low (and NVFP4's rounds vmax / 6 to T), not implemented.

f32 steps whose result depends on a subnormal the oracle keeps (a tensor scale below 2^-126, the
E8M0 scale 2^-127, the quantizer's arithmetic) are PTX without .ftz (`kernels/fp4.cuh`): CuPy
compiles with -ftz=true. The GEMV's q x sums use the compiler's FTZ, as its kernel model allows.
Test-only mutants (tests/mutants.py FP4_CUDA_MUTANTS): KPARITY_MUTANT_FP4_TIES_AWAY,
KPARITY_MUTANT_FP4_UNSCALED_BLOCK_MAX (both in the quantizer).
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch, nearest_multiples
from gpu_impls.cuda._module import cuda_impl, kernel, launch as cuda_launch
from gpu_impls.torch.fp4 import whole_blocks
from oracle.fp4 import BLOCK
from oracle.numerics import Numerics, plan

SOURCE = "kp_fp4.cu"
QUANTIZE_SOURCE = "kp_fp4_quantize.cu"
DQ_THREADS = 256       # KPF_DQ_THREADS: kp_fp4_dequantize's block
DQ_CODES = 8           # codes a dequantize thread handles (one 4-byte word)
GEMV_ROWS = 4          # KPF_ROWS: weight rows a GEMV block
GEMV_BLOCK = 128       # KPF_BLOCK: threads a GEMV block at most (4 warps)
GEMV_STEPS = 8         # chunks per lane per row the geometry aims under (more: more warps)
CHUNK_CODES = 32       # codes in a 16-byte chunk
GEMV_MAX_M = 4         # rows of x: the instances MAXM = 1 (M = 1) and 4 (M = 2..4)
AMAX_THREADS = 256     # KPF_AMAX_THREADS
AMAX_MAX_BLOCKS = 1024  # the amax kernel's grid at most (grid-stride beyond)
Q_THREADS = 128        # KPF_Q_THREADS: a quantize thread per block
VEC_BYTES = 16
ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
RULE_IDS = {"exact": 0, "ocp": 1, "ceil": 2}  # kp_fp4_quantize's RULE template argument
KERNELS = [(SOURCE, "kp_fp4_dequantize", [(b,) for b in BLOCK.values()]),
           (SOURCE, "kp_fp4_gemv", [(b, m) for b in BLOCK.values() for m in (1, GEMV_MAX_M)]),
           (QUANTIZE_SOURCE, "kp_fp4_amax"),
           (QUANTIZE_SOURCE, "kp_fp4_quantize", [(r,) for r in RULE_IDS.values()])]


def _require_aligned(op: str, arrays: dict, bytes_: int) -> None:
    """Each named device array starts on a `bytes_` boundary (the kernel's vector loads)."""
    for name, a in arrays.items():
        if a.data.ptr % bytes_:
            raise ValueError(f"cuda:kp_{op}: {name} must start on a {bytes_}-byte boundary (the "
                             f"kernel reads it {bytes_} bytes at a time): pass a contiguous, "
                             "freshly allocated array")


def _elements(dims) -> int:
    return dims["rows"] * dims["cols"]


# --- cuda:kp_fp4_dequantize ---------------------------------------------------------------------

def _dequantize_geometry(dims, params):
    words = _elements(dims) // DQ_CODES
    derived = {"words": words}
    return derived, Launch(grid=(max(1, -(-words // DQ_THREADS)), 1, 1),
                           block=(DQ_THREADS, 1, 1), extra=derived)


DEQUANTIZE_CONTRACT = Contract(invariants=(whole_blocks(),), geometry=_dequantize_geometry)


def _dequantize(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        fmt = case.params["format"]
        _require_aligned("fp4_dequantize", {"codes": inputs["codes"]}, 4)
        _require_aligned("fp4_dequantize", {"x_hat": outputs["x_hat"]}, VEC_BYTES)
        k = kernel(SOURCE, "kp_fp4_dequantize", case.dtype, defines, (BLOCK[fmt],))
        cuda_launch(k, launch.grid, launch.block,
                    (inputs["codes"], inputs["scales"], inputs["tensor_scale"], outputs["x_hat"],
                     np.int64(launch.extra["words"])))
    return run


# --- cuda:kp_fp4_gemv ---------------------------------------------------------------------------

def _gemv_warps(dims) -> int:
    """Warps splitting K: enough that each lane has at most GEMV_STEPS chunks per row, 1..4
    (kp_qgemv's rule, whose chunks also hold 32 codes)."""
    chunks = dims["in"] // CHUNK_CODES
    return max(1, min(GEMV_BLOCK // 32, -(-chunks // (32 * GEMV_STEPS))))


def _gemv_geometry(dims, params):
    warps = _gemv_warps(dims)
    derived = {"warps": warps, "maxm": 1 if dims["m"] == 1 else GEMV_MAX_M}
    return derived, Launch(grid=(max(1, -(-dims["out"] // GEMV_ROWS)), 1, 1),
                           block=(32 * warps, 1, 1), extra=derived)


def gemv_sum_orders(fmt: str, warps: int, chunks: int) -> Numerics:
    """kp_fp4.cu's GEMV as `oracle/fp4_gemv.py`'s form "block_split". A chunk is 32 codes, two
    halves h of 16; a half's dot is two FMA chains from 0 (even and odd codes k = 2j + p) added,
    a0 + a1. NVFP4: each half is a block, added to the row's FMA chain as s_b * d. MXFP4: the
    block's dot d0 + d1, then s * dot into the chain. The row: thread t takes chunks
    c = step * threads + t in step order, a warp's lanes meet by xor butterfly (16 .. 1), the
    warps' partials in warp order; then the tensor scale (one product)."""
    steps = -(-chunks // (32 * warps))
    if fmt == "nvfp4":
        block_dot = plan({"j": 8, "p": 2}, ("j", "fma"), ("p", "pairwise"))
        row = plan({"step": steps, "warp": warps, "lane": 32, "h": 2}, ("step h", "fma"),
                   ("lane", "butterfly"), ("warp", "sequential"))
    else:
        block_dot = plan({"h": 2, "j": 8, "p": 2}, ("j", "fma"), ("p", "pairwise"),
                         ("h", "sequential"))
        row = plan({"step": steps, "warp": warps, "lane": 32}, ("step", "fma"),
                   ("lane", "butterfly"), ("warp", "sequential"))
    return Numerics(form="block_split", sums=(("block_dot", block_dot), ("row", row)))


def _gemv_numerics(case) -> Numerics:
    warps = _gemv_geometry(case.dims, case.params)[0]["warps"]  # the launch's
    return gemv_sum_orders(case.params["format"], warps, case.dims["in"] // CHUNK_CODES)


GEMV_FALLBACK = "torch:fp4_dequant_linear"
GEMV_WHOLE_CHUNKS = Invariant(
    name=f"in % {CHUNK_CODES} == 0", holds=lambda ns: ns["in"] % CHUNK_CODES == 0,
    why="each row's codes are read in 16-byte chunks of 32 codes (one MXFP4 block, two NVFP4 "
        "blocks) with no bounds check: a partial chunk would read the next row",
    fix=lambda ns: f"in = {nearest_multiples(ns['in'], CHUNK_CODES, CHUNK_CODES)}, or use "
                   f"{GEMV_FALLBACK}",
    violation={"in": 48}, shows=("in",))
GEMV_M_MAX = Invariant(
    name=f"m <= {GEMV_MAX_M}", holds=lambda ns: ns["m"] <= GEMV_MAX_M,
    why=f"each lane holds a half chunk of every row of x in registers: the instances take at "
        f"most {GEMV_MAX_M} rows",
    fix=lambda ns: f"m <= {GEMV_MAX_M} (split x into batches of {GEMV_MAX_M} rows), or use "
                   f"{GEMV_FALLBACK}",
    violation={"m": GEMV_MAX_M + 1}, shows=("m",))
GEMV_CONTRACT = Contract(invariants=(GEMV_WHOLE_CHUNKS, GEMV_M_MAX), geometry=_gemv_geometry)


def _gemv(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, fmt = case.dims, case.params["format"]
        _require_aligned("fp4_gemv", {"codes": inputs["codes"], "x": inputs["x"]}, VEC_BYTES)
        _require_aligned("fp4_gemv", {"scales": inputs["scales"]}, 2)
        k = kernel(SOURCE, "kp_fp4_gemv", case.dtype, defines,
                   (BLOCK[fmt], launch.extra["maxm"]))
        cuda_launch(k, launch.grid, launch.block,
                    (inputs["codes"], inputs["scales"], inputs["tensor_scale"], inputs["x"],
                     outputs["y"], np.int32(d["m"]), np.int32(d["out"]), np.int32(d["in"])))
    return run


# --- cuda:kp_fp4_quantize -----------------------------------------------------------------------

def _quantize_geometry(dims, params):
    blocks = _elements(dims) // BLOCK[params["format"]]
    vectors = _elements(dims) * ELEMENT_BYTES[params["dtype"]] // VEC_BYTES
    derived = {"blocks": blocks, "vectors": vectors,
               "amax_blocks": max(1, min(AMAX_MAX_BLOCKS, -(-vectors // AMAX_THREADS)))}
    return derived, Launch(grid=(max(1, -(-blocks // Q_THREADS)), 1, 1), block=(Q_THREADS, 1, 1),
                           extra=derived)


QUANTIZE_RULES = Invariant(
    name="scale_rule in ('exact', 'ocp', 'ceil')", holds=lambda ns: ns["scale_rule"] in RULE_IDS,
    why="the kernel rounds E2M1 to nearest even: the 'mlx' rules round nearest-low (and "
        "NVFP4's rounds vmax / 6 to T first), not implemented",
    fix=lambda ns: ("scale_rule = exact" if ns["format"] == "nvfp4" else "scale_rule = ocp or "
                    "ceil") + f", or mlx:quantize_{ns['format']} for the mlx rule",
    violation={"scale_rule": "mlx"}, shows=("format", "scale_rule"))
QUANTIZE_CONTRACT = Contract(invariants=(whole_blocks(), QUANTIZE_RULES),
                             geometry=_quantize_geometry)


def _amax_buffer():
    """A zeroed device word for kp_fp4_amax's atomicMax (its f32 bits)."""
    import cupy

    return cupy.zeros((1,), dtype=cupy.uint32)


def _quantize(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        p, e = case.params, launch.extra
        x = inputs["x"]
        _require_aligned("fp4_quantize", {"x": x}, VEC_BYTES)
        # a block's codes (BLOCK / 2 bytes) are one 8- or 16-byte store
        _require_aligned("fp4_quantize", {"codes": outputs["codes"]}, BLOCK[p["format"]] // 2)
        amax = _amax_buffer()  # NVFP4's amax bits (MXFP4: unread)
        if p["format"] == "nvfp4":
            k = kernel(QUANTIZE_SOURCE, "kp_fp4_amax", case.dtype, defines)
            cuda_launch(k, (e["amax_blocks"], 1, 1), (AMAX_THREADS, 1, 1),
                        (x, amax, np.int64(e["vectors"])))
        k = kernel(QUANTIZE_SOURCE, "kp_fp4_quantize", case.dtype, defines,
                   (RULE_IDS[p["scale_rule"]],))
        cuda_launch(k, launch.grid, launch.block,
                    (x, amax, outputs["codes"], outputs["scales"], outputs["tensor_scale"],
                     np.int64(e["blocks"])))
    return run


register(
    cuda_impl("kp_fp4_dequantize", "fp4_dequantize", DEQUANTIZE_CONTRACT, _dequantize,
              "kparity FP4 dequantize: a thread per word of 8 codes, e2m1 x scale x tensor "
              "scale exact in double, rounded to f32 then T, 16-byte stores"),
    cuda_impl("kp_fp4_gemv", "fp4_gemv", GEMV_CONTRACT, _gemv,
              "kparity FP4 GEMV: 16-byte chunks of 32 codes, 4 rows a block split over K, next "
              "chunks and scales in flight, E2M1 by a shared-memory table, per-block sums then "
              "the block scale, the tensor scale on the dot; in % 32, m <= 4",
              numerics=_gemv_numerics),
    cuda_impl("kp_fp4_quantize", "fp4_quantize", QUANTIZE_CONTRACT, _quantize,
              "kparity FP4 quantize: NVFP4 exact (amax kernel, then a thread per block) and "
              "MXFP4 ocp / ceil, E2M1 RNE, every f32 step without FTZ: bit-exact"),
)
