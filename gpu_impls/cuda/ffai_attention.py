"""FFAI's decode attention on CUDA: the seed kernels (metaltile-std `src/ffai/sdpa_decode*.rs`,
`sdpa_decode_2pass.rs`; `docs/seed_kernels.md`) ported to `kernels/ffai_sdpa_decode.cu` and
`kernels/ffai_sdpa_decode_2pass.cu` (shared pieces in `kernels/ffai_attention.cuh`), batched (the
seeds take one sequence: the batch is grid.y or grid.z, each sequence with its own length,
kv_stride = max_len), for the ops `sdpa_decode` (contiguous cache) and `attn_combine`
(`oracle/attention.py`).

| impl                            | op           | what                                          |
|---------------------------------|--------------|-----------------------------------------------|
| cuda:ffai_sdpa_decode           | sdpa_decode  | single pass, head_dim 128: one 1024-thread    |
| cuda:ffai_sdpa_decode_d64/_d96/ |              | block per (query head, sequence), 32 warps    |
|   _d256                         |              | walking the keys, online softmax in f32, the  |
|                                 |              | warps combined in shared memory               |
| cuda:sdpa_decode_2pass          | sdpa_decode  | launches "pass1" (per kv head and split: the  |
|                                 |              | unnormalised partials, o in T) and "pass2"    |
|                                 |              | (per query head: the max-rescaled combine)    |
| cuda:sdpa_decode_2pass_pass2    | attn_combine | pass 2 alone (normalized=0 partials in T)     |

What the ports keep from the seeds: TPG = 1024 for the single pass and pass 2, pass 1's block
(32, Hq / Hkv) over grid (Hkv, blocks), split j taking keys i ≡ j (mod blocks), partial_o in T
with m and l in f32, pass 2 reading the partials in groups of 32, GQA kv_head = h / (Hq / Hkv),
an f32 online softmax, the learned sink as an extra denominator term e^(sink − M) with no value,
visibility [0, sink_end) ∪ [window_start, n). What they add: the batch; a sink logit per query
head (the op's `sinks` [Hq]; the seed takes one constexpr `sink_logit`), entering once, at the
final combine; window_start = max(n − window, 0) per sequence with the sink tokens clipped to it
(the seed's host rule window_start >= sink_end then holds by construction for every length, so
it is no contract; the op allows window < sink_end: the union); pass 2 also writes the LSE that
`attn_combine` asks for. Not ported: the seed's head_dim 512 variant (the op's head sizes stop at
256).

Block count (the two-pass pair). The seed's `recommended_blocks_m5_max`: 64 unless n_kv > 1024
and n_simds > 4, then <= 8192 keys: 128, <= 32768: 256, <= 65536: 512, else 1024. n_simds > 4
is an Apple GPU size test; every GPU this port targets (H100/H200, 132 SMs) passes it, so only
the n_kv branches remain, over the keys a sequence can attend (max_len, or window + sink_end
with a window). The op's param `splits` (0 by default) pins the count instead: that is how a
case reaches a count the heuristic never gives, and so how the contract's `blocks % 32 == 0`
gets its rejected case (splits=48: pass 2 would silently drop partials 32..47).

Contracts (each invariant with its violating case, `cases/generate.py`):

    single pass    head_dim == 64 | 96 | 128 | 256 (one per impl; the fix names the variant
                   of the case's head_dim), heads % kv_heads == 0
    pass1          head_dim in (64, 96, 128, 256), heads % kv_heads == 0, heads / kv_heads
                   <= 32 (a block of 32 x G threads), probs == 'T' (below), 1 <= blocks
                   <= 65535 (grid.y)
    pass2          blocks % 32 == 0
    attn_combine   head_dim in (64, 96, 128, 256), splits % 32 == 0, normalized == 0 (FFAI's
                   partial_o is unnormalised), the partials' dtype == T (partial_o in T)

`probs`: the single pass multiplies P·V in f32 and rounds once, at the store, so it meets both
values of the op's param (probs='T' is the looser bound; the bench cases use it); it has no
invariant on it. The two-pass pair stores each split's unnormalised P·V in T: a T rounding on
the P·V path, which the op's probs='T' bound charges (`oracle/attention.py`: relative u_T per
weight, and the partials' subnormal part, u_T tiny_T, on the output): it runs probs='T' cases
only (in f32 the rounding is a no-op, but the invariant stays strict, as torch:sdpa's, so that
it has a violating case).

Numerics. Single pass: a key's weight is rescaled at most ceil(count / 32) − 1 times inside its
warp (each warp takes every 32nd attended key) and once in the warps' combine, where the sink
enters too: ceil(count / 32) in all, within `softmax_block=32`'s ceil(n / 32) + 1. Two-pass: at
most ceil(count / blocks) − 1 inside its split and once in pass 2; blocks >= 32 for every valid
count, so `softmax_block=32` holds too. Sums: any order (the default): a lane's E = D / 32
products in sequence, then a butterfly over the warp. Both are deterministic and batch
invariant (a block sees only its own sequence, in fixed orders).

Scratch: the two-pass pair's partials live in device buffers kept across calls (grown, never
shrunk), allocated on a first call outside any graph capture (the timer runs every call once
before capturing); a buffer taken from CuPy's pool inside a capture would be freed back to it
while the graph still writes there.
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import NO_CONTRACT, Contract, Invariant, Launch, nearest_multiples, \
    param_is
from gpu_impls.cuda._module import cuda_impl, kernel
from gpu_impls.torch.attention import GQA, HEAD_DIM
from oracle.attention import HEAD_DIMS, keys_read, scale_of
from oracle.numerics import Numerics

SINGLE = "ffai_sdpa_decode.cu"
TWO_PASS = "ffai_sdpa_decode_2pass.cu"
HEAD_DIM_ARGS = [(d,) for d in HEAD_DIMS]
KERNELS = [
    (SINGLE, "ffai_sdpa_decode", HEAD_DIM_ARGS),
    (TWO_PASS, "ffai_sdpa_2pass_pass1", HEAD_DIM_ARGS),
    (TWO_PASS, "ffai_sdpa_2pass_pass2", HEAD_DIM_ARGS),
]
TPG = 1024        # the seed's threads per block (single pass, pass 2): 32 warps
WARP = 32
GROUP_MAX = TPG // WARP  # pass 1: one warp per query head of a kv head's group
GRID_Y_MAX = 65535
VARIANTS = {128: "ffai_sdpa_decode", 64: "ffai_sdpa_decode_d64", 96: "ffai_sdpa_decode_d96",
            256: "ffai_sdpa_decode_d256"}
STORAGE = {"f32": np.float32, "f16": np.uint16, "bf16": np.uint16}
ONLINE_32 = Numerics(softmax_block=32)


# --- the seed's block count ---------------------------------------------------------------------

def recommended_blocks(keys: int) -> int:
    """`recommended_blocks_m5_max` with its n_simds > 4 test taken as true (module docstring)."""
    if keys <= 1024:
        return 64
    for limit, blocks in ((8192, 128), (32768, 256), (65536, 512)):
        if keys <= limit:
            return blocks
    return 1024


def block_count(dims, params) -> int:
    """The case's `splits` where it pins one, else the seed's count."""
    return int(params.get("splits", 0)) or recommended_blocks(keys_read(dims, params))


# --- contracts ---------------------------------------------------------------------------------

def _variant_fix(ns) -> str:
    d = ns["head_dim"]
    if d in VARIANTS:
        return f"cuda:{VARIANTS[d]} (the head_dim {d} variant)"
    return ("head_dim in (64, 96, 128, 256): cuda:ffai_sdpa_decode_d64, _d96, "
            "cuda:ffai_sdpa_decode (128), _d256")


def head_dim_is(dim: int) -> Invariant:
    """One single-pass variant's head size; its violation is another variant's."""
    return Invariant(
        name=f"head_dim == {dim}", holds=lambda ns: ns["head_dim"] == dim,
        why=f"this variant is compiled for head_dim {dim}: lane l holds elements [l*E, l*E + E) "
            f"of q, k, v and o, E = head_dim / 32 = {dim // WARP}",
        fix=_variant_fix, violation={"head_dim": 64 if dim != 64 else 128}, shows=("head_dim",))


GROUP_FITS = Invariant(
    name=f"heads / kv_heads <= {GROUP_MAX}",
    holds=lambda ns: ns["heads"] // ns["kv_heads"] <= GROUP_MAX,
    why=f"pass 1 runs one warp per query head of a kv head's group in one block of (32, heads / "
        f"kv_heads) threads, at most {TPG}",
    fix=lambda ns: f"kv_heads >= {-(-ns['heads'] // GROUP_MAX)} (a divisor of heads), or "
                   "cuda:ffai_sdpa_decode* (one block per query head)",
    violation={"heads": 64, "kv_heads": 1}, shows=("heads", "kv_heads"))
PROBS_T = Invariant(
    name="probs == 'T'", holds=lambda ns: ns["probs"] == "T",
    why="pass 1 stores each split's unnormalised P·V (partial_o) in T: a T rounding on the P·V "
        "path, which the probs='T' bound charges (a no-op in f32)",
    fix=lambda ns: "probs='T', or cuda:ffai_sdpa_decode* (P·V in f32, one rounding at the store)",
    violation={"probs": "f32"}, shows=("probs", "dtype"))
BLOCKS_FIT = Invariant(
    name=f"1 <= blocks <= {GRID_Y_MAX}", holds=lambda ns: 1 <= ns["blocks"] <= GRID_Y_MAX,
    why=f"the splits are pass 1's grid.y, at most {GRID_Y_MAX} blocks in CUDA",
    fix=lambda ns: f"splits = {nearest_multiples(ns['blocks'], WARP, WARP, GRID_Y_MAX)}, or 0 "
                   "(the seed's count)",
    violation={"splits": 65568}, shows=("splits", "blocks"))


def _blocks_32_fix(ns) -> str:
    near = nearest_multiples(ns["blocks"], WARP, WARP, GRID_Y_MAX)
    return f"splits = {near} (a multiple of 32), or 0 (the seed's count)"


BLOCKS_32 = Invariant(
    name="blocks % 32 == 0", holds=lambda ns: ns["blocks"] % WARP == 0,
    why="pass 2 reads the partials in whole groups of 32 (one per lane), blocks // 32 of them: "
        "the last blocks % 32 partials would be silently dropped",
    fix=_blocks_32_fix, violation={"splits": 48}, shows=("splits", "blocks"))


def _single_geometry(dims, params):
    return {"tpg": TPG}, Launch(grid=(dims["heads"], dims["batch"], 1), block=(TPG, 1, 1))


def _pass1_geometry(dims, params):
    blocks = block_count(dims, params)
    group = dims["heads"] // dims["kv_heads"]
    return ({"blocks": blocks, "group": group},
            Launch(grid=(dims["kv_heads"], blocks, dims["batch"]), block=(WARP, group, 1),
                   extra={"blocks": blocks}))


def _pass2_geometry(dims, params):
    return {"tpg": TPG}, Launch(grid=(dims["heads"], dims["batch"], 1), block=(TPG, 1, 1),
                                extra={"blocks": params["blocks"]})


def single_contract(dim: int) -> Contract:
    return Contract(invariants=(head_dim_is(dim), GQA), geometry=_single_geometry)


TWO_PASS_LAUNCHES = {
    "pass1": Contract(invariants=(HEAD_DIM, GQA, GROUP_FITS, PROBS_T, BLOCKS_FIT),
                      geometry=_pass1_geometry),
    "pass2": Contract(invariants=(BLOCKS_32,), geometry=_pass2_geometry),
}


def _combine_geometry(dims, params):
    return ({"tpg": TPG, "blocks": dims["splits"]},
            Launch(grid=(dims["heads"], dims["batch"], 1), block=(TPG, 1, 1)))


PARTIALS_IN_T = Invariant(
    name="partial dtype == dtype", holds=lambda ns: ns["dtypes"]["partial"] == ns["dtype"],
    why="FFAI's pass 2 reads partial_o in T, the output's dtype (pass 1 stores it so)",
    fix=lambda ns: f"dtypes={{'partial': {ns['dtype']!r}}}, or torch:attn_combine / "
                   "mlx:attn_combine (any partial dtype)",
    violation={"dtypes": {"partial": "bf16"}}, shows=("dtype", "dtypes"))
COMBINE_CONTRACT = Contract(
    invariants=(
        HEAD_DIM,
        Invariant(name="splits % 32 == 0", holds=lambda ns: ns["splits"] % WARP == 0,
                  why="pass 2 reads the partials in whole groups of 32 (one per lane): the last "
                      "splits % 32 would be silently dropped",
                  fix=lambda ns: "splits = " + nearest_multiples(ns["splits"], WARP, WARP),
                  violation={"splits": 48}, shows=("splits",)),
        param_is("normalized", 0, "torch:attn_combine or mlx:attn_combine for normalized=1 "
                                  "(FFAI's partial_o is unnormalised)", other=1),
        PARTIALS_IN_T),
    geometry=_combine_geometry)


# --- launch -------------------------------------------------------------------------------------

_SCRATCH: dict = {}


def scratch(name: str, count: int, dtype) -> object:
    """A device array of `count` elements of `dtype`, from a buffer kept across calls (module
    docstring: never allocated inside a graph capture after the first call of a case)."""
    import cupy

    nbytes = max(1, count * np.dtype(dtype).itemsize)
    buf = _SCRATCH.get(name)
    if buf is None or buf.nbytes < nbytes:
        buf = _SCRATCH[name] = cupy.empty(nbytes, dtype=cupy.uint8)
    return buf[:count * np.dtype(dtype).itemsize].view(dtype)


def _decode_args(inputs, case) -> tuple:
    return (inputs["q"], inputs["k"], inputs["v"], inputs["lengths"])


def _single(dim: int):
    def make(defines: tuple = ()):
        def run(launch, inputs, outputs, case):
            d, p = case.dims, case.params
            k = kernel(SINGLE, "ffai_sdpa_decode", case.dtype, defines, (dim,))
            k(launch.grid, launch.block,
              (*_decode_args(inputs, case), inputs["sinks"], outputs["out"],
               np.int32(d["heads"]), np.int32(d["kv_heads"]), np.int32(d["max_len"]),
               np.float32(scale_of(case)), np.int32(p["window"]), np.int32(p["sink_end"]),
               np.int32(p["sinks"])))
        return run
    return make


def _pass2(defines: tuple, dtype: str, dim: int, launch: Launch, partials: tuple, sinks,
           out, lse, heads: int, blocks: int, has_sink: int, empty_zero: int) -> None:
    k = kernel(TWO_PASS, "ffai_sdpa_2pass_pass2", dtype, defines, (dim,))
    k(launch.grid, launch.block, (*partials, sinks, out, lse, np.int32(heads), np.int32(blocks),
                                  np.int32(has_sink), np.int32(empty_zero)))


def _two_pass(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, p = case.dims, case.params
        first, second = launch["pass1"], launch["pass2"]
        blocks, dim = first.extra["blocks"], d["head_dim"]
        parts = d["batch"] * d["heads"] * blocks
        partials = (scratch("partial_o", parts * dim, STORAGE[case.dtype]),
                    scratch("partial_m", parts, np.float32),
                    scratch("partial_l", parts, np.float32))
        k = kernel(TWO_PASS, "ffai_sdpa_2pass_pass1", case.dtype, defines, (dim,))
        k(first.grid, first.block,
          (*_decode_args(inputs, case), *partials, np.int32(d["heads"]),
           np.int32(d["kv_heads"]), np.int32(d["max_len"]), np.int32(blocks),
           np.float32(scale_of(case)), np.int32(p["window"]), np.int32(p["sink_end"])))
        # every split empty (all scores -inf): 0 / 0 = NaN, sdpa_decode's IEEE rule; the LSE
        # goes to scratch (sdpa_decode has no such output)
        lse = scratch("lse", d["batch"] * d["heads"], np.float32)
        _pass2(defines, case.dtype, dim, second, partials, inputs["sinks"], outputs["out"], lse,
               d["heads"], blocks, p["sinks"], 0)
    return run


def _combine(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d = case.dims
        # every split empty, no sink: out 0, attn_combine's rule
        _pass2(defines, case.dtype, d["head_dim"], launch, (inputs["o"], inputs["m"], inputs["l"]),
               inputs["sinks"], outputs["out"], outputs["lse"], d["heads"], d["splits"],
               case.params["sinks"], 1)
    return run


register(
    *(cuda_impl(name, "sdpa_decode", single_contract(dim), _single(dim),
                f"FFAI single-pass decode, head_dim {dim}: 1024 threads per (query head, "
                "sequence), 32 warps each an f32 online softmax over every 32nd key, combined "
                "in shared memory; sinks, window, GQA", numerics=ONLINE_32, batch_invariant=True)
      for dim, name in VARIANTS.items()),
    cuda_impl("sdpa_decode_2pass", "sdpa_decode", NO_CONTRACT, _two_pass,
              "FFAI two-pass decode: pass 1 per (kv head, split) writes unnormalised partials "
              "(o in T, m and l f32), pass 2 per query head combines them with the max rescale "
              "and the sink; splits from the seed's heuristic (or param splits), a multiple of 32",
              launches=TWO_PASS_LAUNCHES, numerics=ONLINE_32, batch_invariant=True),
    cuda_impl("sdpa_decode_2pass_pass2", "attn_combine", COMBINE_CONTRACT, _combine,
              "FFAI two-pass decode's pass 2 alone: unnormalised partials in T, 32 per warp, "
              "max rescale, sink once; writes the LSE too", batch_invariant=True),
)
