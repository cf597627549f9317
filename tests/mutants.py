"""Test-only mutant impls: each is a plausible kernel bug that the gate must turn red.

Loaded as a plugin (`kparity --plugin tests/mutants.py check --impl torch:mutant_drop_eps`), never
registered by default. CPU mutants run on torch (CI); CUDA mutants compile the real kernels with
a `KPARITY_MUTANT_*` define (GPU gate).

| mutant                         | bug                                                        |
|--------------------------------|------------------------------------------------------------|
| mutant_drop_eps                | rsqrt(mean(x²)) without eps: zero rows give NaN, tiny rows blow up |
| mutant_round_before_weight     | claims one rounding, rounds x·inv to T before the weight    |
| mutant_weight_before_rounding  | claims rounding="normed", applies the weight before it      |
| mutant_zero_nonfinite          | NaN and ±inf inputs read as 0 (a kernel that sanitises its  |
|                                | loads): fails the `nonfinite` cases only                   |
| mutant_skip_lane               | one lane's elements never written (torch: every index = 1   |
|                                | mod 32; CUDA: thread 1 of each block)                       |
| mutant_kp_skip_lane            | the same in cuda:kp_rms_norm (thread 1's 16-byte vectors;   |
|                                | a whole row where one thread holds a row)                   |
| mutant_gemv_nibble_order       | dequant_gemv: codes within each word read in reverse order  |
| mutant_gemv_group_off_by_one   | the last code of each group takes the next group's s and b  |
|                                | (kp: the chunk that ends a group)                           |
| mutant_gemv_drop_bias          | w = q * s: the bias term is lost                            |
| mutant_gemv_skip_last_group    | the last group of every row is never accumulated            |
| mutant_lanes_eps_swapped       | torch:lanes_rms_norm with eps hard-coded to 1e-5 (Llama's) |
|                                | where the case says 1e-6 (Qwen's)                          |
| mutant_lanes_code_off_by_one   | torch:lanes_dequant_gemv with one code per row off by one, |
|                                | at the row's largest-magnitude s·x term                    |
The two `lanes_*` mutants and their controls (`torch:lanes_rms_norm`, `torch:lanes_dequant_gemv`)
are f32 NumPy emulations of kernels with a declared reduction order (`Impl.numerics`): a
mistake far below the any-order bound is caught by the declared order's bound (tests/test_bite.py).
CUDA gemv mutants exist for cuda:dequant_gemv (`mutant_gemv_*`), cuda:kp_qgemv
(`mutant_kp_qgemv_*`) and cuda:kp_qgemv_mma (`mutant_kp_qgemv_mma_*`).
"""

from __future__ import annotations

import numpy as np

from gpu_impls import impls, register
from gpu_impls.contract import Contract, Invariant, param_is, rounding_once
from gpu_impls.impl import Impl
from oracle.numerics import Numerics, lanes

ONCE = Contract(invariants=rounding_once("a non-mutant impl"))
NORMED = Contract(invariants=(param_is("rounding", "normed", "a non-mutant impl", other="once"),
                              param_is("weight_offset", 0, "a non-mutant impl", other=1)))


def _parts(inputs, case):
    import torch

    x = inputs["x"].float()
    w = inputs["w"].float() + case.params["weight_offset"]
    eps = float(np.float32(case.params["eps"]))
    return torch, x, w, eps


def drop_eps(launch, inputs, outputs, case):
    torch, x, w, eps = _parts(inputs, case)
    outputs["out"].copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) * w)


def round_before_weight(launch, inputs, outputs, case):
    torch, x, w, eps = _parts(inputs, case)
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(inputs["x"].dtype)
    outputs["out"].copy_(normed.float() * w)


def weight_before_rounding(launch, inputs, outputs, case):
    torch, x, w, eps = _parts(inputs, case)
    outputs["out"].copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)


def zero_nonfinite(launch, inputs, outputs, case):
    torch, x, w, eps = _parts(inputs, case)
    x = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    outputs["out"].copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)


def skip_lane(launch, inputs, outputs, case):
    torch, x, w, eps = _parts(inputs, case)
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w).to(outputs["out"].dtype)
    keep = (torch.arange(x.shape[-1], device=x.device) % 32) != 1
    outputs["out"][..., keep] = y[..., keep]


def _gemv_parts(inputs, case):
    """(torch, codes [out, in] as float, per-code scales, per-code biases, x) in f32."""
    import torch

    from gpu_impls.torch.gemv import unpack_codes

    bits, group, n = case.dims["bits"], case.dims["group_size"], case.dims["in"]
    q = unpack_codes(inputs["w"], bits, n).float()
    s = inputs["scales"].float().repeat_interleave(group, dim=-1)
    b = inputs["biases"].float().repeat_interleave(group, dim=-1)
    return torch, q, s, b, inputs["x"].float()


def _gemv_out(outputs, y):
    outputs["out"].copy_(y)


def gemv_nibble_order(launch, inputs, outputs, case):
    torch, q, s, b, x = _gemv_parts(inputs, case)
    per_word = 32 // case.dims["bits"]
    q = q.reshape(q.shape[0], -1, per_word).flip(-1).reshape(q.shape)
    _gemv_out(outputs, (q * s + b) @ x)


def gemv_group_off_by_one(launch, inputs, outputs, case):
    torch, q, s, b, x = _gemv_parts(inputs, case)
    g = case.dims["group_size"]
    last = torch.arange(g - 1, q.shape[1] - 1, g)  # each group's last code but the row's last
    s[:, last], b[:, last] = s[:, last + 1], b[:, last + 1]
    _gemv_out(outputs, (q * s + b) @ x)


def gemv_drop_bias(launch, inputs, outputs, case):
    torch, q, s, b, x = _gemv_parts(inputs, case)
    _gemv_out(outputs, (q * s) @ x)


def gemv_skip_last_group(launch, inputs, outputs, case):
    torch, q, s, b, x = _gemv_parts(inputs, case)
    keep = q.shape[1] - case.dims["group_size"]
    _gemv_out(outputs, (q * s + b)[:, :keep] @ x[:keep])


POW2_BITS = Contract(invariants=(Invariant(
    "bits in (2, 4, 8)", lambda ns: ns["bits"] in (2, 4, 8),
    "the mutant reverses whole words of codes", lambda ns: "bits = 4", {"bits": 3}, ("bits",)),))

CPU_MUTANTS = (
    Impl("rms_norm", "torch", "mutant_drop_eps", drop_eps, ONCE),
    Impl("rms_norm", "torch", "mutant_round_before_weight", round_before_weight, ONCE),
    Impl("rms_norm", "torch", "mutant_weight_before_rounding", weight_before_rounding, NORMED),
    Impl("rms_norm", "torch", "mutant_skip_lane", skip_lane, ONCE),
    Impl("rms_norm", "torch", "mutant_zero_nonfinite", zero_nonfinite, ONCE),
    Impl("dequant_gemv", "torch", "mutant_gemv_nibble_order", gemv_nibble_order, POW2_BITS),
    Impl("dequant_gemv", "torch", "mutant_gemv_group_off_by_one", gemv_group_off_by_one),
    Impl("dequant_gemv", "torch", "mutant_gemv_drop_bias", gemv_drop_bias),
    Impl("dequant_gemv", "torch", "mutant_gemv_skip_last_group", gemv_skip_last_group),
)
GEMV_BUGS = (("nibble_order", "KPARITY_MUTANT_NIBBLE_ORDER"),
             ("group_off_by_one", "KPARITY_MUTANT_GROUP_OFF_BY_ONE"),
             ("drop_bias", "KPARITY_MUTANT_DROP_BIAS"),
             ("skip_last_group", "KPARITY_MUTANT_SKIP_LAST_GROUP"))
CUDA_MUTANTS = (
    ("cuda:mt_rms_norm", "mutant_drop_eps", "KPARITY_MUTANT_DROP_EPS"),
    ("cuda:mt_rms_norm", "mutant_round_before_weight", "KPARITY_MUTANT_ROUND_BEFORE_WEIGHT"),
    ("cuda:mt_rms_norm", "mutant_skip_lane", "KPARITY_MUTANT_SKIP_LANE"),
    ("cuda:kp_rms_norm", "mutant_kp_skip_lane", "KPARITY_MUTANT_SKIP_LANE"),
    *((f"cuda:{impl}", f"{prefix}_{bug}", define) for bug, define in GEMV_BUGS
      for impl, prefix in (("dequant_gemv", "mutant_gemv"), ("kp_qgemv", "mutant_kp_qgemv"),
                           ("kp_qgemv_mma", "mutant_kp_qgemv_mma"))),
)

_existing = impls()
register(*(m for m in CPU_MUTANTS if m.id not in _existing))
try:
    from gpu_impls.cuda._module import mutant as cuda_mutant
except ImportError:  # the CUDA impls are optional for the CPU tests
    cuda_mutant = None


def register_cuda_mutants(table) -> None:
    """Each (impl id, mutant name, -D define) of `table` as a recompiled copy of the impl, where
    CuPy is here and the impl is registered (and the mutant not yet)."""
    if cuda_mutant is None:
        return
    for impl_id, name, define in table:
        if f"cuda:{name}" not in _existing and impl_id in _existing:
            register(cuda_mutant(impl_id, name, define))

register_cuda_mutants(CUDA_MUTANTS)


# --- rms_norm_qgemv (fused RMSNorm + quantized GEMV) ------------------------------------------
#
# | mutant                              | bug                                                  |
# |-------------------------------------|------------------------------------------------------|
# | torch:mutant_rms_qgemv_round_normed | the normalised activation rounded to T before the    |
# |                                     | GEMV (two kernels, or mx.fast.rms_norm's output)     |
# | torch:mutant_rms_qgemv_drop_eps     | rsqrt(mean(x²)) without eps: an all-zero x gives NaN |
# | cuda:mutant_rms_qgemv{,_fast,_int8}_{nibble_order, group_off_by_one, drop_bias,          |
# |   skip_last_group, drop_eps}: the seed ports compiled with the KPARITY_MUTANT_* define    |


def _rms_qgemv_parts(inputs, case, eps: float):
    """(normed x in f32, dequantized W in f32) as torch:norm_dequant_linear forms them."""
    from gpu_impls.torch.gemv import dequantize_f32
    from gpu_impls.torch.rms_qgemv import normed_f32

    normed = normed_f32(inputs["x"], inputs["norm_weight"], eps)
    return normed, dequantize_f32(inputs["w"], inputs["scales"], inputs["biases"], case)


def rms_qgemv_round_normed(launch, inputs, outputs, case):
    import torch.nn.functional as F

    normed, w_hat = _rms_qgemv_parts(inputs, case, float(np.float32(case.params["eps"])))
    normed = normed.to(inputs["x"].dtype).float()
    outputs["out"].copy_(F.linear(normed, w_hat))


def rms_qgemv_drop_eps(launch, inputs, outputs, case):
    import torch.nn.functional as F

    normed, w_hat = _rms_qgemv_parts(inputs, case, 0.0)
    outputs["out"].copy_(F.linear(normed, w_hat))


RMS_QGEMV_CPU_MUTANTS = (
    # rounding to f32 is a no-op: the mutant exists in the half dtypes only
    Impl("rms_norm_qgemv", "torch", "mutant_rms_qgemv_round_normed", rms_qgemv_round_normed,
         Contract(dtypes=("f16", "bf16"))),
    Impl("rms_norm_qgemv", "torch", "mutant_rms_qgemv_drop_eps", rms_qgemv_drop_eps),
)
RMS_QGEMV_BUGS = (*GEMV_BUGS, ("drop_eps", "KPARITY_MUTANT_DROP_EPS"))
RMS_QGEMV_CUDA_MUTANTS = tuple(
    (f"cuda:{impl}", f"{prefix}_{bug}", define) for bug, define in RMS_QGEMV_BUGS
    for impl, prefix in (("ffai_rms_norm_qgemv", "mutant_rms_qgemv"),
                         ("ffai_rms_norm_qgemv_fast", "mutant_rms_qgemv_fast"),
                         ("ffai_rms_norm_qgemv_int8_fast", "mutant_rms_qgemv_int8")))

register(*(m for m in RMS_QGEMV_CPU_MUTANTS if m.id not in _existing))
register_cuda_mutants(RMS_QGEMV_CUDA_MUTANTS)


# --- declared reduction order: bounds that bite (issue 24 item 6) -----------------------------
#
# Explicit f32 emulations of a GPU kernel whose summation order is known, so that the order they
# declare (`numerics=Numerics(lanes(L))`) is true and the tighter bound is rigorous for them.
# Every step is an elementwise np.float32 operation (IEEE round-to-nearest); no np.sum, whose
# pairwise order is NumPy's, not the declared one. tests/test_bite.py runs them.

NORM_LANES = 256  # a 256-thread block, one row per block, each thread a lane
GEMV_LANES = 32  # a warp per output row
F32_ONCE = Contract(invariants=(*rounding_once("a non-mutant impl"),
                                param_is("weight_offset", 0, "a non-mutant impl", other=1)),
                    dtypes=("f32",))
F32 = Contract(dtypes=("f32",))


def lanes_sum_f32(t: np.ndarray, n_lanes: int) -> np.ndarray:
    """Sum float32 `t` along its last axis in f32, in the order `oracle.numerics.lanes(L)`
    models (`_lane_partials`): element i goes to lane i % L at step i // L; lane j sums
    t_j + t_{j+L} + t_{j+2L} + ... left to right; then a balanced tree over the lane totals,
    level by level, node k of the next level = node 2k + node 2k+1 (a level of odd length gets
    a zero appended). Padding with zeros adds nothing: x + 0 = x exactly."""
    t = np.asarray(t, dtype=np.float32)
    n = t.shape[-1]
    steps = max(1, -(-n // n_lanes))
    padded = np.zeros(t.shape[:-1] + (steps * n_lanes,), dtype=np.float32)
    padded[..., :n] = t
    padded = padded.reshape(t.shape[:-1] + (steps, n_lanes))
    level = padded[..., 0, :].copy()
    for k in range(1, steps):  # every lane adds its step-k element: one f32 rounding each
        level = level + padded[..., k, :]
    while level.shape[-1] > 1:
        if level.shape[-1] % 2:
            level = np.concatenate([level, np.zeros_like(level[..., :1])], axis=-1)
        level = level[..., 0::2] + level[..., 1::2]
    return level[..., 0]


def lanes_rms_norm_f32(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """rms_norm, rounding "once", weight_offset 0, in f32 with 256 lanes per row:

        S   = lanes_sum(x * x)                       x*x rounded, then the declared order
        a   = S / f32(n) + f32(eps)                  correctly rounded divide, add
        inv = RNE_f32(1 / sqrt(a))                   float64 1/sqrt rounded once to f32:
                                                     < 1 ULP, inside the model's 2
        out = (x * inv) * w                          two roundings (`prod3`'s first form)"""
    x, w = x.astype(np.float32, copy=False), w.astype(np.float32, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf rows propagate (the contract)
        s = lanes_sum_f32(x * x, NORM_LANES)
        a = s / np.float32(x.shape[-1]) + np.float32(eps)
        inv = (1.0 / np.sqrt(a.astype(np.float64))).astype(np.float32)
        return (x * inv[..., None]) * w


def _write(outputs, y: np.ndarray):
    import torch

    outputs["out"].copy_(torch.from_numpy(np.ascontiguousarray(y)))


def lanes_rms_norm(launch, inputs, outputs, case):
    eps = float(np.float32(case.params["eps"]))
    _write(outputs, lanes_rms_norm_f32(inputs["x"].cpu().numpy(), inputs["w"].cpu().numpy(), eps))


def lanes_eps_swapped(launch, inputs, outputs, case):
    """The kernel with Llama's eps baked in: 1e-5 whatever the case says. At mean(x^2) ~ 1 that
    moves inv by (1e-5 - 1e-6) / 2 = 4.5e-6 relative: ~75 half-ULPs of f32, far below the
    any-order bound at n = 4096 but above the 256-lane one."""
    _write(outputs, lanes_rms_norm_f32(inputs["x"].cpu().numpy(), inputs["w"].cpu().numpy(),
                                       float(np.float32(1e-5))))


def _gemv_numpy(inputs, case):
    """(codes int64 [out, in], per-code scales and biases float32 [out, in], x float32 [in]),
    the codes unpacked by torch:dequant_linear's unpacker (not the oracle's)."""
    from gpu_impls.torch.gemv import unpack_codes

    bits, group, n = case.dims["bits"], case.dims["group_size"], case.dims["in"]
    q = unpack_codes(inputs["w"].cpu(), bits, n).numpy()
    s = np.repeat(inputs["scales"].cpu().numpy(), group, axis=-1)
    b = np.repeat(inputs["biases"].cpu().numpy(), group, axis=-1)
    return q, s, b, inputs["x"].cpu().numpy()


def lanes_gemv_f32(q: np.ndarray, s: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Dequantize-then-dot in f32, 32 lanes per row: t_d = (q_d s_d + b_d) x_d (three roundings:
    q s, + b, * x; q is exact in f32), out = lanes_sum(t)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return lanes_sum_f32((q.astype(np.float32) * s + b) * x, GEMV_LANES)


def lanes_dequant_gemv(launch, inputs, outputs, case):
    _write(outputs, lanes_gemv_f32(*_gemv_numpy(inputs, case)))


def largest_term_off_by_one(q: np.ndarray, s: np.ndarray, x: np.ndarray, bits: int
                            ) -> np.ndarray:
    """A copy of the codes with, in every row, the code at the largest |s_d x_d| moved by one:
    q + 1, or q - 1 where q is the largest code. The row's exact output moves by exactly
    |s_d x_d|, the largest change a one-code slip can make in that row."""
    q = q.copy()
    rows = np.arange(q.shape[0])
    at = np.argmax(np.abs(s.astype(np.float64) * x.astype(np.float64)), axis=-1)
    code = q[rows, at]
    q[rows, at] = np.where(code == (1 << bits) - 1, code - 1, code + 1)
    return q


def lanes_code_off_by_one(launch, inputs, outputs, case):
    """A one-code slip (a shift or mask off by one in one lane's unpack, say) at the row's
    largest |s x| term: out moves by max_d |s_d x_d|, ~3e-4 at in = 4096 (s ~ 0.004, x ~ 1/64),
    about the any-order bound there, ~200x the 32-lane one."""
    q, s, b, x = _gemv_numpy(inputs, case)
    _write(outputs, lanes_gemv_f32(largest_term_off_by_one(q, s, x, case.dims["bits"]), s, b, x))


LANES_IMPLS = (
    Impl("rms_norm", "torch", "lanes_rms_norm", lanes_rms_norm, F32_ONCE,
         numerics=Numerics(lanes(NORM_LANES)),
         doc="f32 NumPy emulation, x^2 summed in 256 lanes then a tree (test control)"),
    Impl("rms_norm", "torch", "mutant_lanes_eps_swapped", lanes_eps_swapped, F32_ONCE,
         numerics=Numerics(lanes(NORM_LANES)), doc="lanes_rms_norm with eps 1e-5 hard-coded"),
    Impl("dequant_gemv", "torch", "lanes_dequant_gemv", lanes_dequant_gemv, F32,
         numerics=Numerics(lanes(GEMV_LANES)),
         doc="f32 NumPy emulation, dequantize then dot in 32 lanes then a tree (test control)"),
    Impl("dequant_gemv", "torch", "mutant_lanes_code_off_by_one", lanes_code_off_by_one, F32,
         numerics=Numerics(lanes(GEMV_LANES)),
         doc="lanes_dequant_gemv with the largest |s x| term's code off by one in every row"),
)
register(*(m for m in LANES_IMPLS if m.id not in _existing))


# --- rope, clipped_swiglu, kv_cache_update (issue 27) ------------------------------------------
#
# | mutant                             | bug                                                    |
# |------------------------------------|--------------------------------------------------------|
# | torch:mutant_rope_pairing_adjacent | pairs (i, i+1) where rotate-half's (i, i + R/2) is      |
# |                                    | declared (torch:rope_polar's interleaved path)          |
# | torch:mutant_rope_llama3_no_smooth | llama3's smooth band skipped: its wavelengths keep the |
# |                                    | unscaled inv (only the low band divided by factor)     |
# | torch:mutant_swiglu_no_clamp       | clipped_swiglu without its clamps                      |
# | torch:mutant_kv_update_one_off     | every row written one slot later                       |


def rope_pairing_adjacent(launch, inputs, outputs, case):
    from gpu_impls.torch.rope import _rope_polar

    return _rope_polar(launch, inputs, outputs, case.replace(pairing="gptj"))


def _llama3_no_smooth(case, torch):
    """The llama3 table with the medium band left at the unscaled inv (float64, then f32)."""
    from gpu_impls.torch.rope import _table_f32

    p = case.params
    plain = _table_f32(case.replace(scaling="none"), torch).double()
    wavelen = 2 * np.pi / plain
    return torch.where(wavelen > p["original_max_position"] / p["low_freq_factor"],
                       plain / p["factor"], plain).float()


def rope_llama3_no_smooth(launch, inputs, outputs, case):
    from gpu_impls.torch.rope import _rope_polar

    return _rope_polar(launch, inputs, outputs, case, table=_llama3_no_smooth)


def swiglu_no_clamp(launch, inputs, outputs, case):
    from gpu_impls.torch.activations import _clipped_swiglu

    return _clipped_swiglu(launch, inputs, outputs, case.replace(limit=float("inf")))


def kv_update_one_off(launch, inputs, outputs, case):
    """torch:kv_cache_update with every slot + 1 (wrapping at the cache's end)."""
    from gpu_impls.torch.kv_cache import _update

    slots = inputs["slots"]
    total = outputs["k_cache"].numel() // (outputs["k_cache"].shape[-1]
                                           * case.dims["heads"])
    shifted = (slots + 1) % total
    _update(launch, {**inputs, "slots": shifted.where(slots >= 0, slots)}, outputs, case)


ROPE_F32 = (param_is("compute", "f32", "a non-mutant impl", other="T"),)
ISSUE27_MUTANTS = (
    Impl("rope", "torch", "mutant_rope_pairing_adjacent", rope_pairing_adjacent,
         Contract(invariants=ROPE_F32 + (param_is("pairing", "neox", "a non-mutant impl",
                                                  other="gptj"),))),
    Impl("rope", "torch", "mutant_rope_llama3_no_smooth", rope_llama3_no_smooth,
         Contract(invariants=ROPE_F32 + (param_is("scaling", "llama3", "a non-mutant impl",
                                                  other="none"),))),
    Impl("clipped_swiglu", "torch", "mutant_swiglu_no_clamp", swiglu_no_clamp),
    Impl("kv_cache_update", "torch", "mutant_kv_update_one_off", kv_update_one_off),
)
register(*(m for m in ISSUE27_MUTANTS if m.id not in _existing))

# The same bugs in the CUDA kernels, compiled with their KPARITY_MUTANT_* define (GPU gate):
# | cuda:mutant_kp_rope_pairing_adjacent | kp_rope pairs (2i, 2i+1) where neox is declared      |
# | cuda:mutant_kp_rope_llama3_no_smooth | kp_rope's llama3 smooth band keeps the unscaled inv  |
# | cuda:mutant_swiglu_no_clamp          | cuda:clipped_swiglu without its clamps               |
# | cuda:mutant_kv_update_one_off        | cuda:kv_cache_update writes every row one slot late  |
ISSUE27_CUDA_MUTANTS = (
    ("cuda:kp_rope", "mutant_kp_rope_pairing_adjacent", "KPARITY_MUTANT_ROPE_PAIRING_ADJACENT"),
    ("cuda:kp_rope", "mutant_kp_rope_llama3_no_smooth", "KPARITY_MUTANT_LLAMA3_NO_SMOOTH"),
    ("cuda:clipped_swiglu", "mutant_swiglu_no_clamp", "KPARITY_MUTANT_SWIGLU_NO_CLAMP"),
    ("cuda:kv_cache_update", "mutant_kv_update_one_off",
     "KPARITY_MUTANT_KV_SLOT_OFF_BY_ONE"),
)
register_cuda_mutants(ISSUE27_CUDA_MUTANTS)

# --- attention (issue 27) ---------------------------------------------------------------------
#
# | mutant                                   | bug                                             |
# |------------------------------------------|-------------------------------------------------|
# | torch:mutant_sdpa_drop_sink              | the learned sink left out of the denominator    |
# | torch:mutant_sdpa_window_off_by_one      | the window attends window + 1 keys (`>` for     |
# |                                          | `>=` at its start)                              |
# | torch:mutant_sdpa_gqa_modulo             | query head h reads kv head h % Hkv, not         |
# |                                          | h // (Hq / Hkv) (k.repeat for repeat_interleave)|
# | torch:mutant_sdpa_scores_in_t            | the scores rounded to T before the softmax (HF  |
# |                                          | eager's bf16 matmul): the contract keeps f32    |
# | torch:mutant_combine_no_rescale          | attn_combine: Σ acc_s / Σ l_s, the e^(m_s − M)  |
# |                                          | factors dropped                                 |
# | torch:mutant_split_kv_no_rescale         | the split-KV pair with that combine             |
# | torch:mutant_prefill_causal_top_left     | sdpa_prefill_varlen with torch's `is_causal`    |
# |                                          | (top-left): wrong once a prefix is cached       |


def _attn_parts(inputs, case):
    from gpu_impls.torch.attention import attended_mask, cache
    from oracle.attention import scale_of

    k, v = cache(inputs, case)
    mask = attended_mask(inputs["lengths"], k.shape[2], case.params)
    sinks = inputs["sinks"] if case.params["sinks"] else None
    return k, v, mask, sinks, scale_of(case)


def sdpa_drop_sink(launch, inputs, outputs, case):
    from gpu_impls.torch.attention import eager_sinks_fn

    k, v, mask, sinks, scale = _attn_parts(inputs, case)
    return {"out": eager_sinks_fn(inputs["q"], k, v, mask, None, scale)}


def sdpa_window_off_by_one(launch, inputs, outputs, case):
    from gpu_impls.torch.attention import eager_sinks_fn

    k, v, mask, sinks, scale = _attn_parts(inputs, case)
    from gpu_impls.torch.attention import attended_mask

    wide = dict(case.params, window=case.params["window"] + 1 if case.params["window"] else 0)
    mask = attended_mask(inputs["lengths"], k.shape[2], wide)
    return {"out": eager_sinks_fn(inputs["q"], k, v, mask, sinks, scale)}


def sdpa_gqa_modulo(launch, inputs, outputs, case):
    from gpu_impls.torch.attention import eager_sinks_fn

    k, v, mask, sinks, scale = _attn_parts(inputs, case)
    g = inputs["q"].shape[1] // k.shape[1]
    # tiled: copy j of kv head h sits at j * Hkv + h, so query head i meets kv head i % Hkv;
    # eager_sinks_fn's own repeat_interleave is then the identity (g = 1)
    k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
    return {"out": eager_sinks_fn(inputs["q"], k, v, mask, sinks, scale)}


def sdpa_scores_in_t(launch, inputs, outputs, case):
    import torch

    k, v, mask, sinks, scale = _attn_parts(inputs, case)
    q = inputs["q"]
    g = q.shape[1] // k.shape[1]
    k32 = k.float().repeat_interleave(g, dim=1)
    s = (torch.einsum("bhd,bhtd->bht", q.float(), k32) * scale).to(q.dtype).float()
    s = s.masked_fill(~mask[:, None, :], float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float()[None, :, None].expand(s.shape[0], -1, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :k.shape[2]]
    v32 = v.float().repeat_interleave(g, dim=1)
    return {"out": torch.einsum("bht,bhtd->bhd", p, v32).to(q.dtype)}


def combine_no_rescale(o, m, l, sinks, normalized, out_dtype):
    """attn_combine with every c_s = 1 (the sink, when there is one, at e^0 too)."""
    import torch

    o, l = o.float(), l.float()
    total = l.sum(dim=-1)
    if sinks is not None:
        total = total + 1.0
    acc = ((l if normalized else torch.ones_like(l))[..., None] * o).sum(dim=-2)
    return (acc / total[..., None]).to(out_dtype), torch.log(total) + m.float().max(dim=-1).values


def mutant_combine(launch, inputs, outputs, case):
    sinks = inputs["sinks"] if case.params["sinks"] else None
    out, lse = combine_no_rescale(inputs["o"], inputs["m"], inputs["l"], sinks,
                                  bool(case.params["normalized"]), outputs["out"].dtype)
    return {"out": out, "lse": lse}


def split_kv_no_rescale(launch, inputs, outputs, case):
    from gpu_impls.torch.attention import split_partials

    k, v, mask, sinks, scale = _attn_parts(inputs, case)
    o, m, l = split_partials(inputs["q"], k, v, mask, launch["split"].extra["splits"], scale)
    return {"out": combine_no_rescale(o, m, l, sinks, False, inputs["q"].dtype)[0]}


def prefill_causal_top_left(launch, inputs, outputs, case):
    from gpu_impls.torch.attention import eager_packed, packed_mask
    from oracle.attention import scale_of

    mask = packed_mask(case, inputs["q"].device, causal_top_left=bool(case.params["causal"]))
    return {"out": eager_packed(inputs["q"], inputs["k"], inputs["v"], mask, scale_of(case))}


def _attention_mutants():
    from gpu_impls.torch.attention import EAGER_CONTRACT, split_kv_launches

    return (
        Impl("sdpa_decode", "torch", "mutant_sdpa_drop_sink", sdpa_drop_sink, EAGER_CONTRACT),
        Impl("sdpa_decode", "torch", "mutant_sdpa_window_off_by_one", sdpa_window_off_by_one,
             EAGER_CONTRACT),
        Impl("sdpa_decode", "torch", "mutant_sdpa_gqa_modulo", sdpa_gqa_modulo,
             EAGER_CONTRACT),
        Impl("sdpa_decode", "torch", "mutant_sdpa_scores_in_t", sdpa_scores_in_t,
             EAGER_CONTRACT),
        Impl("attn_combine", "torch", "mutant_combine_no_rescale", mutant_combine),
        Impl("sdpa_decode", "torch", "mutant_split_kv_no_rescale", split_kv_no_rescale,
             launches=split_kv_launches(paged=False)),
        Impl("sdpa_prefill_varlen", "torch", "mutant_prefill_causal_top_left",
             prefill_causal_top_left, EAGER_CONTRACT),
    )


register(*(m for m in _attention_mutants() if m.id not in _existing))


# --- kparity's CUDA split-KV decode (gpu_impls/cuda/kp_attention.py) -----------------------------
# | cuda:mutant_kp_sdpa_drop_sink         | the learned sink left out of the denominator       |
# | cuda:mutant_kp_sdpa_window_off_by_one | the window attends window + 1 keys                 |
# | cuda:mutant_kp_sdpa_gqa_modulo        | query head h reads kv head h % Hkv                 |
# | cuda:mutant_kp_sdpa_no_rescale        | neither the online softmax nor the combine rescale |
# | cuda:mutant_kp_combine_no_rescale     | attn_combine's splits added at e^0                 |
KP_ATTENTION_MUTANTS = (
    ("cuda:kp_sdpa_decode", "mutant_kp_sdpa_drop_sink", "KPARITY_MUTANT_DROP_SINK"),
    ("cuda:kp_sdpa_decode", "mutant_kp_sdpa_window_off_by_one",
     "KPARITY_MUTANT_WINDOW_OFF_BY_ONE"),
    ("cuda:kp_sdpa_decode", "mutant_kp_sdpa_gqa_modulo", "KPARITY_MUTANT_GQA_MOD"),
    ("cuda:kp_sdpa_decode", "mutant_kp_sdpa_no_rescale", "KPARITY_MUTANT_NO_RESCALE"),
    ("cuda:kp_attn_combine", "mutant_kp_combine_no_rescale", "KPARITY_MUTANT_NO_RESCALE"),
)
register_cuda_mutants(KP_ATTENTION_MUTANTS)


# --- FFAI decode attention on CUDA (issue 27) ----------------------------------------------------
#
# | mutant                                 | bug (kernels/ffai_attention.cuh)                    |
# |----------------------------------------|-----------------------------------------------------|
# | cuda:mutant_ffai_drop_sink             | the learned sink never enters max or denominator    |
# | cuda:mutant_ffai_window_off_by_one     | the window starts one key early (window + 1 keys)   |
# | cuda:mutant_ffai_gqa_modulo            | query head h reads kv head h % Hkv                  |
# | cuda:mutant_2pass_{no_rescale,         | the two-pass pair: pass 2 adds the partials without |
# |   drop_sink, window_off_by_one,        | e^(m_j - M); and the three bugs above               |
# |   gqa_modulo}                          |                                                     |
# | cuda:mutant_pass2_no_rescale           | pass 2 alone (attn_combine) without the rescale     |

FFAI_MUTANTS = (
    ("cuda:ffai_sdpa_decode_d64", "mutant_ffai_drop_sink", "KPARITY_MUTANT_DROP_SINK"),
    ("cuda:ffai_sdpa_decode_d64", "mutant_ffai_window_off_by_one",
     "KPARITY_MUTANT_WINDOW_OFF_BY_ONE"),
    ("cuda:ffai_sdpa_decode", "mutant_ffai_gqa_modulo", "KPARITY_MUTANT_GQA_MOD"),
    ("cuda:sdpa_decode_2pass", "mutant_2pass_no_rescale", "KPARITY_MUTANT_NO_RESCALE"),
    ("cuda:sdpa_decode_2pass", "mutant_2pass_drop_sink", "KPARITY_MUTANT_DROP_SINK"),
    ("cuda:sdpa_decode_2pass", "mutant_2pass_window_off_by_one",
     "KPARITY_MUTANT_WINDOW_OFF_BY_ONE"),
    ("cuda:sdpa_decode_2pass", "mutant_2pass_gqa_modulo", "KPARITY_MUTANT_GQA_MOD"),
    ("cuda:sdpa_decode_2pass_pass2", "mutant_pass2_no_rescale", "KPARITY_MUTANT_NO_RESCALE"),
)
register_cuda_mutants(FFAI_MUTANTS)


# --- Gated DeltaNet, the recurrence and the decode step (issue 29) ------------------------------
#
# | mutant (gdn_step; _recurrent_: gdn_recurrent) | bug, in torch's step                          |
# |-----------------------------------------------|-----------------------------------------------|
# | torch:mutant_gdn_decay_after_update           | S = exp(g)·(S + β(v − S k)kᵀ): the decay after |
# | torch:mutant_gdn_recurrent_decay_after_update | the update, the delta off the undecayed S     |
# | torch:mutant_gdn_beta_on_k                    | k·β in place of k, the delta unscaled:        |
# | torch:mutant_gdn_recurrent_beta_on_k          | S += (v − S βk)(βk)ᵀ (right where β is 0 or 1) |


def gdn_decay_after_update(state, q, k, v, g, beta):
    kr = k[..., None, :]
    u = (v - (state * kr).sum(-1)) * beta[..., None]
    state = (state + u[..., None] * kr) * g.exp()[..., None, None]
    return (state * q[..., None, :]).sum(-1), state


def gdn_beta_on_k(state, q, k, v, g, beta):
    state = state * g.exp()[..., None, None]
    kb = (k * beta[..., None])[..., None, :]
    u = v - (state * kb).sum(-1)
    state = state + u[..., None] * kb
    return (state * q[..., None, :]).sum(-1), state


def _gdn_mutants():
    from functools import partial

    from gpu_impls.torch.gdn import _recurrent, _step

    for bug, fn in (("decay_after_update", gdn_decay_after_update),
                    ("beta_on_k", gdn_beta_on_k)):
        yield Impl("gdn_step", "torch", f"mutant_gdn_{bug}", partial(_step, step=fn))
        yield Impl("gdn_recurrent", "torch", f"mutant_gdn_recurrent_{bug}",
                   partial(_recurrent, step=fn))


GDN_MUTANTS = tuple(_gdn_mutants())
register(*(m for m in GDN_MUTANTS if m.id not in _existing))

# --- the chunked GDN pipeline (issue 29) ------------------------------------------------------
#
# | mutant                              | bug                                                    |
# |-------------------------------------|--------------------------------------------------------|
# | torch:mutant_gdn_o_strict_mask      | chunk_o's causal mask without its diagonal (kkt's `>`  |
# |                                     | where chunk_o's is `>=`): token i misses its own value |
# | torch:mutant_gdn_o_tile_f32         | the A tile kept in f32 where the contract rounds it to |
# |                                     | T before the closing dot (bf16 and f16 only)           |
# | torch:mutant_gdn_o_inter_in_t       | the reverse: the inter-chunk term q·h rounded to T     |
# |                                     | before the sum, where the contract keeps it in f32     |
# | torch:mutant_gdn_h_unscaled_state   | chunk_h carries the state into the next chunk without  |
# |                                     | exp(gc_last): S = S + vdecᵀ k                           |


def _gdn_chunk_o(inputs, case, strict=False, round_tile=True, round_inter=False):
    """The seed's chunk_o formula (`gpu_impls/torch/gdn_chunked.py`) with one bug switched on."""
    from gpu_impls.torch.gdn_chunked import _t, chunks, decay_tile, per_value_head, unchunk
    from oracle.gdn_chunked import scale_of

    c, dtype, gc = case.params["chunk"], _t(case), inputs["gc"].float()
    hv = gc.shape[2]
    qc = chunks(per_value_head(inputs["q"], hv).float(), c)
    kc = chunks(per_value_head(inputs["k"], hv).float(), c)
    gcc = chunks(gc, c, edge=True)
    inter = (qc.transpose(2, 3) @ inputs["h"].float().transpose(-1, -2)).transpose(2, 3)
    inter = inter * gcc.exp()[..., None]
    if round_inter:
        inter = inter.to(dtype).float()
    tile = (qc.transpose(2, 3) @ kc.permute(0, 1, 3, 4, 2)).transpose(2, 3)
    tile = tile * decay_tile(gcc, strict)
    if round_tile:
        tile = tile.to(dtype).float()
    intra = (tile.transpose(2, 3) @ chunks(inputs["v_new"].float(), c).transpose(2, 3))
    o = unchunk((inter + intra.transpose(2, 3)) * scale_of(case), gc.shape[1])
    return {"o": o.to(dtype)}


def gdn_o_strict_mask(launch, inputs, outputs, case):
    return _gdn_chunk_o(inputs, case, strict=True)


def gdn_o_tile_f32(launch, inputs, outputs, case):
    return _gdn_chunk_o(inputs, case, round_tile=False)


def gdn_o_inter_in_t(launch, inputs, outputs, case):
    return _gdn_chunk_o(inputs, case, round_inter=True)


def gdn_h_unscaled_state(launch, inputs, outputs, case):
    import torch

    from gpu_impls.torch.gdn_chunked import _t, chunks, per_value_head, unchunk

    c, dtype, gc = case.params["chunk"], _t(case), inputs["gc"].float()
    t, hv = gc.shape[1], gc.shape[2]
    kc = chunks(per_value_head(inputs["k"], hv).float(), c)
    wc, uc = chunks(inputs["w"].float(), c), chunks(inputs["u"].float(), c)
    gcc = chunks(gc, c, edge=True)
    s, hs, v_new = inputs["h0"].float().clone(), [], []
    for n in range(kc.shape[1]):
        hs.append(s)
        vn = uc[:, n] - torch.einsum("bihk,bhvk->bihv", wc[:, n], s.to(dtype).float())
        v_new.append(vn)
        last = min(c, t - n * c) - 1
        d = (gcc[:, n, last][:, None] - gcc[:, n]).exp()
        d = d * (torch.arange(c) <= last)[None, :, None]
        vdec = (vn * d[..., None]).to(dtype).float()
        s = s + torch.einsum("bihv,bihk->bhvk", vdec, kc[:, n])  # the bug: no exp(gc_last)
    return {"h": torch.stack(hs, dim=1).to(dtype), "v_new": unchunk(torch.stack(v_new, 1), t)
            .to(dtype), "state": s}


# rounding to f32 is a no-op: the tile and inter mutants exist in the half dtypes only
HALF = Contract(dtypes=("f16", "bf16"))
GDN_CHUNK_MUTANTS = (
    Impl("gdn_chunk_o", "torch", "mutant_gdn_o_strict_mask", gdn_o_strict_mask),
    Impl("gdn_chunk_o", "torch", "mutant_gdn_o_tile_f32", gdn_o_tile_f32, HALF),
    Impl("gdn_chunk_o", "torch", "mutant_gdn_o_inter_in_t", gdn_o_inter_in_t, HALF),
    Impl("gdn_chunk_h", "torch", "mutant_gdn_h_unscaled_state", gdn_h_unscaled_state),
)
register(*(m for m in GDN_CHUNK_MUTANTS if m.id not in _existing))

# --- Gated DeltaNet on CUDA (issue 29; gpu_impls/cuda/gdn.py) -----------------------------------
#
# | mutant                                     | bug                                             |
# |--------------------------------------------|-------------------------------------------------|
# | cuda:mutant_gdn_chunk_o_exclusive_mask     | chunk_o's causal mask drops the diagonal (i > j, |
# |                                            | kkt's strict mask, where chunk_o's is i >= j)   |
# | cuda:mutant_kp_gdn_step_decay_after_update | the step decays the state after the rank-1      |
# |                                            | update (the delta reads the undecayed state)    |

GDN_CUDA_MUTANTS = (
    ("cuda:gdn_chunk_o", "mutant_gdn_chunk_o_exclusive_mask", "KPARITY_MUTANT_EXCLUSIVE_MASK"),
    ("cuda:kp_gdn_step", "mutant_kp_gdn_step_decay_after_update",
     "KPARITY_MUTANT_DECAY_AFTER_UPDATE"),
)
register_cuda_mutants(GDN_CUDA_MUTANTS)

# --- Gated DeltaNet's intra-chunk stages on CUDA (issue 29; gpu_impls/cuda/gdn_intra.py) --------
#
# | mutant                            | bug                                                     |
# |-----------------------------------|---------------------------------------------------------|
# | cuda:mutant_kp_gdn_kkt_decay_sign | kkt's decay applied as exp(gc_j − gc_i): the ratio      |
# |                                   | inverted (>= 1 below the diagonal, inf on overflow)     |

GDN_INTRA_CUDA_MUTANTS = (
    ("cuda:kp_gdn_kkt", "mutant_kp_gdn_kkt_decay_sign", "KPARITY_MUTANT_DECAY_SIGN"),
)
register_cuda_mutants(GDN_INTRA_CUDA_MUTANTS)

# | mutant (gdn_chunk_h)                       | bug                                             |
# |--------------------------------------------|-------------------------------------------------|
# | cuda:mutant_kp_gdn_chunk_h_unscaled_state  | the state carried into the next chunk without   |
# |                                            | exp(gc_last): S = S + vdecᵀ k (issue 29)        |

GDN_CHUNK_H_CUDA_MUTANTS = (
    ("cuda:kp_gdn_chunk_h", "mutant_kp_gdn_chunk_h_unscaled_state",
     "KPARITY_MUTANT_UNSCALED_STATE"),
)
register_cuda_mutants(GDN_CHUNK_H_CUDA_MUTANTS)

# --- Mamba-2's causal conv1d (issue 30; gpu_impls/torch/conv1d.py) ------------------------------
#
# | mutant                                  | bug                                               |
# |-----------------------------------------|---------------------------------------------------|
# | torch:mutant_conv_step_double_shift     | the step's state shift (state[k] = state[k+1])    |
# |                                         | runs twice before x is written: [s0, s1, s2] ->   |
# |                                         | [s2, s2, x] (FFAI's Nemotron decode bug). From a  |
# |                                         | zero state that is the right [0, 0, x], and y is  |
# |                                         | formed before the shift: a first token from a     |
# |                                         | fresh sequence passes; so does any W <= 3         |
# | torch:mutant_conv_state_skips_last_token| the prefill's final state leaves out the last     |
# |                                         | token (its update loop stops at T-1); one token   |
# |                                         | goes to the decode step (vLLM's dispatch), which  |
# |                                         | is right: a one-token prefill passes              |


def conv_step_double_shift(launch, inputs, outputs, case):
    from gpu_impls.torch.conv1d import _conv1d_causal_step

    out = _conv1d_causal_step(launch, inputs, outputs, case)
    state = inputs["conv_state_in"].clone()
    for _ in range(2):  # the bug: the shift loop run twice (the kernel's and its caller's)
        state[:, :-1] = state[:, 1:].clone()
    state[:, -1] = inputs["x"]
    return {**out, "conv_state_out": state}


def conv_state_skips_last_token(launch, inputs, outputs, case):
    import torch

    from gpu_impls.torch.conv1d import _conv1d_causal

    out = _conv1d_causal(launch, inputs, outputs, case)
    tokens = case.dims["tokens"]
    if tokens == 1:  # one token: the decode step's path, right
        return out
    xx = torch.cat([inputs["conv_state_in"], inputs["x"]], dim=1)
    return {**out, "conv_state": xx[:, tokens - 1:-1]}  # the bug: the window ends at T-1


CONV_MUTANTS = (
    Impl("conv1d_causal_step", "torch", "mutant_conv_step_double_shift", conv_step_double_shift),
    Impl("conv1d_causal", "torch", "mutant_conv_state_skips_last_token",
         conv_state_skips_last_token),
)
register(*(m for m in CONV_MUTANTS if m.id not in _existing))

# --- the Mamba-2 scans (issue 30; gpu_impls/torch/ssd.py) ----------------------------------------
#
# Each is invisible at position 0 (one token from a zero state, or the first packed sequence, or
# the first chunk), as the seed's conv ring shifted twice was, except the group index (visible
# from token 0 wherever 1 < G < H; a G = 1 test, Mamba-2-2.7B's shape, misses it).
#
# | mutant                                   | bug                                                 |
# |------------------------------------------|-----------------------------------------------------|
# | torch:mutant_ssd_softplus_twice          | the decay re-applies softplus to the activated dt:  |
# |                                          | exp(softplus(dt)·A); the input term dt·x·B is right |
# | torch:mutant_ssd_varlen_no_reset         | the state is not reset at a sequence start: the     |
# |                                          | previous sequence's final state carries over        |
# | torch:mutant_ssd_chunked_d_first_chunk   | the D skip added with the initial state's load, in  |
# |                                          | chunk 0 only: dropped from token 64 (chunk 64) on   |
# | torch:mutant_ssd_group_modulo            | head h reads B/C group h % G, not h // (H / G)      |


def ssd_softplus_twice_step(state, x, dt_raw, dt_bias, A, b, c, D, z, case):
    """torch:ssd_scan's step with the decay's dt activated twice."""
    import torch
    import torch.nn.functional as F

    from gpu_impls.torch.ssd import per_head, time_step

    heads, x = x.shape[1], x.float()
    dt = time_step(dt_raw, dt_bias, case)
    decay = torch.exp(F.softplus(dt) * A)  # the bug: dt is already softplus(dt_raw + dt_bias)
    b, c = per_head(b, heads), per_head(c, heads)
    state = state * decay[..., None, None] + (dt[..., None] * x)[..., None] * b[..., None, :]
    y = (state * c[..., None, :]).sum(-1) + D[:, None] * x
    return (y * F.silu(z.float()) if z is not None else y), state


def ssd_group_modulo_step(state, x, dt_raw, dt_bias, A, b, c, D, z, case):
    """torch:ssd_scan's step with head h reading B/C group h % G."""
    import torch

    from gpu_impls.torch.ssd import step

    heads, groups = x.shape[1], b.shape[-2]
    modulo = torch.arange(heads) % groups  # the bug: h // (heads // groups) is the group
    # tile the groups so that torch's own step (repeat_interleave) picks group h % G for head h
    b, c = (v[..., modulo, :] for v in (b, c))
    return step(state, x, dt_raw, dt_bias, A, b, c, D, z, case)


def ssd_chunked_d_first_chunk(launch, inputs, outputs, case):
    """torch:ssd_chunked with D·x added in chunk 0 only."""
    import torch

    from gpu_impls.torch.ssd import chunked

    y, state = chunked(inputs, case, inputs["h0"])
    x = inputs["x"].float()
    first = (torch.arange(x.shape[1]) < case.params["chunk"])[None, :, None, None]
    y = y - inputs["D"][:, None] * x * ~first  # the bug: the skip is dropped past chunk 0
    return {"y": y.to(inputs["x"].dtype), "state": state.contiguous()}


def _ssd_mutants():
    from functools import partial

    from gpu_impls.torch.ssd import _scan, _varlen

    yield Impl("ssd_scan", "torch", "mutant_ssd_softplus_twice",
               partial(_scan, step=ssd_softplus_twice_step))
    yield Impl("ssd_scan_varlen", "torch", "mutant_ssd_varlen_no_reset",
               partial(_varlen, reset=False))
    yield Impl("ssd_chunked", "torch", "mutant_ssd_chunked_d_first_chunk",
               ssd_chunked_d_first_chunk)
    yield Impl("ssd_scan", "torch", "mutant_ssd_group_modulo",
               partial(_scan, step=ssd_group_modulo_step))


SSD_MUTANTS = tuple(_ssd_mutants())
register(*(m for m in SSD_MUTANTS if m.id not in _existing))

# --- Mamba-2 on CUDA (issue 30; gpu_impls/cuda/ssm.py) ------------------------------------------
#
# The same bugs as the torch mutants above, in kparity's kernels (compile-time defines): each
# invisible at position 0 (one token from a zero state), caught by the gate's cases that carry a
# state (tests/test_gpu_ssm.py shows both).
#
# | mutant                                      | bug                                            |
# |---------------------------------------------|------------------------------------------------|
# | cuda:mutant_kp_ssm_step_softplus_twice      | kp_ssm_step's decay exp(softplus(dt) A): dt    |
# |                                             | activated twice (the input term keeps dt)      |
# | cuda:mutant_kp_conv_step_double_shift       | kp_conv1d_causal_step shifts the ring twice:   |
# |                                             | [s0, s1, s2] -> [s2, s2, x] (right at W <= 3)  |
# | cuda:mutant_kp_conv_state_skips_last_token  | kp_conv1d_causal's final state is the window   |
# |                                             | before the last token, where T > 1             |

SSM_CUDA_MUTANTS = (
    ("cuda:kp_ssm_step", "mutant_kp_ssm_step_softplus_twice", "KPARITY_MUTANT_SOFTPLUS_TWICE"),
    ("cuda:kp_conv1d_causal_step", "mutant_kp_conv_step_double_shift",
     "KPARITY_MUTANT_CONV_DOUBLE_SHIFT"),
    ("cuda:kp_conv1d_causal", "mutant_kp_conv_state_skips_last_token",
     "KPARITY_MUTANT_CONV_STATE_SKIPS_LAST"),
)
register_cuda_mutants(SSM_CUDA_MUTANTS)

# --- kparity's chunked SSD on CUDA (issue 30; gpu_impls/cuda/ssd.py) -----------------------------
#
# | mutant                                  | bug                                                |
# |-----------------------------------------|----------------------------------------------------|
# | cuda:mutant_kp_ssd_chunked_group_modulo | head h reads B/C group h % G, not h // (H / G), in |
# |                                         | the chunk states and in y (C, C·Bᵀ): visible from  |
# |                                         | token 0 wherever 1 < G < H (the edge heads)        |
# | cuda:mutant_kp_ssd_chunked_drop_d_skip  | y without the D·x skip                             |

SSD_CUDA_MUTANTS = (
    ("cuda:kp_ssd_chunked", "mutant_kp_ssd_chunked_group_modulo", "KPARITY_MUTANT_GROUP_MODULO"),
    ("cuda:kp_ssd_chunked", "mutant_kp_ssd_chunked_drop_d_skip", "KPARITY_MUTANT_DROP_D_SKIP"),
)
register_cuda_mutants(SSD_CUDA_MUTANTS)

# --- FP4 quantization (issue 31; gpu_impls/torch/fp4.py) ---------------------------------------
#
# | mutant                              | bug                                                   |
# |-------------------------------------|-------------------------------------------------------|
# | torch:mutant_fp4_ties_away          | NVFP4 E2M1 rounding half away from zero (0.75 -> 1,   |
# |                                     | 1.25 -> 1.5, 2.5 -> 3, 5 -> 6): the e2m1_ties cases   |
# | torch:mutant_fp4_unscaled_block_max | NVFP4 block scale e4m3(vmax / 6) from the unscaled    |
# |                                     | block max (no gs_enc), elements still x gs_enc / sf   |


def _fp4_mutant(**bug):
    def run(launch, inputs, outputs, case):
        from gpu_impls.torch.fp4 import _nvfp4

        codes, scales, ts = _nvfp4(inputs["x"], **bug)
        return {"codes": codes, "scales": scales, "tensor_scale": ts}
    return run


def _fp4_contract():
    from gpu_impls.torch.fp4 import format_is, rules, whole_blocks

    return Contract(invariants=(format_is("nvfp4"), whole_blocks(), rules("exact")))


FP4_MUTANTS = (
    Impl("fp4_quantize", "torch", "mutant_fp4_ties_away", _fp4_mutant(ties_up=True),
         _fp4_contract()),
    Impl("fp4_quantize", "torch", "mutant_fp4_unscaled_block_max",
         _fp4_mutant(unscaled_block_max=True), _fp4_contract()),
)
register(*(m for m in FP4_MUTANTS if m.id not in _existing))

# The same two bugs in cuda:kp_fp4_quantize (kernels/kp_fp4_quantize.cu), GPU gate:
# | cuda:mutant_kp_fp4_ties_away          | E2M1 ties half away from zero (NVFP4 and MXFP4)     |
# | cuda:mutant_kp_fp4_unscaled_block_max | the NVFP4 block scale from the block max without    |
# |                                       | gs_enc (the elements still x * enc)                 |
FP4_CUDA_MUTANTS = (
    ("cuda:kp_fp4_quantize", "mutant_kp_fp4_ties_away", "KPARITY_MUTANT_FP4_TIES_AWAY"),
    ("cuda:kp_fp4_quantize", "mutant_kp_fp4_unscaled_block_max",
     "KPARITY_MUTANT_FP4_UNSCALED_BLOCK_MAX"),
)
register_cuda_mutants(FP4_CUDA_MUTANTS)

# --- MoE grouped GEMM (issue 31; gpu_impls/torch/moe_gemm.py) -------------------------------------
#
# | mutant                                 | bug                                                  |
# |----------------------------------------|------------------------------------------------------|
# | torch:mutant_moe_segment_off_by_one    | every interior offset read one row early: the last   |
# |                                        | row of each expert's segment is multiplied by the    |
# |                                        | NEXT (non-empty) expert's weights                    |


def moe_segment_off_by_one(launch, inputs, outputs, case):
    from gpu_impls.torch.moe_gemm import _grouped_linear

    off = inputs["offsets"].clone()
    off[1:-1] = (off[1:-1] - 1).clamp(min=0)
    return _grouped_linear(launch, {**inputs, "offsets": off}, outputs, case)


MOE_MUTANTS = (
    Impl("moe_grouped_gemm", "torch", "mutant_moe_segment_off_by_one", moe_segment_off_by_one),
)
register(*(m for m in MOE_MUTANTS if m.id not in _existing))

# | cuda:mutant_kp_moe_tile_first_row      | kp_moe_grouped_gemm: every row tile of an expert     |
# |                                        | starts at the expert's first row: right wherever     |
# |                                        | each expert fits one tile (decode), rows past an     |
# |                                        | expert's first tile never written (the hot routing)  |

MOE_CUDA_MUTANTS = (
    ("cuda:kp_moe_grouped_gemm", "mutant_kp_moe_tile_first_row", "KPARITY_MUTANT_TILE_FIRST_ROW"),
)
register_cuda_mutants(MOE_CUDA_MUTANTS)

# --- MoE scatter-add (issue 31; gpu_impls/torch/moe_route.py) ---------------------------------------
#
# | mutant                                 | bug                                                  |
# |----------------------------------------|------------------------------------------------------|
# | torch:mutant_moe_scatter_add_shuffled  | an atomic scatter-add: the rows added in a fresh     |
# |                                        | random order on every call (arrival order), declared |
# |                                        | deterministic: inside the bound on every run, caught |
# |                                        | by `check --repeat 2`                                |


def moe_scatter_add_shuffled(launch, inputs, outputs, case):
    import torch

    t, k = case.dims["tokens"], case.dims["top_k"]
    y, perm = inputs["y_sorted"], inputs["perm"].long()
    src = y.float() * inputs["weights"].float().reshape(-1)[perm].unsqueeze(-1)
    # OS entropy, not torch's generator: a run's seeding must not make the order repeat
    order = torch.from_numpy(np.random.default_rng().permutation(perm.numel()))
    out = torch.zeros(t, y.shape[-1], dtype=torch.float32, device=y.device)
    out.index_add_(0, (perm // k)[order], src[order])
    return {"out": out.to(y.dtype)}


MOE_ROUTE_MUTANTS = (
    Impl("moe_scatter_add", "torch", "mutant_moe_scatter_add_shuffled", moe_scatter_add_shuffled),
)
register(*(m for m in MOE_ROUTE_MUTANTS if m.id not in _existing))

# --- MoE routing on CUDA (issue 31; gpu_impls/cuda/moe_route.py) ---------------------------------
#
# | mutant                                  | bug                                                 |
# |-----------------------------------------|-----------------------------------------------------|
# | cuda:mutant_kp_moe_scatter_add_atomic   | kp_moe_scatter_add as an atomic scatter: a thread   |
# |                                         | per sorted row atomicAdds its products into an f32  |
# |                                         | accumulator (arrival order), stored once; declared  |
# |                                         | deterministic: inside the bound on every run, its   |
# |                                         | bits differ between runs (tests/test_gpu_moe_route) |

MOE_ROUTE_CUDA_MUTANTS = (
    ("cuda:kp_moe_scatter_add", "mutant_kp_moe_scatter_add_atomic",
     "KPARITY_MUTANT_ATOMIC_SCATTER_ADD"),
)
register_cuda_mutants(MOE_ROUTE_CUDA_MUTANTS)

# --- fp4_gemv (issue 31; gpu_impls/torch/fp4.py) ------------------------------------------------
#
# | mutant                               | bug                                                  |
# |--------------------------------------|------------------------------------------------------|
# | torch:mutant_fp4_gemv_scale_off_by_one | block b's codes times block b+1's scale (the last  |
# |                                      | block wraps to block 0)                              |


def fp4_gemv_scale_off_by_one(launch, inputs, outputs, case):
    from gpu_impls.torch.fp4 import _gemv

    return _gemv(launch, {**inputs, "scales": inputs["scales"].roll(-1, dims=-1)}, outputs, case)


def _fp4_gemv_mutant():
    from gpu_impls.torch.fp4 import whole_blocks

    return Impl("fp4_gemv", "torch", "mutant_fp4_gemv_scale_off_by_one",
                fp4_gemv_scale_off_by_one, Contract(invariants=(whole_blocks("in"),)))


_m = _fp4_gemv_mutant()
if _m.id not in _existing:
    register(_m)
