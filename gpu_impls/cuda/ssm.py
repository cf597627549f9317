"""Mamba-2 decode and causal conv1d on CUDA (issue 30): kparity's own kernels.

* `cuda:kp_ssm_step` (op `ssm_step`, `oracle/ssd.py`; `kernels/ssm_step.cu`): the decode step in
  either state layout (param `layout`: "hpn" [B, H, P, N], "hnp" [B, H, N, P]), the z gate, the
  D skip, dt = softplus(dt_raw + dt_bias) clamped to [dt_min, dt_max]. Per (batch, head) the f32
  state is read once and written once (bandwidth-bound), a head's P values split over blocks of
  16 (4 blocks a head at P = 64: 256 blocks at Nemotron-3-Nano's 64 heads and batch 1), 16-byte
  loads along the contiguous axis: hpn a warp per 4 rows p (a lane N / 32 elements, the dot with
  C a warp butterfly, as `cuda:kp_gdn_step`), hnp a block per 16 columns p over every row n
  (float4 columns, the dot summed over lanes and warps). One instance per N / 32 (1..8) and
  layout: contract N % 32 == 0, N <= 256, hnp P % 4 == 0. The state out is a plain output.
* `cuda:kp_conv1d_causal_step` (op `conv1d_causal_step`, `oracle/conv1d.py`;
  `kernels/conv1d.cu`): one token, a thread per 16 bytes of channels (8 in f16/bf16, 4 in f32):
  the W-1 state rows, x, the W weight rows and the bias as one vector each, y, the state shifted
  by one (raw bits). Any D: where D is no multiple of the vector (or a pointer is not 16-byte
  aligned) the same threads load element by element, guarded.
* `cuda:kp_conv1d_causal` (op `conv1d_causal`): the prefill, a thread per channel vector
  walking a span of 8 tokens (CONV_SPAN) with the W-1 previous inputs in registers (the seed's
  `_silu_cast_many`), spans in parallel (each starts from a halo of the W-1 rows before it:
  the initial state's or x's), the last span's block writing the final state. Both conv kernels
  have an instance per W in 2..4: contract W <= 4.

Numerics: each declares its source's summation order (`ssm_step_order`; the conv's one chain,
bias first); CUDA's expf, log1pf within the backend's 2 ULPs; CuPy compiles with -ftz=true,
which the runner's oracle accounts for; FMAs round less than the bound charges.
Test-only mutants (tests/mutants.py SSM_CUDA_MUTANTS): KPARITY_MUTANT_SOFTPLUS_TWICE (the
step's decay), KPARITY_MUTANT_CONV_DOUBLE_SHIFT (the conv step's ring), KPARITY_MUTANT_CONV_
STATE_SKIPS_LAST (the prefill's final state).
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch, nearest_multiples
from gpu_impls.cuda._module import cuda_impl, kernel, launch as cuda_launch
from gpu_impls.cuda.sum_orders import warp_of_vectors
from oracle.numerics import SEQUENTIAL, Numerics, plan
from oracle.ssd import dt_limits

SSM_SOURCE = "ssm_step.cu"
CONV_SOURCE = "conv1d.cu"
SSM_THREADS = 128        # KP_SSM_WARPS * 32
SSM_SLICE = 16           # KP_SSM_WARPS * KP_SSM_ROWS (hpn) == KP_SSM_COLS (hnp): p per block
SSM_MAX_N = 256          # 32 lanes (row groups) x 8 elements (the instances: N / 32 in 1..8)
SSM_KERNELS = {"hpn": "kp_ssm_step_hpn", "hnp": "kp_ssm_step_hnp"}
CONV_THREADS = 64        # KP_CONV_THREADS: the prefill's block
# The step's block: 64 threads, or 256 from CONV_STEP_WIDE_AT threads of work on (B = 64 at
# Nemotron-3-Nano's 6144 channels): profiled on an H100 (scripts/conv_step_variants.py, back to
# back over rotating sets), 256 read 7.38 against 8.24 us at B = 64 and 11.57 against 9.86 at
# B = 1, where 64 spread the few chunks over more SMs.
CONV_STEP_THREADS = (64, 256)    # KP_CONV_STEP_MAX_THREADS is the larger
CONV_STEP_WIDE_AT = 32768
# prefill: tokens per block (the kernel's span_len). 8: at Nemotron-3-Nano's conv (6144 bf16
# channels, T = 2048) on an H100, `chain`, 33.07 us against 37.04 for 32-token spans with 8 loads
# ahead and no register cap (scripts/kp_conv_variants.py, benchmarks/data/mamba-h100/
# conv-variants.log); more blocks fill the SMs that the register cap opened
CONV_SPAN = 8
CONV_MAX_W = 4           # KP_CONV_MAX_W: the instances W in 2..4
CONV_VEC_BYTES = 16      # a thread's channels: one 16-byte vector
ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
KERNELS = [(SSM_SOURCE, name, [(npl,) for npl in range(1, SSM_MAX_N // 32 + 1)])
           for name in SSM_KERNELS.values()] + [
          (CONV_SOURCE, name, [(w,) for w in range(2, CONV_MAX_W + 1)])
          for name in ("kp_conv1d_causal_step", "kp_conv1d_causal")]


def _aligned(*arrays) -> bool:
    """Every array starts on a 16-byte boundary (a vector load's requirement)."""
    return all(a.data.ptr % 16 == 0 for a in arrays)


# --- cuda:kp_ssm_step ---------------------------------------------------------------------------

def _ssm_geometry(dims, params):
    slices = -(-dims["dim_p"] // SSM_SLICE)
    derived = {"slices": slices, "npl": dims["dim_n"] // 32}
    blocks = dims["batch"] * dims["heads"] * slices
    return derived, Launch(grid=(max(1, blocks), 1, 1), block=(SSM_THREADS, 1, 1),
                           extra=derived)


SSM_N_LANES = Invariant(
    name="dim_n % 32 == 0", holds=lambda ns: ns["dim_n"] % 32 == 0,
    why="each of 32 lanes (hpn) or row groups (hnp) holds N / 32 elements of the state",
    fix=lambda ns: f"dim_n = {nearest_multiples(ns['dim_n'], 32, 32, SSM_MAX_N)}",
    violation={"dim_n": 80}, shows=("dim_n",))
SSM_N_MAX = Invariant(
    name=f"dim_n <= {SSM_MAX_N}", holds=lambda ns: ns["dim_n"] <= SSM_MAX_N,
    why=f"a thread holds at most {SSM_MAX_N // 32} state elements per row in registers (the "
        "instances: N / 32 in 1..8)",
    fix=lambda ns: f"dim_n <= {SSM_MAX_N}", violation={"dim_n": 288}, shows=("dim_n",))
SSM_HNP_VECTORS = Invariant(
    name="layout == 'hpn' or dim_p % 4 == 0",
    holds=lambda ns: ns["layout"] == "hpn" or ns["dim_p"] % 4 == 0,
    why="the hnp state [B, H, N, P] is read in float4 columns along P: a vector must be whole "
        "or wholly past P",
    fix=lambda ns: f"dim_p a multiple of 4 (e.g. {max(4, ns['dim_p'] // 4 * 4)}), or "
                   "layout='hpn'",
    violation={"layout": "hnp", "dim_p": 6}, shows=("layout", "dim_p"))
SSM_CONTRACT = Contract(invariants=(SSM_N_LANES, SSM_N_MAX, SSM_HNP_VECTORS),
                        geometry=_ssm_geometry)


def ssm_step_order(layout: str, dim_n: int):
    """y's sum over n (ssm_step.cu): hpn, a warp's lanes over their vectors, then the butterfly
    (`warp_of_vectors`); hnp, thread (warp, row group r = lane / 4) over n = 32 i + 8 warp + r,
    i in order from 0, then the 8 row groups by butterfly (lane offsets 16, 8, 4), then the 4
    warps' partials from 0 in warp order."""
    if layout == "hpn":
        return warp_of_vectors(dim_n // 32)
    return plan({"i": dim_n // 32, "warp": SSM_THREADS // 32, "rg": 8}, ("i", "sequential"),
                ("rg", "butterfly"), ("warp", "sequential"))


def _ssm_numerics(case) -> Numerics:
    npl = _ssm_geometry(case.dims, case.params)[0]["npl"]  # the launch's N / 32
    return Numerics(ssm_step_order(case.params["layout"], 32 * npl))


def _ssm_step(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, p, e = case.dims, case.params, launch.extra
        state_in, state_out = inputs["state_in"], outputs["state_out"]
        if not _aligned(state_in, state_out):
            raise ValueError("cuda:kp_ssm_step: state_in and state_out must start on a 16-byte "
                             "boundary (float4 loads): pass contiguous, freshly allocated arrays")
        lo, hi = dt_limits(case)
        args = (inputs["x"], inputs["dt_raw"], inputs["A_log"], inputs["dt_bias"], inputs["Bm"],
                inputs["Cm"], inputs["D"], inputs["z"], state_in, state_out, outputs["y"],
                np.int32(d["heads"]), np.int32(d["dim_p"]), np.int32(d["groups"]),
                np.int32(e["slices"]), np.int32(bool(p["gate"])), np.float32(lo),
                np.float32(np.inf if hi is None else hi))
        k = kernel(SSM_SOURCE, SSM_KERNELS[p["layout"]], case.dtype, defines, (e["npl"],))
        cuda_launch(k, launch.grid, launch.block, args)
    return run


# --- cuda:kp_conv1d_causal_step, cuda:kp_conv1d_causal ---------------------------------------

def _chunks(dims, params) -> tuple[int, int]:
    """(channels per 16-byte vector, channel vectors of a row: the last one may be partial)."""
    vec = CONV_VEC_BYTES // ELEMENT_BYTES[params["dtype"]]
    return vec, -(-dims["channels"] // vec)


def _conv_step_geometry(dims, params):
    vec, chunks = _chunks(dims, params)
    derived = {"vec": vec, "chunks": chunks}
    work = dims["batch"] * chunks
    threads = CONV_STEP_THREADS[work >= CONV_STEP_WIDE_AT]
    blocks = -(-work // threads)
    return derived, Launch(grid=(max(1, blocks), 1, 1), block=(threads, 1, 1), extra=derived)


def _conv_geometry(dims, params, span: int = CONV_SPAN):
    vec, chunks = _chunks(dims, params)
    chunk_blocks = -(-chunks // CONV_THREADS)
    spans = max(1, -(-dims["tokens"] // span))  # T = 0: one span that copies the state
    derived = {"vec": vec, "chunks": chunks, "chunk_blocks": chunk_blocks, "spans": spans,
               "span": span}
    blocks = dims["batch"] * spans * chunk_blocks
    return derived, Launch(grid=(max(1, blocks), 1, 1), block=(CONV_THREADS, 1, 1),
                           extra=derived)


CONV_WIDTH_MAX = Invariant(
    name=f"width <= {CONV_MAX_W}", holds=lambda ns: ns["width"] <= CONV_MAX_W,
    why=f"the window lives in registers, an instance per width 2..{CONV_MAX_W} (causal-conv1d's "
        "widths; Mamba-2's is 4)",
    fix=lambda ns: f"width <= {CONV_MAX_W}, or torch:conv1d_causal", violation={"width": 5},
    shows=("width",))
CONV_STEP_CONTRACT = Contract(invariants=(CONV_WIDTH_MAX,), geometry=_conv_step_geometry)
CONV_CONTRACT = Contract(invariants=(CONV_WIDTH_MAX,), geometry=_conv_geometry)


def _vectors(case, e, *arrays) -> bool:
    """Whole 16-byte vectors: D a multiple of the vector and every pointer aligned (else the
    kernels' guarded element path)."""
    return case.dims["channels"] % e["vec"] == 0 and _aligned(*arrays)


def _conv_step(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, p, e = case.dims, case.params, launch.extra
        arrays = (inputs["x"], inputs["weight"], inputs["bias"], inputs["conv_state_in"],
                  outputs["conv_state_out"], outputs["y"])
        args = (*arrays, np.int32(d["batch"]), np.int32(d["channels"]), np.int32(e["chunks"]),
                np.int32(bool(p["bias"])), np.int32(bool(p["silu"])),
                np.int32(_vectors(case, e, *arrays)))
        k = kernel(CONV_SOURCE, "kp_conv1d_causal_step", case.dtype, defines, (d["width"],))
        cuda_launch(k, launch.grid, launch.block, args)
    return run


def _conv(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d, p, e = case.dims, case.params, launch.extra
        arrays = (inputs["x"], inputs["weight"], inputs["bias"], inputs["conv_state_in"],
                  outputs["conv_state"], outputs["y"])
        args = (*arrays, np.int32(d["tokens"]), np.int32(d["channels"]), np.int32(e["chunks"]),
                np.int32(e["chunk_blocks"]), np.int32(e["spans"]), np.int32(e["span"]),
                np.int32(bool(p["bias"])),
                np.int32(bool(p["silu"])), np.int32(_vectors(case, e, *arrays)))
        k = kernel(CONV_SOURCE, "kp_conv1d_causal", case.dtype, defines, (d["width"],))
        cuda_launch(k, launch.grid, launch.block, args)
    return run


# conv1d.cu's `conv_out`: acc = bias (0 without), then += w_j x_j for j in order: the model's
# terms in that order (oracle/conv1d.py `_terms`), one chain
CONV_ORDER = Numerics(SEQUENTIAL)

register(
    cuda_impl("kp_ssm_step", "ssm_step", SSM_CONTRACT, _ssm_step,
              "kparity Mamba-2 decode step, hpn or hnp state: 16 p a block, float4 loads along "
              "the contiguous axis, f32 state read once and written once",
              numerics=_ssm_numerics),
    cuda_impl("kp_conv1d_causal_step", "conv1d_causal_step", CONV_STEP_CONTRACT, _conv_step,
              "kparity conv1d decode step: a thread per 16 bytes of channels, the ring shifted "
              "by one as raw bits, bias, silu", numerics=CONV_ORDER),
    cuda_impl("kp_conv1d_causal", "conv1d_causal", CONV_CONTRACT, _conv,
              "kparity conv1d prefill: a thread per channel vector walking 8-token spans with "
              "the W-1 previous inputs in registers (halo), the final state from the last span",
              numerics=CONV_ORDER),
)
