"""RMSNorm family on CUDA: the metaltile / FFAI seed kernels ported to `kernels/*.cu`.

Math (`oracle/norms.py`), per row of length n, in f32 with one rounding to T at the store:

    inv   = rsqrt(sum_i x_i^2 / n + eps)
    out_i = T(x_i * inv * (w_i + weight_offset))        weight_offset 0 (Llama/Qwen), 1 (Gemma)

One block per row. The contracts are the seeds' DISPATCH INVARIANTS: the block size (TPG) is
derived from the row length, never taken from the caller, and every rule is checked before any
launch. The per-element kernels fix n = TPG * k (k = 4, or 2 for `_small`), so n must split
evenly, TPG must be whole warps (at least one) and at most 1024; `_wide` strides over any n.
"""

from __future__ import annotations


import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch, nearest_multiples, rounding_once
from gpu_impls.cuda._module import cuda_impl, kernel

# (source file in kernels/, kernel template): what `nvcc_check` instantiates for F32, F16, BF16.
KERNELS = [
    ("mt_rms_norm.cu", "mt_rms_norm"),
    ("mt_rms_norm_small.cu", "mt_rms_norm_small"),
    ("mt_rms_norm_wide.cu", "mt_rms_norm_wide"),
    ("mt_gated_mixer_norm.cu", "mt_gated_mixer_norm"),
    ("ffai_rms_norm_residual.cu", "ffai_rms_norm_residual"),
    ("mt_add_rms_norm.cu", "mt_add_rms_norm"),
]
WIDE_TPG = 1024  # the seed wrapper's choice for mt_rms_norm_wide
MAX_TPG = 1024   # threads per block, CUDA's limit (and Apple's)


# --- geometry: derived from the dims alone ----------------------------------------------------

def _geometry(rows: int, n: int, tpg: int, **extra) -> tuple[dict, Launch]:
    """One block of `tpg` threads per row; the row length `n` rides along for the launch."""
    return ({"tpg": tpg, "rows": rows},
            Launch(grid=(rows, 1, 1), block=(tpg, 1, 1), extra={"n": n, **extra}))


def _per_thread_geometry(per_thread: int):
    """TPG = n / per_thread: thread t owns elements per_thread*t ... per_thread*t + per_thread-1."""
    def geometry(dims, params):
        return _geometry(dims["rows"], dims["n"], dims["n"] // per_thread, per_thread=per_thread)
    return geometry


def _wide_geometry(dims, params):
    return _geometry(dims["rows"], dims["n"], WIDE_TPG)


def _per_head_geometry(dims, params):
    """rows = batch*tokens*heads, n = head_dim. As the seed's per-head test: head_dim % 128 == 0
    runs mt_rms_norm (TPG = head_dim/4), otherwise mt_rms_norm_small (TPG = head_dim/2)."""
    head_dim = dims["head_dim"]
    per_thread = 4 if head_dim % 128 == 0 else 2
    rows = dims["batch"] * dims["tokens"] * dims["heads"]
    return _geometry(rows, head_dim, head_dim // per_thread, per_thread=per_thread)


# --- invariants ---------------------------------------------------------------------------------

def _split_rule(dim: str, per_thread: int, fix, bad: int) -> Invariant:
    return Invariant(
        f"{dim} % {per_thread} == 0", lambda ns: ns[dim] % per_thread == 0,
        f"each thread owns {per_thread} consecutive elements ({dim} = TPG * {per_thread}), so the "
        f"last {dim} % {per_thread} elements of every row would be neither normalised nor stored",
        fix, {dim: bad}, (dim, "tpg"))


def _tpg_rules(dim: str, fix, bad_min: int, bad_multiple: int, bad_max: int) -> tuple:
    """The seed's three rules on the derived TPG; `bad_*` are values of `dim` breaking each."""
    shows = (dim, "tpg")
    return (
        Invariant("tpg >= 32", lambda ns: ns["tpg"] >= 32,
                  "the reduction needs at least one full warp: its full-mask shuffles need 32 "
                  "live lanes (on Metal the cross-simdgroup combine reads no partial sums and "
                  "the row's sum of squares silently collapses to 0)",
                  fix, {dim: bad_min}, shows),
        Invariant("tpg % 32 == 0", lambda ns: ns["tpg"] % 32 == 0,
                  "the reduction combines whole warps: a trailing partial warp's shuffles read "
                  "lanes that do not exist and its partial sum is dropped",
                  fix, {dim: bad_multiple}, shows),
        Invariant(f"tpg <= {MAX_TPG}", lambda ns: ns["tpg"] <= MAX_TPG,
                  f"a block holds at most {MAX_TPG} threads, so the launch would fail",
                  fix, {dim: bad_max}, shows),
    )


def _quad_invariants(fix) -> tuple:
    """TPG = n/4 kernels: n % 128 == 0 and 128 <= n <= 4096, one rule at a time. Violations:
    1026 (TPG 256: only the split breaks, two elements silently dropped), 64 (TPG 16, the seed's
    head_dim-64 trap), 1000 (TPG 250), 4224 (TPG 1056)."""
    return (_split_rule("n", 4, fix, 1026), *_tpg_rules("n", fix, 64, 1000, 4224))


def _quad_fix(ns) -> str:
    return f"n = {nearest_multiples(ns['n'], 128, 128, 4 * MAX_TPG)} (a multiple of 128, <= 4096)"


def _rms_norm_fix(ns) -> str:
    return (f"n = {nearest_multiples(ns['n'], 128, 128, 4 * MAX_TPG)}, "
            "or use cuda:mt_rms_norm_wide (any n)")


def _small_fix(ns) -> str:
    return (f"n = {nearest_multiples(ns['n'], 64, 64, 2 * MAX_TPG)}, or use cuda:mt_rms_norm "
            "(n % 128 == 0, n <= 4096) or cuda:mt_rms_norm_wide (any n)")


def _head_dim_fix(ns) -> str:
    """Multiples of 64 up to 2048 (either kernel), then of 128 up to 4096 (mt_rms_norm only)."""
    d = ns["head_dim"]
    near = (nearest_multiples(d, 64, 64, 2 * MAX_TPG) if d <= 2 * MAX_TPG
            else nearest_multiples(d, 128, 2 * MAX_TPG, 4 * MAX_TPG))
    return f"head_dim = {near}"


# The kernels round once, at the store; rms_norm's rounding="normed" (HF Llama) is another impl's.
ONCE = rounding_once("torch:rms_norm_llama for rounding='normed'")

QUAD = Contract(invariants=_quad_invariants(_quad_fix), geometry=_per_thread_geometry(4))
RMS_NORM = Contract(invariants=(*ONCE, *_quad_invariants(_rms_norm_fix)),
                    geometry=_per_thread_geometry(4))
SMALL = Contract(
    # Violations: 1025 (TPG 512: only the split breaks), 32 (TPG 16), 96 (TPG 48), 2176 (TPG 1088).
    invariants=(*ONCE, _split_rule("n", 2, _small_fix, 1025),
                *_tpg_rules("n", _small_fix, 32, 96, 2176)),
    geometry=_per_thread_geometry(2))
WIDE = Contract(
    # TPG is fixed at 1024, so the seed's `TPG % 32 == 0` always holds; what is left is n >= 1.
    invariants=(*ONCE,
                Invariant("n >= 1", lambda ns: ns["n"] >= 1,
                          "an empty row has nothing to normalise (and rsqrt(0/0 + eps) is NaN)",
                          lambda ns: "n >= 1 (any positive n)", {"n": 0}, ("n",))),
    geometry=_wide_geometry)
PER_HEAD = Contract(
    # head_dim % 64 == 0 already makes TPG whole warps (head_dim/4 when head_dim % 128 == 0,
    # else head_dim/2): the TPG rules stay as the seed's checks of the derived geometry, so their
    # violations (32: TPG 16, 160: TPG 80) also break the first rule. 96 is Phi-3's head_dim;
    # 4224 (TPG 1056) breaks only the TPG cap.
    invariants=(*rounding_once("mlx:fast_rms_norm_per_head for rounding='normed'"),
                Invariant("head_dim % 64 == 0", lambda ns: ns["head_dim"] % 64 == 0,
                          "the per-head path runs mt_rms_norm (TPG = head_dim/4) when head_dim % "
                          "128 == 0, else mt_rms_norm_small (TPG = head_dim/2); either needs "
                          "whole warps of threads",
                          _head_dim_fix, {"head_dim": 96}, ("head_dim", "tpg")),
                *_tpg_rules("head_dim", _head_dim_fix, 32, 160, 4224)),
    geometry=_per_head_geometry)


# --- launch -----------------------------------------------------------------------------------

def _launcher(pick, ins: tuple[str, ...], outs: tuple[str, ...]):
    """make(defines) -> run. `pick(launch)` is the (source file, kernel) to launch; the kernel's
    arguments are the `ins`, then the `outs`, then eps, weight_offset, n."""
    def make(defines: tuple = ()):
        def run(launch, inputs, outputs, case):
            source, name = pick(launch)
            args = (*(inputs[k] for k in ins), *(outputs[k] for k in outs),
                    np.float32(case.params["eps"]), np.float32(case.params["weight_offset"]),
                    np.int32(launch.extra["n"]))
            kernel(source, name, case.dtype, defines)(launch.grid, launch.block, args)
        return run
    return make


def _fixed(source: str, name: str):
    return lambda launch: (source, name)


def _per_head_pick(launch):
    return KERNELS[0] if launch.extra["per_thread"] == 4 else KERNELS[1]


X_W = ("x", "w")
register(
    cuda_impl("mt_rms_norm", "rms_norm", RMS_NORM,
          _launcher(_fixed(*KERNELS[0]), X_W, ("out",)),
          "metaltile mt_rms_norm: TPG = n/4, 4 elements per thread in registers."),
    cuda_impl("mt_rms_norm_small", "rms_norm", SMALL,
          _launcher(_fixed(*KERNELS[1]), X_W, ("out",)),
          "metaltile mt_rms_norm_small: TPG = n/2, 2 elements per thread (head_dim 64)."),
    cuda_impl("mt_rms_norm_wide", "rms_norm", WIDE,
          _launcher(_fixed(*KERNELS[2]), X_W, ("out",)),
          "metaltile mt_rms_norm_wide: TPG = 1024, strided two-pass, any n."),
    cuda_impl("mt_rms_norm_per_head", "rms_norm_per_head", PER_HEAD,
          _launcher(_per_head_pick, X_W, ("out",)),
          "q_norm/k_norm: mt_rms_norm over head_dim (TPG = head_dim/4) when head_dim % 128 == 0, "
          "else mt_rms_norm_small (TPG = head_dim/2); one weight broadcast to every head."),
    cuda_impl("mt_gated_mixer_norm", "gated_mixer_norm", QUAD,
          _launcher(_fixed(*KERNELS[3]), ("y", "z", "w"), ("out",)),
          "metaltile mt_gated_mixer_norm: (y*inv*w)*silu(z), y f32, TPG = n/4."),
    cuda_impl("ffai_rms_norm_residual", "rms_norm_residual", QUAD,
          _launcher(_fixed(*KERNELS[4]), ("x", "residual", "w"), ("out",)),
          "FFAI ffai_rms_norm_residual: residual + x*inv*w, TPG = n/4."),
    cuda_impl("mt_add_rms_norm", "add_rms_norm", QUAD,
          _launcher(_fixed(*KERNELS[5]), ("a", "b", "w"), ("residual_out", "normed_out")),
          "metaltile mt_add_rms_norm: s = a+b; T(s) and T(s*inv*w) from the f32 s, TPG = n/4."),
)
