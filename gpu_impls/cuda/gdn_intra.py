"""Gated DeltaNet's intra-chunk stages on CUDA (issue 29): kparity's own kernels for the four
stage ops before the state scan (`oracle/gdn_chunked.py`; `kernels/gdn_intra.cu`), each on CUDA
cores in f32, the chunk C (16, 32, 64) a template argument:

* `cuda:kp_gdn_chunk_cumsum` (op `gdn_chunk_cumsum`): gc = the chunk-local inclusive cumsum of g,
  one thread per (b, chunk, value head), sequential in ascending order; flat grid of 128-thread
  blocks.
* `cuda:kp_gdn_kkt` (op `gdn_kkt`): A[t, h, j] = beta_i (k_i·k_j) exp(gc_i − gc_j) for j < i in
  the chunk, else an exact 0 (all of A written). One block per (k head, chunk), grid (B·Hk, NT):
  k_i·k_j is common to the Hv / Hk value heads that read the k head, so the block computes the
  dots once (the k tile in shared memory as f32, a 4 x 4 tile of the lower triangle a thread)
  and writes A for each of them (exp of the f32 difference, then beta_i · dot · decay).
* `cuda:kp_gdn_solve_tril` (op `gdn_solve_tril`): Ai = (I + L)^-1 per chunk, by right-looking
  substitution in f32 (C − 1 sequential steps, one barrier each; each thread a 4 x 4 tile of X in
  registers), stored in T with exact zeros above the diagonal. Grid (B·Hv, NT).
* `cuda:kp_gdn_wy` (op `gdn_wy`): w = Ai @ T(k·beta·exp(gc)), u = Ai @ T(v·beta), the operands
  rounded to T where the oracle rounds them, f32 sums over j <= i (Ai is unit lower triangular:
  its upper part is ignored). One block per (value head, 64 columns of w or u, chunk), grid
  (B·Hv·tiles, NT), tiles = ceil(K / 64) + ceil(V / 64); 4 rows x 8 columns a thread.

Padding: T need not be a multiple of C; rows past T are the oracle's zeros (k, v, beta, g zero)
and are never stored. GQA: value head h reads k head h // (Hv / Hk). grid.y (the chunks) is
capped at CUDA's 65535 and the blocks stride over the rest.

Contracts (the real limits only): kkt and wy read k 4 elements at a time (K % 4 == 0), wy v
likewise (V % 4 == 0); kkt's dynamic shared memory, (max(K, C)·(C + 4) + 2C) floats (the k
tile, transposed, then the dot matrix in the same bytes, and a chunk's gc and beta), must fit
the per-block opt-in limit of sm_90 (227 KiB: K <= 852 at C = 64); over 48 KiB the launch
opts in. solve and wy use static shared memory within 48 KiB at every C (34816 and 34048 bytes at
C = 64), whatever K and V. Hv % Hk == 0 is the op's domain.

Numerics: the default (sums in any order; CUDA's expf within 2 ULPs; CuPy's -ftz=true, which
the runner's oracle accounts for). Every dot is an fmaf chain in ascending index order.

For the composition (`cuda:kp_gdn_chunked`): `CUMSUM_CONTRACT, KKT_CONTRACT, SOLVE_CONTRACT,
WY_CONTRACT`, and `_cumsum(), _kkt(), _solve(), _wy()`, each a `run(launch, inputs, outputs,
case)` that reads only case.dims, case.params["chunk"], case.dtype, the stage op's tensor names
and `launch` (the stage contract's geometry for those dims and params: `contract.geometry(
case.dims, case.params)[1]` or `contract.check(...)`), so a `gdn_chunked` case drives them.

Test-only mutant (tests/mutants.py): KPARITY_MUTANT_DECAY_SIGN (kkt's decay exp(gc_j − gc_i)).
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch, nearest_multiples
from gpu_impls.cuda._module import cuda_impl, kernel, launch as cuda_launch
from oracle.gdn_chunked import CHUNKS
from oracle.gdn_chunked_math import n_chunks
from oracle.numerics import SEQUENTIAL, Numerics

SOURCE = "gdn_intra.cu"
CUMSUM_THREADS = 128   # GDN_CUMSUM_THREADS
WY_BN = 64             # GDN_WY_BN: output columns per wy block
WY_COLS = 8            # GDN_WY_COLS: output columns per wy thread
SHARED_MAX = 227 * 1024  # sm_90's dynamic shared memory per block, opted in
GRID_YZ_MAX = 65535    # CUDA's gridDim.y limit: the kernels stride over further chunks
CHUNK_ARGS = [(c,) for c in CHUNKS]  # the instances: one per chunk size
KERNELS = [(SOURCE, name, CHUNK_ARGS)
           for name in ("kp_gdn_chunk_cumsum", "kp_gdn_kkt", "kp_gdn_solve_tril", "kp_gdn_wy")]


# --- geometry shared with the kernels (gdn_intra_detail in the .cu) ------------------------------

def lower_tiles(c: int) -> int:
    """4 x 4 tiles in the lower triangle (diagonal included) of a C x C matrix."""
    return (c // 4) * (c // 4 + 1) // 2


def tri_threads(c: int) -> int:
    """kkt's and solve's threads: one per lower tile, whole warps (32, 64, 160 at C = 16, 32,
    64)."""
    return -(-lower_tiles(c) // 32) * 32


def wy_threads(c: int) -> int:
    """wy's threads: one per 4 rows x 8 columns of a block's C x 64 outputs."""
    return (c // 4) * (WY_BN // WY_COLS)


def kkt_shared_bytes(dim_k: int, c: int) -> int:
    """kkt's dynamic shared memory: the k tile transposed, K x (C + 4) f32 (later the C x (C + 4)
    dot matrix in the same bytes), then gc and beta of the chunk (C f32 each)."""
    return (max(dim_k, c) * (c + 4) + 2 * c) * 4


def kkt_max_k(c: int) -> int:
    """The largest K whose kkt shared memory fits SHARED_MAX at chunk c."""
    return (SHARED_MAX // 4 - 2 * c) // (c + 4)


def _chunk_rows(dims, params) -> tuple[int, int]:
    """(NT, grid.y): the chunks, and the blocks along y (capped; the kernels stride)."""
    nt = n_chunks(dims, params)
    return nt, max(1, min(nt, GRID_YZ_MAX))


def _wy_tiles(dims) -> tuple[int, int]:
    """(w tiles, all tiles): 64-column tiles of w (K) then of u (V)."""
    w_tiles = -(-dims["dim_k"] // WY_BN)
    return w_tiles, w_tiles + -(-dims["dim_v"] // WY_BN)


# --- contracts -----------------------------------------------------------------------------------

def _multiple_of_4(dim: str, who: str) -> Invariant:
    return Invariant(
        name=f"{dim} % 4 == 0", holds=lambda ns: ns[dim] % 4 == 0,
        why=f"{who} 4 elements at a time (8- or 16-byte vectors, aligned to them)",
        fix=lambda ns: f"{dim} = {nearest_multiples(ns[dim], 4, lo=4)}",
        violation={dim: 18}, shows=(dim,))


def _cumsum_geometry(dims, params):
    nt, _ = _chunk_rows(dims, params)
    total = dims["batch"] * nt * dims["heads_v"]
    derived = {"n_chunks": nt, "total": total}
    return derived, Launch(grid=(max(1, -(-total // CUMSUM_THREADS)), 1, 1),
                           block=(CUMSUM_THREADS, 1, 1), extra=derived)


def _kkt_geometry(dims, params):
    c = params["chunk"]
    nt, rows = _chunk_rows(dims, params)
    shared = kkt_shared_bytes(dims["dim_k"], c)
    derived = {"n_chunks": nt, "kkt_shared_bytes": shared}
    return derived, Launch(grid=(dims["batch"] * dims["heads_k"], rows, 1),
                           block=(tri_threads(c), 1, 1), shared_bytes=shared, extra=derived)


def _solve_geometry(dims, params):
    nt, rows = _chunk_rows(dims, params)
    derived = {"n_chunks": nt}
    return derived, Launch(grid=(dims["batch"] * dims["heads_v"], rows, 1),
                           block=(tri_threads(params["chunk"]), 1, 1), extra=derived)


def _wy_geometry(dims, params):
    nt, rows = _chunk_rows(dims, params)
    w_tiles, tiles = _wy_tiles(dims)
    derived = {"n_chunks": nt, "w_tiles": w_tiles, "tiles": tiles}
    return derived, Launch(grid=(dims["batch"] * dims["heads_v"] * tiles, rows, 1),
                           block=(wy_threads(params["chunk"]), 1, 1), extra=derived)


KKT_SHARED = Invariant(
    name=f"kkt shared memory <= {SHARED_MAX // 1024} KiB",
    holds=lambda ns: ns["kkt_shared_bytes"] <= SHARED_MAX,
    why="the block holds the chunk's k tile as f32, K x (chunk + 4) floats (then the chunk x "
        "chunk dots in the same bytes), in shared memory; sm_90 opts a block in to at most "
        f"{SHARED_MAX // 1024} KiB",
    fix=lambda ns: f"dim_k <= {kkt_max_k(ns['chunk'])} at chunk={ns['chunk']}, or torch's "
                   "gdn_kkt",
    violation={"dim_k": 1024, "chunk": 64}, shows=("dim_k", "chunk", "kkt_shared_bytes"))

CUMSUM_CONTRACT = Contract(geometry=_cumsum_geometry)
KKT_CONTRACT = Contract(invariants=(_multiple_of_4("dim_k", "k rows are read"), KKT_SHARED),
                        geometry=_kkt_geometry)
SOLVE_CONTRACT = Contract(geometry=_solve_geometry)
WY_CONTRACT = Contract(invariants=(_multiple_of_4("dim_k", "k rows are read and w written"),
                                   _multiple_of_4("dim_v", "v rows are read and u written")),
                       geometry=_wy_geometry)


# --- runs ----------------------------------------------------------------------------------------

def _i32(*values) -> tuple:
    return tuple(np.int32(v) for v in values)


def _cumsum(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, c = case.dims, case.params["chunk"]
        nt = n_chunks(d, case.params)
        args = (inputs["g"], outputs["gc"],
                *_i32(d["tokens"], d["heads_v"], nt, d["batch"] * nt * d["heads_v"]))
        cuda_launch(kernel(SOURCE, "kp_gdn_chunk_cumsum", case.dtype, defines, (c,)),
                    launch.grid, launch.block, args)
    return run


def _kkt(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, c = case.dims, case.params["chunk"]
        args = (inputs["k"], inputs["beta"], inputs["gc"], outputs["A"],
                *_i32(d["tokens"], d["heads_k"], d["heads_v"], d["dim_k"],
                      n_chunks(d, case.params)))
        cuda_launch(kernel(SOURCE, "kp_gdn_kkt", case.dtype, defines, (c,)), launch.grid,
                    launch.block, args, shared_bytes=kkt_shared_bytes(d["dim_k"], c))
    return run


def _solve(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, c = case.dims, case.params["chunk"]
        args = (inputs["A"], outputs["Ai"],
                *_i32(d["tokens"], d["heads_v"], n_chunks(d, case.params)))
        cuda_launch(kernel(SOURCE, "kp_gdn_solve_tril", case.dtype, defines, (c,)),
                    launch.grid, launch.block, args)
    return run


def _wy(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, c = case.dims, case.params["chunk"]
        w_tiles, tiles = _wy_tiles(d)
        args = (inputs["k"], inputs["v"], inputs["beta"], inputs["gc"], inputs["Ai"],
                outputs["w"], outputs["u"],
                *_i32(d["tokens"], d["heads_k"], d["heads_v"], d["dim_k"], d["dim_v"], w_tiles,
                      tiles, n_chunks(d, case.params)))
        cuda_launch(kernel(SOURCE, "kp_gdn_wy", case.dtype, defines, (c,)), launch.grid,
                    launch.block, args)
    return run


# cumsum, kkt and wy each sum one chain from 0 in index order along the model's axis (a thread's
# loop, FMAs for the dots: gdn_intra.cu); solve_tril's substitution has no declared-order sum
IN_ORDER = Numerics(SEQUENTIAL)

register(
    cuda_impl("kp_gdn_chunk_cumsum", "gdn_chunk_cumsum", CUMSUM_CONTRACT, _cumsum,
              "kparity chunk-local cumsum of g: a thread per (b, chunk, head), the chunk's loads "
              "at once, then a sequential f32 sum", numerics=IN_ORDER),
    cuda_impl("kp_gdn_kkt", "gdn_kkt", KKT_CONTRACT, _kkt,
              "kparity beta (k kᵀ) exp(gc_i − gc_j), strictly lower: a block per (k head, "
              "chunk), the dots once for the value heads of the group, f32 on CUDA cores",
              numerics=IN_ORDER),
    cuda_impl("kp_gdn_solve_tril", "gdn_solve_tril", SOLVE_CONTRACT, _solve,
              "kparity (I + A)^-1 per chunk: right-looking substitution in f32, a 4x4 tile of "
              "X a thread in registers, rows published through shared memory"),
    cuda_impl("kp_gdn_wy", "gdn_wy", WY_CONTRACT, _wy,
              "kparity w = Ai T(k beta e^gc), u = Ai T(v beta): a block per (head, 64 columns, "
              "chunk), f32 on CUDA cores over the lower triangle", numerics=IN_ORDER),
)
