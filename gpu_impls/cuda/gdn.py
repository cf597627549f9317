"""Gated DeltaNet on CUDA (issue 29): the decode step and the chunked pipeline's output stage.

* `cuda:kp_gdn_step` (op `gdn_step`, `oracle/gdn.py`; `kernels/gdn_step.cu`): kparity's decode
  step. Per (batch, value head) the f32 state [V, K] is read once and written once (the step is
  a read-modify-write of the state: bandwidth-bound). A warp owns whole rows of the state, K / 32
  elements a lane (one float4 at K = 128), 4 rows a warp, 4 warps a block (16 rows of one
  (b, h)); the dots S k and S q are warp butterflies; l2norm of q and k (when the param says so)
  in f32, the decay before the delta, the rank-1 update, o rounded to T once. Flat grid:
  B * Hv * ceil(V / 16) blocks of 128 threads. One instance per K / 32 (1..8): contract
  K % 32 == 0, K <= 256, Hv % Hk == 0. The state out is a plain output (the kernel would also
  update in place: each element is read before it is written, by the same thread).
* `cuda:gdn_chunk_o` (op `gdn_chunk_o`, `oracle/gdn_chunked.py`; `kernels/gdn_chunk_o.cu`): a
  port of the seed, mlx-native's `gated_delta_net_chunk_o_bf16`, with its geometry (grid
  (V / 32, NT, B * Hv), 256 threads, 8 KiB of shared memory: the A tile in T) and its math (the
  inclusive causal mask, the A tile rounded to T before the closing dot, the scale once after
  both dots, f32 accumulation); the seed's 8x8 simdgroup MMAs become mma.sync m16n8k16 on the
  transposed tiles. Contract (the seed's): K == 128, V % 32 == 0, V <= 256, T % 64 == 0,
  chunk == 64, f16 / bf16 only (the tensor-core inputs; the seed is bf16). The seed's Hv % Hk
  == 0 is the op's domain (`oracle/gdn_chunked.check_domain`: no case breaks it, and the
  op's inputs cannot even be drawn for one), so it is no invariant here. Where NT or B * Hv
  passes CUDA's 65535 for grid.y / grid.z, the grid is capped there and blocks stride over the
  rest (the seed has no such limit on Metal).

Numerics: both declare the default (sums in any order; CUDA's expf and rsqrtf within the
default 2 ULPs; CuPy compiles with -ftz=true, which the runner's oracle accounts for).
Test-only mutants (tests/mutants.py): KPARITY_MUTANT_DECAY_AFTER_UPDATE (the step),
KPARITY_MUTANT_EXCLUSIVE_MASK (chunk_o's diagonal excluded).
"""

from __future__ import annotations

import math

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch, nearest_multiples
from gpu_impls.cuda._module import cuda_impl, kernel, launch as cuda_launch
from gpu_impls.cuda.sum_orders import warp_of_vectors
from oracle import gdn_chunked
from oracle.gdn import EPS, scale_of
from oracle.numerics import Numerics

STEP_SOURCE = "gdn_step.cu"
CHUNK_O_SOURCE = "gdn_chunk_o.cu"
STEP_THREADS = 128       # KP_GDN_WARPS * 32
STEP_ROWS = 16           # KP_GDN_WARPS * KP_GDN_ROWS: state rows per block
STEP_MAX_K = 256         # 32 lanes x 8 elements (the instances: K / 32 in 1..8)
CHUNK_O_THREADS = 256    # GDN_O_THREADS: 8 warps
CHUNK_O_K = 128          # GDN_O_K
CHUNK_O_BT = 64          # GDN_O_BT: the chunk
CHUNK_O_BV = 32          # GDN_O_BV: V columns per block
CHUNK_O_MAX_V = 256      # the seed's limit
CHUNK_O_SHARED = CHUNK_O_BT * CHUNK_O_BT * 2  # the A tile in T: 8 KiB, static
GRID_YZ_MAX = 65535  # CUDA's gridDim.y and gridDim.z limit
KERNELS = [(STEP_SOURCE, "kp_gdn_step", [(kpl,) for kpl in range(1, STEP_MAX_K // 32 + 1)]),
           (CHUNK_O_SOURCE, "gdn_chunk_o")]


# --- cuda:kp_gdn_step ---------------------------------------------------------------------------

def _step_geometry(dims, params):
    slices = -(-dims["dim_v"] // STEP_ROWS)
    derived = {"slices": slices, "kpl": dims["dim_k"] // 32}
    blocks = dims["batch"] * dims["heads_v"] * slices
    return derived, Launch(grid=(max(1, blocks), 1, 1), block=(STEP_THREADS, 1, 1),
                           extra=derived)


def _step_numerics(case) -> Numerics:
    """Every sum over K (the l2 norms, k.S, q.S): a lane's KPL elements, then the warp's
    butterfly (gdn_step.cu `warp_sums`), KPL from the launch's geometry."""
    return Numerics(warp_of_vectors(_step_geometry(case.dims, case.params)[0]["kpl"]))


STEP_K_LANES = Invariant(
    name="dim_k % 32 == 0", holds=lambda ns: ns["dim_k"] % 32 == 0,
    why="each of a warp's 32 lanes holds K / 32 elements of a state row",
    fix=lambda ns: f"dim_k = {nearest_multiples(ns['dim_k'], 32, 32, STEP_MAX_K)}",
    violation={"dim_k": 80}, shows=("dim_k",))
STEP_K_MAX = Invariant(
    name=f"dim_k <= {STEP_MAX_K}", holds=lambda ns: ns["dim_k"] <= STEP_MAX_K,
    why=f"a lane holds at most {STEP_MAX_K // 32} elements of a state row in registers (the "
        "instances: K / 32 in 1..8)",
    fix=lambda ns: f"dim_k <= {STEP_MAX_K}", violation={"dim_k": 288}, shows=("dim_k",))
STEP_GQA = Invariant(
    name="heads_v % heads_k == 0", holds=lambda ns: ns["heads_v"] % ns["heads_k"] == 0,
    why="value head h reads q/k head h // (heads_v / heads_k): the groups must be whole",
    fix=lambda ns: f"heads_k a divisor of heads_v={ns['heads_v']}, e.g. "
                   f"{math.gcd(ns['heads_v'], ns['heads_k'])}",
    violation={"heads_v": 6, "heads_k": 4}, shows=("heads_v", "heads_k"))
STEP_CONTRACT = Contract(invariants=(STEP_K_LANES, STEP_K_MAX, STEP_GQA),
                         geometry=_step_geometry)


def _step(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, p, e = case.dims, case.params, launch.extra
        args = (inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
                inputs["state_in"], outputs["state_out"], outputs["o"],
                np.int32(d["heads_k"]), np.int32(d["heads_v"]), np.int32(d["dim_v"]),
                np.int32(e["slices"]), np.int32(bool(p["l2norm"])),
                np.float32(scale_of(case)), np.float32(EPS))
        k = kernel(STEP_SOURCE, "kp_gdn_step", case.dtype, defines, (e["kpl"],))
        cuda_launch(k, launch.grid, launch.block, args)
    return run


# --- cuda:gdn_chunk_o ---------------------------------------------------------------------------

def _chunk_o_geometry(dims, params):
    """The seed's grid (V / 32, NT, B * Hv), y and z capped at CUDA's 65535 (the kernel strides
    over the rest)."""
    n_chunks = -(-dims["tokens"] // CHUNK_O_BT)
    derived = {"n_chunks": n_chunks, "v_tiles": dims["dim_v"] // CHUNK_O_BV}
    grid = (max(1, derived["v_tiles"]), max(1, min(n_chunks, GRID_YZ_MAX)),
            max(1, min(dims["batch"] * dims["heads_v"], GRID_YZ_MAX)))
    return derived, Launch(grid=grid, block=(CHUNK_O_THREADS, 1, 1), extra=derived)


CHUNK_O_INVARIANTS = (
    Invariant(
        name=f"dim_k == {CHUNK_O_K}", holds=lambda ns: ns["dim_k"] == CHUNK_O_K,
        why="the K reduction is a compile-time loop of 8 MMA steps of 16 (the seed's hard-coded "
            "16 steps of 8: K = 192 / 256 need FLA's bank split)",
        fix=lambda ns: f"dim_k = {CHUNK_O_K}, or torch's chunked form",
        violation={"dim_k": 64}, shows=("dim_k",)),
    Invariant(
        name=f"dim_v % {CHUNK_O_BV} == 0", holds=lambda ns: ns["dim_v"] % CHUNK_O_BV == 0,
        why=f"a block computes {CHUNK_O_BV} V columns (grid.x = V / {CHUNK_O_BV}); the columns "
            "of a partial tile would never be written",
        fix=lambda ns: "dim_v = " + nearest_multiples(ns["dim_v"], CHUNK_O_BV, CHUNK_O_BV,
                                                      CHUNK_O_MAX_V),
        violation={"dim_v": 48}, shows=("dim_v",)),
    Invariant(
        name=f"dim_v <= {CHUNK_O_MAX_V}", holds=lambda ns: ns["dim_v"] <= CHUNK_O_MAX_V,
        why="the seed's limit (mlx-native validate(): V <= 256)",
        fix=lambda ns: f"dim_v <= {CHUNK_O_MAX_V}", violation={"dim_v": 288},
        shows=("dim_v",)),
    Invariant(
        name=f"tokens % {CHUNK_O_BT} == 0", holds=lambda ns: ns["tokens"] % CHUNK_O_BT == 0,
        why="every block computes a whole chunk of 64 rows, with no row guard (the seed's "
            "T % 64 == 0)",
        fix=lambda ns: f"tokens a multiple of {CHUNK_O_BT}, e.g. "
                       f"{max(CHUNK_O_BT, -(-ns['tokens'] // CHUNK_O_BT) * CHUNK_O_BT)} "
                       "(zero-padded), or torch's chunked form",
        violation={"tokens": 96}, shows=("tokens",)),
    Invariant(
        name=f"chunk == {CHUNK_O_BT}", holds=lambda ns: ns["chunk"] == CHUNK_O_BT,
        why="the chunk is the kernel's tile (BT = 64: 8 warps of 8 rows, the A tile 64 x 64)",
        fix=lambda ns: f"chunk = {CHUNK_O_BT}, or torch's chunked form for 16 / 32",
        violation={"chunk": 32}, shows=("chunk",)),
)
CHUNK_O_CONTRACT = Contract(invariants=CHUNK_O_INVARIANTS, geometry=_chunk_o_geometry,
                            dtypes=("f16", "bf16"))


def _chunk_o(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, e = case.dims, launch.extra
        args = (inputs["q"], inputs["k"], inputs["v_new"], inputs["h"], inputs["gc"],
                outputs["o"], np.int32(d["batch"]), np.int32(d["tokens"]),
                np.int32(d["heads_k"]),
                np.int32(d["heads_v"]), np.int32(d["dim_v"]), np.int32(e["n_chunks"]),
                np.float32(gdn_chunked.scale_of(case)))
        cuda_launch(kernel(CHUNK_O_SOURCE, "gdn_chunk_o", case.dtype, defines), launch.grid,
                    launch.block, args)
    return run


register(
    cuda_impl("kp_gdn_step", "gdn_step", STEP_CONTRACT, _step,
              "kparity GDN decode step: a warp per 4 state rows, float4 loads along K, warp "
              "butterfly dots, f32 state read once and written once",
              numerics=_step_numerics),
    cuda_impl("gdn_chunk_o", "gdn_chunk_o", CHUNK_O_CONTRACT, _chunk_o,
              "mlx-native chunk_o port: grid (V/32, NT, B*Hv), 256 threads, mma.m16n8k16, "
              "inclusive causal mask, A tile rounded to T before the closing dot"),
)
