"""MoE routing and dispatch on CUDA (issue 31; `oracle/moe_route.py`): kparity's own kernels,
all in `kernels/moe_route.cu` (its header comment is the design), all on the device (no host
synchronisation: a step's routing can be captured in a CUDA graph) and deterministic (no atomics:
the same bits on every run).

* `cuda:kp_moe_router` (op `moe_router`): a warp per token, 4 tokens a block; the selection keys
  in shared memory (4 E words a block), the top k as k rounds of a warp argmax over (score, id)
  (ties to the smaller id, NaN below -inf), every scoring: softmax_topk / softmax (chosen by the
  logit, weighted by the f32 softmax), sigmoid_bias (chosen by sigmoid + bias, group-limited
  with groups / topk_group, weighted by the sigmoid), norm_topk_prob, routed_scaling_factor.
  Contract: k <= 32, E <= 1024, groups <= 32.
* `cuda:kp_moe_dispatch` (op `moe_dispatch`): the counting sort in one launch, a block per
  expert: counts, offsets (each block counts the ids below its own), the stable perm and its
  inverse (ballot ranks over the slots in order). No invariant.
* `cuda:kp_moe_permute`, `cuda:kp_moe_unpermute`: a block per row (sorted slot, token), its 128
  threads over the row's 16-byte chunks: the gather as raw bits; the combine in f32, each
  product one rounding, summed in j order, rounded once. No invariant.
* `cuda:kp_moe_scatter_add`: two launches: the inverse of perm into a workspace (a thread per
  sorted row), then the combine per token in the op's declared order (its k products in the
  order of their sorted positions, from 0). Contract: k <= 32.

Row kernels load and store 16-byte vectors where H is a multiple of the vector (8 in f16 / bf16,
4 in f32) and every pointer is 16-byte aligned, else element by element (any H). Sizes: any
n = T k the ops' i32 positions hold (n < 2^31: the kernels' 32-bit slot indices and loop
counters hold it; element offsets are 64-bit).

Test-only mutant (tests/mutants.py MOE_ROUTE_CUDA_MUTANTS): KPARITY_MUTANT_ATOMIC_SCATTER_ADD,
the scatter-add as an atomic scatter into a zeroed f32 accumulator (the wrapper allocates and
zeroes it only for that define), then one store: within the bound, not bit-identical run to run.
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import NO_CONTRACT, Contract, Invariant, Launch
from gpu_impls.cuda._module import cuda_impl, kernel, launch as cuda_launch
from oracle.moe_route import HF_EPS

SOURCE = "moe_route.cu"
ROUTER_WARPS = 4            # KP_ROUTER_WARPS: tokens a router block
ROUTER_THREADS = 32 * ROUTER_WARPS
MAX_K = 32                  # KP_ROUTER_MAX_K: a lane per id (router), the first warp ranks
MAX_E = 1024                # KP_ROUTER_MAX_E: 16 KiB of shared keys a router block
MAX_GROUPS = 32             # a lane per group
DISPATCH_THREADS = 256      # KP_DISPATCH_WARPS * 32
ROW_THREADS = 128           # KP_ROW_THREADS: a block per row, a 16-byte chunk at a time
INVERSE_THREADS = 256       # KP_INVERSE_THREADS
ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
ATOMIC_MUTANT = "KPARITY_MUTANT_ATOMIC_SCATTER_ADD"
NULL = np.int64(0)          # a null pointer argument
KERNELS = [(SOURCE, name) for name in ("kp_moe_router", "kp_moe_dispatch", "kp_moe_permute",
                                       "kp_moe_unpermute", "kp_moe_scatter_inverse",
                                       "kp_moe_scatter_add")]


def _aligned(*arrays) -> bool:
    """Every array starts on a 16-byte boundary (a vector load's requirement)."""
    return all(a.data.ptr % 16 == 0 for a in arrays)


_WORKSPACE: dict = {}


def _workspace(name: str, count: int, dtype):
    """`count` elements of `dtype` from a device buffer kept across calls (allocated on a
    case's first call, a warm-up: never inside a graph capture)."""
    import cupy

    key = (cupy.cuda.Device().id, name)
    nbytes = max(1, count) * np.dtype(dtype).itemsize
    buf = _WORKSPACE.get(key)
    if buf is None or buf.nbytes < nbytes:
        buf = _WORKSPACE[key] = cupy.empty(nbytes, dtype=cupy.uint8)
    return buf[:nbytes].view(dtype)


# --- invariants ---------------------------------------------------------------------------------

def _top_k_max(why: str, alternative: str, violation: dict) -> Invariant:
    return Invariant(
        name=f"top_k <= {MAX_K}", holds=lambda ns: ns["top_k"] <= MAX_K, why=why,
        fix=lambda ns: f"top_k <= {MAX_K}, or {alternative}", violation=violation,
        shows=("top_k",))


ROUTER_TOP_K = _top_k_max(f"lane j of the token's warp holds the j-th chosen expert ({MAX_K} "
                          "lanes)", "torch:moe_router", {"experts": 64, "top_k": 33})
SCATTER_TOP_K = _top_k_max(f"the block's first {MAX_K} threads rank the token's k sorted "
                           "positions (one each, in shared memory)", "torch:moe_scatter_add",
                           {"top_k": 33})
EXPERTS_MAX = Invariant(
    name=f"experts <= {MAX_E}", holds=lambda ns: ns["experts"] <= MAX_E,
    why=f"a token's selection keys live in shared memory: {ROUTER_WARPS} tokens x E x 4 bytes a "
        f"block ({ROUTER_WARPS * MAX_E * 4 // 1024} KiB at {MAX_E})",
    fix=lambda ns: f"experts <= {MAX_E}, or torch:moe_router", violation={"experts": 1056},
    shows=("experts",))
GROUPS_MAX = Invariant(
    name=f"groups <= {MAX_GROUPS}", holds=lambda ns: ns["groups"] <= MAX_GROUPS,
    why=f"lane g of the token's warp scores group g ({MAX_GROUPS} lanes)",
    fix=lambda ns: f"groups <= {MAX_GROUPS} (DeepSeek-V3: 8), or torch:moe_router",
    violation={"experts": 128, "groups": 64, "scoring": "sigmoid_bias", "topk_group": 4},
    shows=("groups",))

# --- cuda:kp_moe_router ---------------------------------------------------------------------------

def _router_geometry(dims, params):
    blocks = -(-dims["tokens"] // ROUTER_WARPS)
    return {}, Launch(grid=(max(1, blocks), 1, 1), block=(ROUTER_THREADS, 1, 1),
                      shared_bytes=4 * ROUTER_WARPS * dims["experts"])


ROUTER_CONTRACT = Contract(invariants=(ROUTER_TOP_K, EXPERTS_MAX, GROUPS_MAX),
                           geometry=_router_geometry)


def _router(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, p = case.dims, case.params
        sigmoid = p["scoring"] == "sigmoid_bias"
        args = (inputs["logits"], inputs["correction_bias"], outputs["ids"], outputs["weights"],
                np.int32(d["tokens"]), np.int32(d["experts"]), np.int32(d["top_k"]),
                np.int32(d["groups"]), np.int32(p["topk_group"]), np.int32(sigmoid),
                np.int32(bool(p["norm_topk_prob"])), np.float32(p["routed_scaling_factor"]),
                np.float32(HF_EPS if sigmoid else 0.0))
        k = kernel(SOURCE, "kp_moe_router", case.dtype, defines)
        cuda_launch(k, launch.grid, launch.block, args, shared_bytes=launch.shared_bytes)
    return run


# --- cuda:kp_moe_dispatch -----------------------------------------------------------------------

def _dispatch_geometry(dims, params):
    return {}, Launch(grid=(dims["experts"], 1, 1), block=(DISPATCH_THREADS, 1, 1))


# No invariant: any E (a block each), any n = T k the i32 outputs hold.
DISPATCH_CONTRACT = Contract(geometry=_dispatch_geometry)


def _dispatch(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d = case.dims
        args = (inputs["ids"], outputs["counts"], outputs["offsets"], outputs["perm"],
                outputs["inv_perm"], np.int32(d["tokens"] * d["top_k"]), np.int32(d["experts"]))
        cuda_launch(kernel(SOURCE, "kp_moe_dispatch", case.dtype, defines), launch.grid,
                    launch.block, args)
    return run


# --- the row kernels: permute, unpermute, scatter-add -------------------------------------------

def _row_geometry(rows: str):
    """A block per row: the sorted slots (`rows` "slots": T k) or the tokens ("tokens"); its
    threads take the row's 16-byte chunks in turn."""
    def geometry(dims, params):
        vec = 16 // ELEMENT_BYTES[params["dtype"]]
        n = dims["tokens"] * (dims["top_k"] if rows == "slots" else 1)
        derived = {"vec": vec, "chunks": -(-dims["hidden"] // vec)}
        return derived, Launch(grid=(max(1, n), 1, 1), block=(ROW_THREADS, 1, 1), extra=derived)
    return geometry


def _row_args(case, e, *arrays) -> tuple:
    """tokens, top_k, hidden, chunks and the vector flag (H a multiple of the vector and every
    row pointer aligned), as the row kernels take them."""
    d = case.dims
    vec = d["hidden"] % e["vec"] == 0 and _aligned(*arrays)
    return (np.int32(d["tokens"]), np.int32(d["top_k"]), np.int32(d["hidden"]),
            np.int32(e["chunks"]), np.int32(vec))


# No invariant: any row count the i32 positions hold (grid.x), any H (the threads loop).
PERMUTE_CONTRACT = Contract(geometry=_row_geometry("slots"))
UNPERMUTE_CONTRACT = Contract(geometry=_row_geometry("tokens"))


def _permute(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        x, out = inputs["x"], outputs["x_sorted"]
        args = (x, inputs["perm"], out, *_row_args(case, launch.extra, x, out))
        cuda_launch(kernel(SOURCE, "kp_moe_permute", case.dtype, defines), launch.grid,
                    launch.block, args)
    return run


def _unpermute(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        y, out = inputs["y_sorted"], outputs["out"]
        args = (y, inputs["weights"], inputs["inv_perm"], out,
                *_row_args(case, launch.extra, y, out))
        cuda_launch(kernel(SOURCE, "kp_moe_unpermute", case.dtype, defines), launch.grid,
                    launch.block, args)
    return run


def _inverse_geometry(dims, params):
    blocks = -(-dims["tokens"] * dims["top_k"] // INVERSE_THREADS)
    return {}, Launch(grid=(max(1, blocks), 1, 1), block=(INVERSE_THREADS, 1, 1))


SCATTER_LAUNCHES = {
    "inverse": Contract(geometry=_inverse_geometry),
    "combine": Contract(invariants=(SCATTER_TOP_K,), geometry=_row_geometry("tokens")),
}


def _scatter_add(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d = case.dims
        n = d["tokens"] * d["top_k"]
        y, w, out = inputs["y_sorted"], inputs["weights"], outputs["out"]
        inv = _workspace("inv", n, np.int32)
        acc = NULL
        if ATOMIC_MUTANT in defines:  # the mutant's accumulator, zeroed on every call
            acc = _workspace("acc", d["tokens"] * d["hidden"], np.float32)
            acc.fill(0)
        first, second = launch["inverse"], launch["combine"]
        cuda_launch(kernel(SOURCE, "kp_moe_scatter_inverse", case.dtype, defines), first.grid,
                    first.block, (inputs["perm"], y, w, inv, acc, np.int32(n),
                                  np.int32(d["top_k"]), np.int32(d["hidden"])))
        cuda_launch(kernel(SOURCE, "kp_moe_scatter_add", case.dtype, defines), second.grid,
                    second.block, (y, w, inv, acc, out,
                                   *_row_args(case, second.extra, y, out)))
    return run


register(
    cuda_impl("kp_moe_router", "moe_router", ROUTER_CONTRACT, _router,
              "kparity MoE router: a warp per token, selection keys in shared memory, top-k as "
              "k warp argmax rounds (ties to the smaller id, NaN last); softmax or sigmoid + "
              "bias with group-limited selection, renormalised, scaled, f32"),
    cuda_impl("kp_moe_dispatch", "moe_dispatch", DISPATCH_CONTRACT, _dispatch,
              "kparity counting sort in one launch, a block per expert: counts, offsets, the "
              "stable perm and its inverse by ballot ranks; no atomics, no host sync"),
    cuda_impl("kp_moe_permute", "moe_permute", PERMUTE_CONTRACT, _permute,
              "kparity gather of each sorted slot's token row: raw bits, 16-byte chunks"),
    cuda_impl("kp_moe_unpermute", "moe_unpermute", UNPERMUTE_CONTRACT, _unpermute,
              "kparity weighted combine per token: f32 products summed in j order, rounded once"),
    cuda_impl("kp_moe_scatter_add", "moe_scatter_add", NO_CONTRACT, _scatter_add,
              "kparity deterministic scatter-add: perm's inverse into a workspace, then per "
              "token its k products added in sorted-position order from 0, rounded once",
              launches=SCATTER_LAUNCHES),
)
