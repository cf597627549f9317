"""`cuda:kp_ssd_chunked` (op `ssd_chunked`, `oracle/ssd_chunked.py`; `kernels/kp_ssd_chunked.cu`):
kparity's chunked SSD (Mamba-2's scan in its state-space-duality form, issue 30), three kernels
run in order on one stream, registered as one impl with a contract per launch:

    cb     kp_ssd_cb     C·Bᵀ of every chunk and B/C group (f32), once per group, not per head;
                         grid (ceil(T / 64), B·G): 64 rows of a chunk against its column blocks
    state  kp_ssd_state  the chunk states st_n = Σ_s x_s ⊗ B_s·(exp(cs_last − cs_s)·dt_s) and
                         their passing S_{n+1} = exp(cs_last)·S_n + st_n, sequential over the
                         chunks; S_n stored for `out`, the last S is the op's `state`;
                         grid (ceil(P / 32), B·H): 32 state columns p of a head, in registers
    out    kp_ssd_out    y = (C·S_n)·exp(cs_l) + Σ_{s<=l} (CB·exp(cs_l − cs_s))·dt_s·x_s + D·x,
                         the gate, one rounding; grid (ceil(T / 64), B·H·ceil(P / 64))

Parallelism at batch 1 comes from the heads, the P tiles and (for `cb` and `out`, which hold
~2/3 of the FLOPs) the chunks; `state`'s chunk loop is sequential, over B·H·ceil(P / 32)
blocks (128 at Nemotron-3-Nano's heads: one an SM). The dt, its chunk-local cumsum and the
decays are formed in `state` and in `out` by one device function (same bits). Every dot is f32
operands and f32 CUDA-core FMAs: the oracle's rounding points under either value of its param
`dots` (the kernel rounds none of the three operands the param lets it round). The kernel
header has the math, the thread layouts and the shared memory.

Workspace (f32, kept per shape, allocated outside any timed region: the first call is a warm-up):
the states before each chunk, [B, NT, H, N, PP] (PP = P rounded up to 4), and C·Bᵀ,
[B, NT, G, Q, Q]: 537 MB and 34 MB at Nemotron-3-Nano's heads, T = 16384, chunk 64.

Contract: chunk in {64, 128, 256} (the op's own set: the kernels take a chunk in 64-token
sub-blocks and a thread per token of it for dt and the cumsum), dim_n <= 128 (N padded to 128
in every tile and in the state's registers). No other limit: any P (tiled by 32 and 64), any N up
to 128 (no alignment: 16-byte loads where the rows allow them, element loads otherwise), any T
(the last chunk's rows past T read as zeros), G dividing H (the op's domain), f32 / f16 / bf16.
Where B·G, B·H or B·H·ceil(P / 64) passes CUDA's 65535 for grid.y, the grid is capped there and
blocks stride over the rest. Shared memory is fixed: 66 KiB (cb), 45 KiB static (state),
103 KiB (out), under sm_90's 227 KiB opt-in, whatever the dims.

Test-only mutants (tests/mutants.py): KPARITY_MUTANT_GROUP_MODULO (head h reads B/C group h % G),
KPARITY_MUTANT_DROP_D_SKIP (y without D·x).
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import NO_CONTRACT, Contract, Invariant, Launch
from gpu_impls.cuda._module import cuda_impl, kernel, launch as cuda_launch
from oracle.ssd import dt_limits
from oracle.numerics import Numerics, plan
from oracle.ssd_chunked import CHUNKS

SOURCE = "kp_ssd_chunked.cu"
THREADS = 256   # KP_SSD_THREADS: 8 warps, every kernel
SB = 64         # KP_SSD_SB: tokens per sub-block, rows of every tile
NP = 128        # KP_SSD_NP: N padded, the largest N
PT = 32         # KP_SSD_PT: state columns p per `state` block
PO = 64         # KP_SSD_PO: y columns p per `out` block
QMAX = 256      # KP_SSD_QMAX: the largest chunk
PAD = 4         # KP_SSD_PAD: floats of padding per shared row
WARPS = THREADS // 32
GRID_Y_MAX = 65535  # CUDA's gridDim.y limit
ALIGN = 16          # bytes: the 16-byte vector loads
SHARED_OPT_IN_MAX = 227 * 1024  # dynamic shared memory a block may opt in to on sm_90
KERNELS = [(SOURCE, "kp_ssd_cb"), (SOURCE, "kp_ssd_state"), (SOURCE, "kp_ssd_out")]

# shared memory, f32 (mirrors the kernels' layouts)
CB_SHARED = 4 * 2 * SB * (NP + PAD)                     # C rows and B rows
STATE_STATIC_SHARED = 4 * (SB * (PT + PAD) + SB * (NP + PAD) + 3 * QMAX + WARPS)
OUT_SHARED = 4 * (SB * (NP + PAD) + NP * (PO + PAD) + SB * (PO + PAD) + SB * (SB + PAD)
                  + 2 * QMAX + WARPS)


def n_chunks(dims, params) -> int:
    return -(-dims["tokens"] // params["chunk"])


def padded_p(dim_p: int) -> int:
    """The workspace states' row length: P rounded up to 4 (float4 stores)."""
    return -(-dim_p // 4) * 4


def _capped(blocks: int) -> int:
    return max(1, min(blocks, GRID_Y_MAX))


def _derived(dims, params) -> dict:
    return {"n_chunks": n_chunks(dims, params), "row_blocks": -(-dims["tokens"] // SB),
            "p_pad": padded_p(dims["dim_p"])}


def _cb_geometry(dims, params):
    d = _derived(dims, params)
    grid = (max(1, d["row_blocks"]), _capped(dims["batch"] * dims["groups"]), 1)
    return d, Launch(grid=grid, block=(THREADS, 1, 1), shared_bytes=CB_SHARED, extra=d)


def _state_geometry(dims, params):
    d = _derived(dims, params)
    grid = (-(-dims["dim_p"] // PT), _capped(dims["batch"] * dims["heads"]), 1)
    return d, Launch(grid=grid, block=(THREADS, 1, 1), extra=d)


def _out_geometry(dims, params):
    d = _derived(dims, params)
    blocks = dims["batch"] * dims["heads"] * -(-dims["dim_p"] // PO)
    grid = (max(1, d["row_blocks"]), _capped(blocks), 1)
    return d, Launch(grid=grid, block=(THREADS, 1, 1), shared_bytes=OUT_SHARED, extra=d)


CHUNK = Invariant(
    name=f"chunk in {tuple(CHUNKS)}", holds=lambda ns: ns["chunk"] in CHUNKS,
    why=f"the kernels take a chunk in sub-blocks of {SB} tokens and give each token of a chunk "
        f"a thread ({THREADS}) for its dt and the chunk's cumsum",
    fix=lambda ns: "chunk = " + ", ".join(map(str, CHUNKS)), violation={"chunk": 32},
    shows=("chunk",))
DIM_N = Invariant(
    name=f"dim_n <= {NP}", holds=lambda ns: ns["dim_n"] <= NP,
    why=f"every tile holds N padded to {NP} (shared memory rows of C and B, the state's "
        f"{NP} columns in registers of 32 threads x 4)",
    fix=lambda ns: f"dim_n <= {NP} (Mamba-2's 128), or torch:ssd_chunked",
    violation={"dim_n": NP + 8}, shows=("dim_n",))

LAUNCHES = {"cb": Contract(invariants=(CHUNK, DIM_N), geometry=_cb_geometry),
            "state": Contract(geometry=_state_geometry),
            "out": Contract(geometry=_out_geometry)}


# --- launch ------------------------------------------------------------------------------------

_WORKSPACE: dict[tuple, dict] = {}


def workspace(case) -> dict:
    """The f32 states before each chunk [B, NT, H, N, PP] and C·Bᵀ [B, NT, G, Q, Q], kept per
    shape (module docstring)."""
    import cupy

    d, q = case.dims, case.params["chunk"]
    nt, pp = n_chunks(d, case.params), padded_p(d["dim_p"])
    key = (cupy.cuda.Device().id, d["batch"], nt, q, d["heads"], d["groups"], d["dim_n"], pp)
    if key not in _WORKSPACE:
        _WORKSPACE[key] = {
            "states": cupy.empty((d["batch"], nt, d["heads"], d["dim_n"], pp), cupy.float32),
            "cb": cupy.empty((d["batch"], nt, d["groups"], q, q), cupy.float32)}
    return _WORKSPACE[key]


def _aligned(arrays: dict) -> None:
    for name, a in arrays.items():
        if a.size and a.data.ptr % ALIGN:
            raise ValueError(f"{name} is not {ALIGN}-byte aligned: the kernels read 16-byte "
                             "vectors; pass a whole (CuPy-allocated) array")


def args_of(launch_name: str, inputs: dict, outputs: dict, ws: dict, case) -> tuple:
    """The arguments of the launch's kernel, in the order of its parameters."""
    d, p = case.dims, case.params
    nt = np.int32(n_chunks(d, p))
    lo, hi = dt_limits(case)
    limits = (np.float32(lo), np.float32(np.inf if hi is None else hi))
    ints = lambda *names: tuple(np.int32(d[n]) for n in names)  # noqa: E731
    if launch_name == "cb":
        return (inputs["Bm"], inputs["Cm"], ws["cb"], *ints("batch", "tokens", "groups", "dim_n"),
                np.int32(p["chunk"]), nt)
    if launch_name == "state":
        return (inputs["x"], inputs["dt_raw"], inputs["A_log"], inputs["dt_bias"], inputs["Bm"],
                inputs["h0"], ws["states"], outputs["state"],
                *ints("batch", "tokens", "heads", "dim_p", "groups", "dim_n"),
                np.int32(p["chunk"]), nt, *limits)
    return (inputs["x"], inputs["dt_raw"], inputs["A_log"], inputs["dt_bias"], inputs["Cm"],
            inputs["D"], inputs["z"], ws["states"], ws["cb"], outputs["y"],
            *ints("batch", "tokens", "heads", "dim_p", "groups", "dim_n"),
            np.int32(p["chunk"]), nt, np.int32(bool(p["gate"])), *limits)


KERNEL_OF = {"cb": "kp_ssd_cb", "state": "kp_ssd_state", "out": "kp_ssd_out"}


def _chunked(defines: tuple = ()):
    """The run function of `cuda:kp_ssd_chunked` (with `defines`: a mutant's): cb, state, out."""
    def run(launch, inputs, outputs, case):
        _aligned({n: inputs[n] for n in ("x", "Bm", "Cm")})
        ws = workspace(case)
        for name in ("cb", "state", "out"):
            k = kernel(SOURCE, KERNEL_OF[name], case.dtype, defines)
            cuda_launch(k, launch[name].grid, launch[name].block,
                        args_of(name, inputs, outputs, ws, case),
                        shared_bytes=launch[name].shared_bytes)
    return run


def _declared(case) -> Numerics:
    """kp_ssd_chunked.cu's three dots, each one FMA chain from 0 in index order: C·B over n
    (`cb` kernel), C·S over n for Y_off (`mac_rows`, k then kk in order), the chunk's state
    x^T (B w) over its tokens s (across the 64-token sub-blocks). Its cumsum (a warp scan) and
    y's sum (a chain started at Y_off) stay undeclared."""
    over_n = plan({"n": NP}, ("n", "fma"))  # rows padded to NP with zeros: absent terms
    return Numerics(form="kernel", sums=(
        ("cb", over_n), ("c_state", over_n),
        ("chunk_state", plan({"s": case.params["chunk"]}, ("s", "fma")))))


register(
    cuda_impl("kp_ssd_chunked", "ssd_chunked", NO_CONTRACT, _chunked, numerics=_declared,
              doc="kparity chunked SSD: C·Bᵀ per group and chunk, the chunk states passed "
              "sequentially per (head, 32 columns p), then y per (64 rows, head, 64 columns p); "
              "f32 CUDA-core FMAs throughout", launches=LAUNCHES),
)
