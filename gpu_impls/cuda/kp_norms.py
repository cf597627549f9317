"""RMSNorm family on CUDA, kparity's own design (`kernels/kp_rms_norm.cu`): built to stream at the
HBM limit. Same math and argument conventions as the seeds (`norms.py`, `oracle/norms.py`):

    inv   = rsqrt(sum_i x_i^2 / n + eps)
    out_i = T(x_i * inv * (w_i + weight_offset))        f32 inside, one rounding at the store

plus `residual + ...` (rms_norm_residual) and `s = a + b` with outputs T(s) and T(s*inv*w) from
the unrounded f32 s (add_rms_norm). One kernel body, three entry points, instantiated per
(ITEMS, TPR).

Layout: a row is n / VEC 16-byte vectors (VEC = 16 / sizeof(T): 4 for f32, 8 for f16/bf16); TPR
threads share a row, each holding ITEMS vectors in registers (x is read once); short rows pack
several per block. The geometry is derived from n and the dtype alone (`pick`):

    vectors = n / VEC
    target  = 4 vectors in flight per thread, or 1 when rows * vectors < SMALL_WORK (few blocks)
    TPR     = min(1024, next_pow2(ceil(vectors / target))), and below SMALL_WORK at most 256
              unless the row then needs more than 4 vectors a thread (TPR = next_pow2(vectors/4))
    ITEMS   = ceil(vectors / TPR)                        1..4
    block   = max(TPR, min_block) threads (min_block = 64 by default, at most 256: the kernel's
              launch bound), RPB = block / TPR rows per block, grid = ceil(rows / RPB)

so the instances are the finite set `CONFIGS` (every pick over 1 <= vectors <= 4096). The
contracts: n % VEC == 0 (whole 16-byte vectors, each row 16-byte aligned), n >= VEC, and
n <= 4 * 1024 * VEC (16384 f32, 32768 f16/bf16: the row must fit in registers); the per-head impl
puts them on head_dim. VEC depends on the dtype, which `Contract.geometry` reads from
params["dtype"]; the derived namespace carries `vec`.

Every launch is a programmatic dependent launch (`_module.launch(pdl=True)`): the kernel lets
its successor's blocks be scheduled at once and waits for its predecessors before its first load
(`kp_rms_norm.cu`), so the next kernel's launch overlaps this one's run. Measured on an H100 in
graph_rot, bf16 per-head shapes: 0.76-0.79x the time of the same kernel launched ordinarily
(benchmarks/README.md, RMSNorm; `cuda:kp_rms_norm*_nopdl` in scripts/kp_variants.py).
"""

from __future__ import annotations


import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch, nearest_multiples, rounding_once
from gpu_impls.cuda._module import cuda_impl, kernel, launch as cuda_launch
from oracle.numerics import Numerics, plan

SOURCE = "kp_rms_norm.cu"
VEC_BYTES = 16
VEC = {"f32": 4, "f16": 8, "bf16": 8}  # elements per 16-byte vector
ITEMS_TARGET = 4   # vectors per thread the heuristic aims at, when there is work enough
# Below this many vectors in the whole tensor (2 MiB), ITEMS = 4 leaves most SMs idle (1024
# heads of 128 bf16: 32 blocks on 132 SMs): aim at 1 vector per thread, 4x the blocks. Measured
# on an H100: kp_rms_norm_per_head at 1024 x {64,128,256} was up to 15 % slower than
# torch.compile with ITEMS = 4 everywhere.
SMALL_WORK = 1 << 17
SMALL_TARGET = 1   # vectors per thread aimed at below SMALL_WORK
# ... but at most this many threads per row there: a row over more warps pays more in the
# cross-warp combine (a barrier over the block, then every thread's serial sum of the warps'
# partials) than it gains in loads in flight. Measured on an H100 in chain (issue 35, against
# Liger's RMSNorm): decode 64 x 8192 bf16 3.08 us at TPR 1024 x 1 vector, 2.67 at 256 x 4;
# 1 x 4096 2.02 at 512 x 1, 1.85 at 256 x 2 (benchmarks/README.md, RMSNorm against Liger).
SMALL_TPR_MAX = 256
ITEMS_MAX = 4      # the kernel's register-resident limit (static_assert in the .cu)
TPR_MAX = 1024     # threads per row: one block
MIN_BLOCK = 64     # threads per block at least: short rows share a block
MAX_MIN_BLOCK = 256  # the kernel's launch bound for TPR <= 256 (KP_MAX_BLOCK)


def _next_pow2(v: int) -> int:
    return 1 if v <= 1 else 1 << (v - 1).bit_length()


def pick(vectors: int, rows: int, small_target: int = SMALL_TARGET) -> tuple[int, int]:
    """(ITEMS, TPR) for `rows` rows of `vectors` 16-byte vectors (see the module docstring)."""
    small = rows * vectors < SMALL_WORK
    target = small_target if small else ITEMS_TARGET
    tpr = _next_pow2(-(-vectors // target))
    if small:  # the cap, unless the row would then need more than ITEMS_MAX vectors a thread
        tpr = max(min(tpr, SMALL_TPR_MAX), _next_pow2(-(-vectors // ITEMS_MAX)))
    tpr = min(TPR_MAX, tpr)
    return -(-vectors // tpr), tpr


# Every (ITEMS, TPR) the geometry can pick for a valid row: what nvcc_check instantiates.
CONFIGS = tuple(sorted({pick(v, rows) for v in range(1, ITEMS_MAX * TPR_MAX + 1)
                        for rows in (1, SMALL_WORK)}, key=lambda c: (c[1], c[0])))
KERNELS = [
    (SOURCE, "kp_rms_norm", CONFIGS),
    (SOURCE, "kp_rms_norm_residual", CONFIGS),
    (SOURCE, "kp_add_rms_norm", CONFIGS),
]


# --- geometry: derived from the dims and dtype alone -------------------------------------------

def _geometry(rows: int, n: int, dtype: str, small_target: int = SMALL_TARGET,
              min_block: int = MIN_BLOCK) -> tuple[dict, Launch]:
    if min_block not in (32, 64, 128, MAX_MIN_BLOCK):
        raise ValueError(f"min_block={min_block}: use 32, 64, 128 or {MAX_MIN_BLOCK} "
                         "(a power of two within the kernel's launch bound)")
    vec = VEC[dtype]
    vectors = n // vec
    items, tpr = pick(vectors, rows, small_target)
    block = max(tpr, min_block)
    rpb = block // tpr
    derived = {"vec": vec, "vectors": vectors, "items": items, "tpr": tpr, "rpb": rpb,
               "block": block, "rows": rows}
    return derived, Launch(grid=(-(-rows // rpb), 1, 1), block=(block, 1, 1),
                           extra={"rows": rows, "n": n, "items": items, "tpr": tpr, "rpb": rpb})


def _row_geometry(dims, params, **knobs):
    return _geometry(dims["rows"], dims["n"], params["dtype"], **knobs)


def _per_head_geometry(dims, params, **knobs):
    """rows = batch*tokens*heads, n = head_dim; the one weight [head_dim] is shared by all."""
    rows = dims["batch"] * dims["tokens"] * dims["heads"]
    return _geometry(rows, dims["head_dim"], params["dtype"], **knobs)


# --- numerics: the sum of squares' order, from the same geometry ------------------------------

def sum_order(items: int, tpr: int, vec: int):
    """The order `kp_row` sums a row's squares in (kp_rms_norm.cu, "Reduction"). Element
    e = v * VEC + k of vector v = i * TPR + t (thread t, item i), k = h * 4 + a, thread
    t = w * 32 + l: accumulator a of thread t adds its terms in (i, h) order; a thread adds its
    accumulators (a0 + a1) + (a2 + a3); a warp's lanes meet in an xor butterfly (offsets
    16, 8, ... 1); a row over several warps adds the warps' partials in warp order."""
    lanes = min(tpr, 32)
    return plan({"item": items, "warp": tpr // lanes, "lane": lanes, "half": vec // 4, "acc": 4},
                ("item half", "sequential"), ("acc", "pairwise"), ("lane", "butterfly"),
                ("warp", "sequential"))


def _declared(geometry):
    """The sum of squares' order for the case's launch, and its overflow: an f32 sum with no
    rescaling, so past f32's range it is inf and rsqrt gives 0 (`oracle/norms.py` "Domain")."""
    def numerics(case) -> Numerics:
        derived, _ = geometry(case.dims, {**case.params, "dtype": case.dtype})
        return Numerics(sum_order(derived["items"], derived["tpr"], derived["vec"]),
                        overflow="inf")
    return numerics


# --- invariants ---------------------------------------------------------------------------------

def _max_n(ns) -> int:
    return ITEMS_MAX * TPR_MAX * ns["vec"]


def _fix(dim: str, other: str = ""):
    def fix(ns) -> str:
        vec = ns["vec"]
        near = nearest_multiples(ns[dim], vec, vec, _max_n(ns))
        return (f"{dim} = {near} (a multiple of {vec}, at most {_max_n(ns)}, for "
                f"{ns['dtype']}){other}")
    return fix


def _invariants(dim: str, other: str, big: dict) -> tuple[Invariant, ...]:
    """The three rules on the row length `dim`; `big` breaks the cap for every dtype. Violations
    are chosen to break only their own rule for every dtype (66 and 1026 are 2 mod 4 and mod 8)."""
    fix = _fix(dim, other)
    shows = (dim, "dtype", "vec")
    odd = 66 if dim == "head_dim" else 1026
    return (
        Invariant(f"{dim} % vec == 0", lambda ns: ns[dim] % ns["vec"] == 0,
                  "rows are read and written as 16-byte vectors of vec = 16/sizeof(T) elements: "
                  "with a partial vector a row would not start 16-byte aligned (misaligned "
                  "vector access faults) and its tail would be dropped",
                  fix, {dim: odd}, shows),
        Invariant(f"{dim} >= vec", lambda ns: ns[dim] >= ns["vec"],
                  "a row needs at least one 16-byte vector (an empty row has nothing to "
                  "normalise, and rsqrt(0/0 + eps) is NaN)",
                  fix, {dim: 0}, shows),
        Invariant(f"{dim} <= {ITEMS_MAX * TPR_MAX} * vec",
                  lambda ns: ns[dim] <= ITEMS_MAX * TPR_MAX * ns["vec"],
                  f"the row is held in registers, at most {ITEMS_MAX} vectors per thread and "
                  f"{TPR_MAX} threads per row (no instance beyond)",
                  fix, big, (*shows, "tpr", "items")),
    )


# Breaks the cap for every dtype (> 32768, a multiple of 8); per head with one row only, so that
# the violating case's inputs stay small.
BIG_N = 32776
ONCE = rounding_once("torch:rms_norm_llama for rounding='normed'")
RMS_NORM = Contract(
    invariants=(*ONCE, *_invariants("n", ", or use cuda:mt_rms_norm_wide (any n)",
                                    {"n": BIG_N})),
    geometry=_row_geometry)
ROW_OP = Contract(invariants=_invariants("n", "", {"n": BIG_N}), geometry=_row_geometry)
PER_HEAD = Contract(
    invariants=(*rounding_once("mlx:fast_rms_norm_per_head for rounding='normed'"),
                *_invariants("head_dim", "", {"head_dim": BIG_N, "batch": 1, "tokens": 1,
                                              "heads": 1})),
    geometry=_per_head_geometry)


# --- launch -----------------------------------------------------------------------------------

def _launcher(name: str, ins: tuple[str, ...], outs: tuple[str, ...]):
    """make(defines, pdl) -> run: launches `name<T, ITEMS, TPR>` on the `ins`, then the `outs`,
    then eps, weight_offset, rows, n; as a programmatic dependent launch unless pdl=False (the
    kernel is written for both: see kp_rms_norm.cu)."""
    def make(defines: tuple = (), pdl: bool = True):
        def run(launch, inputs, outputs, case):
            arrays = (*(inputs[k] for k in ins), *(outputs[k] for k in outs))
            for key, a in zip((*ins, *outs), arrays):
                if a.data.ptr % VEC_BYTES:
                    raise ValueError(f"{key} is not {VEC_BYTES}-byte aligned: the kernel "
                                     "reads and writes 16-byte vectors")
            e = launch.extra
            args = (*arrays, np.float32(case.params["eps"]),
                    np.float32(case.params["weight_offset"]), np.int32(e["rows"]),
                    np.int32(e["n"]))
            k = kernel(SOURCE, name, case.dtype, defines, (e["items"], e["tpr"]))
            cuda_launch(k, launch.grid, launch.block, args, pdl=pdl)
        return run
    return make


X_W = ("x", "w")
register(
    cuda_impl("kp_rms_norm", "rms_norm", RMS_NORM, _launcher("kp_rms_norm", X_W, ("out",)),
          "kparity RMSNorm: 16-byte vectors, TPR threads x ITEMS vectors per row in registers, "
          "short rows several per block; n % VEC == 0, n <= 4096 * VEC.",
          numerics=_declared(_row_geometry)),
    cuda_impl("kp_rms_norm_per_head", "rms_norm_per_head", PER_HEAD,
          _launcher("kp_rms_norm", X_W, ("out",)),
          "q_norm/k_norm on kp_rms_norm: rows = batch*tokens*heads, n = head_dim (1024 heads of "
          "128 bf16: 16 threads per head, 4 heads per block); one weight broadcast to every head.",
          numerics=_declared(_per_head_geometry)),
    cuda_impl("kp_rms_norm_residual", "rms_norm_residual", ROW_OP,
          _launcher("kp_rms_norm_residual", ("x", "residual", "w"), ("out",)),
          "kp_rms_norm fused with the residual add: residual + x*inv*w, one rounding.",
          numerics=_declared(_row_geometry)),
    cuda_impl("kp_add_rms_norm", "add_rms_norm", ROW_OP,
          _launcher("kp_add_rms_norm", ("a", "b", "w"), ("residual_out", "normed_out")),
          "kp_rms_norm fused with the pre-norm add: s = a+b in f32; T(s) and T(s*inv*w).",
          numerics=_declared(_row_geometry)),
)
