"""kparity's split-KV decode attention on CUDA (`kernels/kp_sdpa_decode.cu`): `sdpa_decode` and
`sdpa_decode_paged` (`oracle/attention.py`), and its second pass alone as `attn_combine`.

Pass 1, `kp_sdpa_decode_split<T, D, G>`: one block of 128 threads per (G query heads of one kv
head, split, sequence). A key row is read once per block and used by its G heads (GQA): G = 1,
2 or 4 (g = Hq / Hkv rounded up to the next of them; g > 4 in chunks of 4, the chunks of one
split side by side in grid.x so that they share the rows in L2). The block stages tiles of keys
(K and V rows) in shared memory with cp.async, a ring of up to 4 tiles in 64 KiB (`ring_bytes`),
so that 3 tiles are in flight while one is computed. Each run of LPK lanes takes a key row, 16
elements a lane (D / 16 lanes, rounded up to a power of two), U = 2 keys of each tile, with one
online-softmax max update per tile. Key groups merge by warp butterfly, warps through shared
memory. One split writes `out` directly (the sink joins the denominator there); several write
f32 partials (acc, m, l) for pass 2, `kp_attn_combine<T>` (one block per (sequence, head)).

Split count (from B, Hkv, the head chunks, the keys and the SM count, `split_count`): blocks =
B·Hkv·chunks·splits should fill whole waves of `RESIDENT` blocks per SM (232 registers a thread
at 128 threads and 72 KiB of shared memory: 2 blocks an SM). The smallest split count whose last wave is at least
`WAVE_FILL` full wins, else the best-filled; each split keeps at least `MIN_KEYS` keys. So
Llama-3.1-8B (8 kv heads) at B=1 takes 30 splits on 132 SMs, at B=32 one (256 blocks: no pass
2). The SM count is the device's where CuPy sees one, else `DEFAULT_SMS` (an H100 SXM): the
contract tests run without a GPU.

Numerics (`oracle.numerics.Numerics`): scores as dot(q·scale, k_t), q scaled in f32 first (the
form "scaled_q"), the dot's order declared (`score_order`); the softmax sums in any order;
expf (CUDA's, 2 ULP; CuPy adds -ftz, not fast math), one divide at the end. Rescales: a term's weight is rescaled only when a container it is
in (a key group's step, a group, a warp, a split) meets one with a higher max, once per other
run of U keys at most, and the split combine once: at most ceil(n / U) + 1 = `rescales(n)` with
softmax_block = U.

Contracts: heads % kv_heads == 0, head_dim in 64/96/128/256 (the instances), and 16-byte
aligned q, k, v (checked at run). Any page size works (a key's page is page_table[b, t // P]).
Not batch invariant: the split count follows the batch. A case's param `splits` (0: derived)
fixes the count.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from gpu_impls import register
from gpu_impls.contract import NO_CONTRACT, Contract, Invariant, Launch
from gpu_impls.cuda._module import cuda_impl, kernel, launch as cuda_launch
from gpu_impls.torch.attention import GQA, HEAD_DIM
from oracle.attention import HEAD_DIMS, keys_read, scale_of
from oracle.numerics import SEQUENTIAL, Numerics, plan

SOURCE = "kp_sdpa_decode.cu"
U = 2             # keys per key group per step (KP_U in the .cu)
WARPS = 4         # KP_WARPS: pass 1's warps a block (a knob: `decode_impl(warps=)`)
THREADS = 128     # the combine's block (and pass 1's at WARPS)
EPL = 16          # elements of a key row per lane (KP_EPL)
STAGE_BUDGET = 65536  # bytes of shared memory for pass 1's tile ring (KP_STAGE_BUDGET)
GROUP_SIZES = (1, 2, 4)  # G: query heads per block
# blocks an SM holds per EPL (ptxas -v, sm_90, G = 4): 232 registers a thread at 16 elements a
# lane, 127 at 8 (and 72 or 40 KiB of shared memory a block)
RESIDENT = {16: 2, 8: 4}
WAVE_FILL = 0.9
MIN_KEYS = 64     # keys a split takes at least
MAX_SPLITS = 256
DEFAULT_SMS = 132
ALIGN = 16
KERNELS = [(SOURCE, "kp_sdpa_decode_split", tuple((d, g) for d in HEAD_DIMS
                                                   for g in GROUP_SIZES)),
           (SOURCE, "kp_attn_combine")]
# kp_attn_combine: thread 0 adds the splits' weights from 0 in split order, the sink last; each
# column's output adds the splits' weighted partials from 0 in split order (kp_sdpa_decode.cu)
COMBINE_NUMERICS = Numerics(SEQUENTIAL, softmax_block=U)


@functools.lru_cache(maxsize=None)
def sm_count() -> int:
    """The current device's SM count, or DEFAULT_SMS where there is none (CPU contract tests)."""
    try:
        import cupy

        return int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    except Exception:  # no CuPy or no device: the geometry is still derived, for H100
        return DEFAULT_SMS


def group_size(g: int) -> int:
    return next(s for s in GROUP_SIZES if s >= g) if g <= GROUP_SIZES[-1] else GROUP_SIZES[-1]


def split_count(base_blocks: int, keys: int, sms: int, resident: int = 2) -> int:
    """Splits per (sequence, kv head, chunk): see the module docstring."""
    wave = sms * resident
    most = max(1, min(MAX_SPLITS, keys // MIN_KEYS))
    best, best_fill = 1, 0.0
    for s in range(1, most + 1):
        blocks = base_blocks * s
        fill = blocks / (math.ceil(blocks / wave) * wave)
        if fill >= WAVE_FILL:
            return s
        if fill > best_fill:
            best, best_fill = s, fill
    return best


def _geometry(dims, params, splits: int | None = None, epl: int = EPL, warps: int = WARPS):
    g = dims["heads"] // max(1, dims["kv_heads"])
    G = group_size(g)
    chunks = -(-g // G)
    base = dims["batch"] * dims["kv_heads"] * chunks
    keys = keys_read(dims, params)
    sms = sm_count()
    resident = max(1, RESIDENT[epl] * WARPS // warps)  # the register file is the limit
    count = splits or params.get("splits") or split_count(base, keys, sms, resident)
    derived = {"group": G, "chunks": chunks, "splits": count, "sms": sms, "epl": epl,
               "warps": warps}
    return derived, Launch(grid=(chunks, count, dims["batch"] * dims["kv_heads"]),
                           block=(32 * warps, 1, 1),
                           shared_bytes=ring_bytes(dims["head_dim"], params["dtype"], epl,
                                                   warps),
                           extra=derived)


def ring_bytes(head_dim: int, dtype: str, epl: int = EPL, warps: int = WARPS) -> int:
    """Pass 1's dynamic shared memory: its ring of tiles (`Shape` in the .cu, mirrored)."""
    lanes = 1 << max(0, (-(-head_dim // epl) - 1).bit_length())  # next power of two
    tile = (32 * warps // lanes) * U
    stage = 2 * tile * head_dim * (4 if dtype == "f32" else 2)
    return min(4, max(2, STAGE_BUDGET // stage)) * stage


def _combine_geometry(dims, params):
    return {}, Launch(grid=(dims["batch"] * dims["heads"], 1, 1), block=(THREADS, 1, 1))


# --- launch ------------------------------------------------------------------------------------

_WORKSPACE: dict[tuple, tuple] = {}


def _workspace(rows: int, splits: int, dim: int):
    """Pass 1's f32 partials (o [rows, S, D], m, l [rows, S]), kept per shape: allocated once,
    outside any timed region or graph capture (the first call is a warm-up)."""
    import cupy

    key = (cupy.cuda.Device().id, rows, splits, dim)
    if key not in _WORKSPACE:
        _WORKSPACE[key] = (cupy.empty(rows * splits * dim, cupy.float32),
                           cupy.empty(rows * splits, cupy.float32),
                           cupy.empty(rows * splits, cupy.float32))
    return _WORKSPACE[key]


NULL = np.int64(0)  # a null pointer argument


def _aligned(inputs, names):
    for name in names:
        if inputs[name].data.ptr % ALIGN:
            raise ValueError(f"{name} is not {ALIGN}-byte aligned: the kernel reads 16-byte "
                             "vectors")


def _decode_launcher(defines: tuple = (), pdl: bool = True):
    def run(launch, inputs, outputs, case):
        d, p = case.dims, case.params
        paged = "k_pages" in inputs
        k, v = (inputs["k_pages"], inputs["v_pages"]) if paged else (inputs["k"], inputs["v"])
        _aligned(inputs, ("q", "k_pages", "v_pages") if paged else ("q", "k", "v"))
        e = launch["split"].extra
        splits, rows, dim = e["splits"], d["batch"] * d["heads"], d["head_dim"]
        part = _workspace(rows, splits, dim) if splits > 1 else (NULL, NULL, NULL)
        sinks = inputs["sinks"] if p["sinks"] else NULL
        table = inputs["page_table"] if paged else NULL
        args = (inputs["q"], k, v, inputs["lengths"], table, sinks, outputs["out"], *part,
                np.float32(scale_of(case)), np.int32(d["heads"]), np.int32(d["kv_heads"]),
                np.int32(d.get("max_len", 0)), np.int32(d.get("page_size", 0)),
                np.int32(d.get("max_pages", 0)), np.int32(p["window"]),
                np.int32(p["sink_end"]), np.int32(splits))
        knobs = ((() if e["epl"] == EPL else (f"KP_EPL={e['epl']}",))
                 + (() if e["warps"] == WARPS else (f"KP_WARPS={e['warps']}",)))
        k1 = kernel(SOURCE, "kp_sdpa_decode_split", case.dtype, (*defines, *knobs),
                    (dim, e["group"]))
        cuda_launch(k1, launch["split"].grid, launch["split"].block, args, pdl=pdl,
                    shared_bytes=launch["split"].shared_bytes)
        if splits > 1:
            k2 = kernel(SOURCE, "kp_attn_combine", case.dtype, defines)
            cuda_launch(k2, (rows, 1, 1), (THREADS, 1, 1),
                        (*part, sinks, outputs["out"], NULL, np.int32(d["heads"]),
                         np.int32(splits), np.int32(dim), np.int32(0)), pdl=pdl)
    return run


def _combine_launcher(defines: tuple = (), pdl: bool = True):
    def run(launch, inputs, outputs, case):
        d, p = case.dims, case.params
        sinks = inputs["sinks"] if p["sinks"] else NULL
        k = kernel(SOURCE, "kp_attn_combine", case.dtype, defines)
        cuda_launch(k, launch.grid, launch.block,
                    (inputs["o"], inputs["m"], inputs["l"], sinks, outputs["out"],
                     outputs["lse"], np.int32(d["heads"]), np.int32(d["splits"]),
                     np.int32(d["head_dim"]), np.int32(p["normalized"])), pdl=pdl)
    return run


COMBINE_D = Invariant(
    name="head_dim <= 512", holds=lambda ns: ns["head_dim"] <= 512,
    why="the combine's threads hold at most 4 columns each, 128 threads a row",
    fix=lambda ns: "head_dim <= 512", violation={"head_dim": 520}, shows=("head_dim",))


def launches(splits: int | None = None, epl: int = EPL, warps: int = WARPS) -> dict:
    geometry = functools.partial(_geometry, splits=splits, epl=epl, warps=warps)
    return {"split": Contract(invariants=(GQA, HEAD_DIM), geometry=geometry),
            "combine": Contract(geometry=_combine_geometry)}


def score_order(head_dim: int, dtype: str, epl: int = EPL):
    """A score's dot (kp_sdpa_decode.cu pass 1): q * scale is rounded first (`qs`); a key row's
    LPK = next_pow2(D / EPL) lanes hold its 16-byte vectors sub + i * LPK (VEC elements each),
    each lane runs one FMA chain from 0 over its EPL elements in (i, e) order, then the LPK lanes
    meet by xor butterfly from LPK / 2 down. Vectors past D are absent."""
    vec = 4 if dtype == "f32" else 8
    lanes = 1 << max(0, (-(-head_dim // epl) - 1).bit_length())
    return plan({"i": epl // vec, "sub": lanes, "e": vec}, ("i e", "fma"), ("sub", "butterfly"))


def _decode_numerics(epl: int):
    """The score's form and order declared (`oracle/attention.py` form "scaled_q"); the softmax
    sums stay any-order: their partial sums are rescaled between additions (e^(m - M)), which
    a plan does not model."""
    def numerics(case) -> Numerics:
        return Numerics(softmax_block=U, form="scaled_q", sums=(
            ("score", score_order(case.dims["head_dim"], case.dtype, epl)),))
    return numerics


def decode_impl(op: str, name: str, splits: int | None = None, epl: int = EPL,
                warps: int = WARPS):
    """`cuda:name` for `op` (contiguous or paged) at the derived split count, or a fixed one
    (the split-invariance test); `epl` elements of a key row per lane (8 or 16); `warps` per
    block of pass 1 (4; the variants' 8 and 16)."""
    return cuda_impl(name, op, NO_CONTRACT, _decode_launcher,
                     f"kparity split-KV decode: G heads of a kv head per block, {epl} elements "
                     f"a lane, U={U} keys a tile per key group, {splits or 'SM-derived'} "
                     "splits, then the combine", launches=launches(splits, epl, warps),
                     numerics=_decode_numerics(epl))


register(
    decode_impl("sdpa_decode", "kp_sdpa_decode"),
    decode_impl("sdpa_decode_paged", "kp_sdpa_decode_paged"),
    cuda_impl("kp_attn_combine", "attn_combine",
              Contract(invariants=(COMBINE_D,), geometry=_combine_geometry,
                       role_dtypes={"partial": ("f32",)}),
              _combine_launcher, "kp_sdpa_decode's pass 2 alone: f32 partials, max rescale",
              numerics=COMBINE_NUMERICS),
)
