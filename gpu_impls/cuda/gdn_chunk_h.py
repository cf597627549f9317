"""Gated DeltaNet's inter-chunk stage on CUDA (issue 29), and the l2 normalisation the chunked
composition runs first.

* `cuda:kp_gdn_chunk_h` (op `gdn_chunk_h`, `oracle/gdn_chunked.py`; `kernels/gdn_chunk_h.cu`):
  the state across chunks with the oracle's rounding points (T(S) in the dot and at h's store,
  v_new stored in T, vdec rounded to T, the f32 state). The chunk loop is sequential: this stage
  is the pipeline's critical path. A block owns 32 rows of one (batch, value head)'s f32 state
  in registers for the whole sequence (grid (ceil(V / 32), B * Hv), 256 threads: 128 blocks at
  B = 1, Hv = 32, V = 128); per chunk the w and k rows are staged in shared memory as f32 (the
  next chunk's loaded while this one computes), v_new and the state update are CUDA-core f32
  FMAs over T-rounded operands. Any V (a partial tile's rows are held at 0 and not stored), any
  T (the last chunk's rows past T read as 0), chunks of 16 / 32 / 64, GQA, f32 / f16 / bf16.
  One instance per padded K (32, 64, 128, 256: the state elements a lane holds per row, K / 32
  rounded up): contract K % 8 == 0 (16-byte staging loads), K <= 256. Where B * Hv passes
  CUDA's 65535 for grid.y, the grid is capped there and blocks stride over the rest.
  Shared memory (dynamic, computed by `shared_bytes`): (2 C + 32)(KP + 4) + 36 C floats, at most
  171.5 KiB (K = 256, C = 64), under the 227 KiB a block may opt in to on sm_90: no case within
  the invariants can break it (`tests/test_cuda_gdn_chunk_h.py` checks every instance).
* `l2norm(x_in, x_out, eps, dtype)` (`kp_gdn_l2norm`): x_out = T(x_in · rsqrt(Σ x_in² + eps)) per
  row of the last axis (`oracle.gdn_chunked.normalised`), f32 sum of squares; for the composition
  `cuda:kp_gdn_chunked`. Not an op of its own.

Numerics: the default (sums in any order; CUDA's expf and rsqrtf within the default 2 ULPs; CuPy
compiles with -ftz=true, which the runner's oracle accounts for). Test-only mutant
(tests/mutants.py): KPARITY_MUTANT_UNSCALED_STATE (the state carried into the next chunk
without exp(gc_last)).
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch, nearest_multiples
from gpu_impls.cuda._module import cuda_impl, kernel, launch as cuda_launch

SOURCE = "gdn_chunk_h.cu"
THREADS = 256            # KP_GDN_H_THREADS: 8 warps
BV = 32                  # KP_GDN_H_BV: state rows per block
CMAX = 64                # KP_GDN_H_CMAX: the largest chunk
PAD = 4                  # KP_GDN_H_PAD: floats of padding per shared row
VLD = 36                 # KP_GDN_H_VLD: floats per row of the vdec tile
L2_WARPS = 8             # KP_GDN_L2_WARPS: kp_gdn_l2norm's rows per block
INSTANCES = (32, 64, 128, 256)  # K padded: the kernel's KP template argument
K_ALIGN = 8              # 16 bytes of f16 / bf16 (and 4 x 4 of f32): the staging vectors
SHARED_OPT_IN_MAX = 227 * 1024  # dynamic shared memory a block may opt in to on sm_90
GRID_Y_MAX = 65535       # CUDA's gridDim.y limit
KERNELS = [(SOURCE, "kp_gdn_chunk_h", [(kp,) for kp in INSTANCES]),
           (SOURCE, "kp_gdn_l2norm")]


def instance(dim_k: int) -> int:
    """The padded K of the instance that runs `dim_k` (0 past the largest)."""
    return next((kp for kp in INSTANCES if kp >= dim_k), 0)


def shared_bytes(kp: int, chunk: int) -> int:
    """The kernel's dynamic shared memory: w_s and k_s [chunk][kp + 4], sh_s [32][kp + 4],
    vd_s [chunk][36], f32."""
    return 4 * ((2 * chunk + BV) * (kp + PAD) + chunk * VLD)


# --- cuda:kp_gdn_chunk_h ------------------------------------------------------------------------

def _chunk_h_geometry(dims, params):
    """Grid (ceil(V / 32), B * Hv capped at 65535), 256 threads, the shared bytes of the
    instance for K and the chunk."""
    chunk = params["chunk"]
    kp = instance(dims["dim_k"])
    derived = {"kp": kp, "n_chunks": -(-dims["tokens"] // chunk),
               "v_tiles": -(-dims["dim_v"] // BV), "shared_bytes": shared_bytes(kp, chunk)}
    grid = (max(1, derived["v_tiles"]),
            max(1, min(dims["batch"] * dims["heads_v"], GRID_Y_MAX)), 1)
    return derived, Launch(grid=grid, block=(THREADS, 1, 1),
                           shared_bytes=derived["shared_bytes"], extra=derived)


CHUNK_H_INVARIANTS = (
    Invariant(
        name=f"dim_k % {K_ALIGN} == 0", holds=lambda ns: ns["dim_k"] % K_ALIGN == 0,
        why="the k and w rows are staged as 16-byte vectors (8 f16 / bf16 or 4 f32 elements): "
            "every row must start on a 16-byte boundary",
        fix=lambda ns: "dim_k = " + nearest_multiples(ns["dim_k"], K_ALIGN, lo=K_ALIGN,
                                                      hi=INSTANCES[-1]),
        violation={"dim_k": 20}, shows=("dim_k",)),
    Invariant(
        name=f"dim_k <= {INSTANCES[-1]}", holds=lambda ns: ns["dim_k"] <= INSTANCES[-1],
        why=f"a lane holds K / 32 (at most {INSTANCES[-1] // 32}) elements of each of its 4 "
            f"state rows in registers (instances: K padded to {', '.join(map(str, INSTANCES))}), "
            "and the f32 w and k rows of a 64-token chunk take 171.5 KiB of shared memory at "
            f"K = {INSTANCES[-1]}",
        fix=lambda ns: f"dim_k <= {INSTANCES[-1]}, or torch's chunk_h stage",
        violation={"dim_k": INSTANCES[-1] + K_ALIGN}, shows=("dim_k",)),
)
CHUNK_H_CONTRACT = Contract(invariants=CHUNK_H_INVARIANTS, geometry=_chunk_h_geometry)


def _chunk_h(defines: tuple = ()):
    """The run function of `cuda:kp_gdn_chunk_h` (with `defines`: a mutant's): reads the op's
    tensors by name, the case's dims, its `chunk` and dtype, and the launch the contract
    derived."""
    def run(launch, inputs, outputs, case):
        d, e = case.dims, launch.extra
        args = (inputs["k"], inputs["w"], inputs["u"], inputs["gc"], inputs["h0"],
                outputs["h"], outputs["v_new"], outputs["state"],
                np.int32(d["batch"]), np.int32(d["tokens"]), np.int32(d["heads_k"]),
                np.int32(d["heads_v"]), np.int32(d["dim_k"]), np.int32(d["dim_v"]),
                np.int32(case.params["chunk"]), np.int32(e["n_chunks"]))
        k = kernel(SOURCE, "kp_gdn_chunk_h", case.dtype, defines, (e["kp"],))
        cuda_launch(k, launch.grid, launch.block, args, shared_bytes=launch.shared_bytes)
    return run


# --- l2norm (for the composition) ----------------------------------------------------------------

def l2_geometry(shape: tuple[int, ...]) -> tuple[int, int, tuple, tuple]:
    """(rows, dim, grid, block) of `kp_gdn_l2norm` on an array of `shape`: a warp per row of
    the last axis, L2_WARPS rows per block, a flat grid."""
    dim = int(shape[-1])
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    return rows, dim, (max(1, -(-rows // L2_WARPS)), 1, 1), (L2_WARPS * 32, 1, 1)


def l2norm(x_in, x_out, eps: float, dtype: str) -> None:
    """x_out = T(x_in · rsqrt(Σ x_in² + eps)) per row of the last axis, the sum of squares in
    f32 (`oracle.gdn_chunked.normalised`): CuPy arrays of the same shape, contiguous, holding
    `dtype` ("f32", "f16", "bf16": f16 and bf16 are both uint16 on the device, so the caller
    names it). x_out may be x_in."""
    if tuple(x_in.shape) != tuple(x_out.shape):
        raise ValueError(f"l2norm: x_in {tuple(x_in.shape)} and x_out {tuple(x_out.shape)} "
                         "must have one shape")
    rows, dim, grid, block = l2_geometry(tuple(x_in.shape))
    if rows == 0 or dim == 0:
        return
    cuda_launch(kernel(SOURCE, "kp_gdn_l2norm", dtype), grid, block,
                (x_in, x_out, np.int64(rows), np.int32(dim), np.float32(eps)))


register(
    cuda_impl("kp_gdn_chunk_h", "gdn_chunk_h", CHUNK_H_CONTRACT, _chunk_h,
              "kparity GDN inter-chunk state: a block per 32 f32 state rows of a head in "
              "registers over the sequence, w and k staged in shared memory (next chunk "
              "prefetched), CUDA-core f32 FMAs, T(S), v_new and vdec rounded as the oracle"),
)
