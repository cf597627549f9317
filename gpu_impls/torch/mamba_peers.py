"""Peer impls of the Mamba-2 ops from their reference libraries (issue 30): mamba_ssm's Triton
kernels and causal_conv1d's CUDA kernels, behind the optional extra `kparity[mamba]`. CUDA
only; each library is imported only when its impl runs. Read against mamba_ssm 2.3.2.post1 and
causal_conv1d 1.7.0.

`torch:mamba_chunk_scan_combined` (`ssd_chunked`): `mamba_ssm.ops.triton.ssd_combined.
mamba_chunk_scan_combined` as `Mamba2.forward` calls it, on our layouts as they are (x, z
[B, T, H, P]; dt [B, T, H] raw, with dt_bias and dt_softplus=True; A = −exp(A_log) [H]; B, C
[B, T, G, N], head h reading group h // (H / G); D [H]; initial_states and the final state
[B, H, P, N] f32), chunk_size = param chunk, dt_limit = (dt_min, dt_max or inf). Its kernels
round three dot operands to T (the tile before the dot with x, B·decay·dt before the chunk
state's dot, the passed states before Y_off): the rounding `dots="T"` admits (its contract
takes only that). f16 and bf16 only: on f32 inputs Triton's `tl.dot` runs at TF32 (its default
input precision), operands cut to 10 mantissa bits, which the f32 contract does not admit.

`torch:mamba_selective_state_update` (`ssm_step`): `mamba_ssm.ops.triton.
selective_state_update.selective_state_update` as `Mamba2.step` calls it: dt, dt_bias and D
repeated over P and A over (P, N) with stride 0 (the kernel's per-head path, one dt and one
exp(dt A) per head), dt_softplus=True, B and C per group. The state layout [B, H, P, N]
(`layout="hpn"`) only, and no dt clamp (the kernel has no dt limit). The kernel updates the
state in place: state_in is copied into state_out, which the kernel then updates.

`torch:causal_conv1d_fn` (`conv1d_causal`) and `torch:causal_conv1d_update`
(`conv1d_causal_step`): causal_conv1d's `causal_conv1d_fn` (with `initial_states` where the
case gives a state, else None: a fresh sequence; `return_final_states` into our conv_state)
and `causal_conv1d_update` (our conv_state_out, a copy of conv_state_in, updated in place).
Their layouts are channel-first by shape, [B, D, T] and the weight [D, W]; ours are channel
last, [B, T, D] and [W, D]: x and the states pass as transposed views (channel stride 1: their
channel-last kernel, which alone takes initial and final states), the weight as its contiguous
transpose. Widths 2 to 4 only (their kernels' instances); the prefill's channel-last kernel
needs channels % 8 == 0 (vector loads of 8 channels; its TORCH_CHECK).

Numerics: causal_conv1d compiles with nvcc --use_fast_math: silu's expf is __expf, within
2 + floor(1.173 |x|) ULPs (CUDA C++ Programming Guide, intrinsic functions), declared here at
|x| <= 16 (`FAST_EXPF_ULPS`; silu's argument is the conv output, |y| <= |bias| + Σ|w||x|, below
12 for the gate's normal data); the divide is charged 2 ULPs already; fast math also flushes f32
subnormals (FTZ), which the torch backend does not tell the oracle: data with subnormal
intermediates (dist "tiny") needs param ftz=1. mamba_ssm's Triton kernels: Triton lowers f32
`tl.exp` to ex2.approx(x·log2 e), whose error also grows with |x|, beyond the default 2-ULP
charge where |x| > 0; no constant charge is both sound and useful there (the decays' arguments
reach −80 at dt "fast"): the default stays (the excess matters only where a decayed term
dominates its sum, as a large state decayed by e^-1 .. e^-4 does), to be measured on the GPU.

Installing: `MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip install --no-build-isolation
--no-deps mamba-ssm` (python files only: its Triton ops need no build; FORCE_BUILD skips the
prebuilt-wheel download) and `CAUSAL_CONV1D_FORCE_BUILD=TRUE pip install --no-build-isolation
causal-conv1d` (builds its CUDA extension); on the GPU machine `scripts/mamba_peer_install.sh`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import math
import sys

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, nearest_multiples, param_is
from gpu_impls.impl import Impl
from gpu_impls.torch.extras import needs
from oracle.numerics import FUNCTION_ULPS, Numerics
from oracle.ssd import dt_limits

MAMBA_INSTALL = ("pip install einops && MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE "
                 "pip install --no-build-isolation --no-deps mamba-ssm")
CONV_INSTALL = "CAUSAL_CONV1D_FORCE_BUILD=TRUE pip install --no-build-isolation causal-conv1d"
# __expf's bound, 2 + floor(1.173 |x|) ULPs, at the largest |x| the charge covers (docstring)
FAST_EXPF_ARG = 16.0
FAST_EXPF_ULPS = 2.0 + math.floor(1.173 * FAST_EXPF_ARG)
FAST_MATH = Numerics(ulps={**FUNCTION_ULPS, "exp": FAST_EXPF_ULPS})


def _torch():
    import torch

    return torch


# --- what the impls need ---------------------------------------------------------------------

MAMBA_MODULES = ("triton", "einops", "packaging", "mamba_ssm")
_chunk_scan_available = needs("mamba_ssm's mamba_chunk_scan_combined (Triton)", MAMBA_MODULES,
                              MAMBA_INSTALL)
_state_update_available = needs("mamba_ssm's selective_state_update (Triton)", MAMBA_MODULES,
                                MAMBA_INSTALL)


def conv_needs(what: str):
    """`needs` for a causal_conv1d function, then its CUDA extension importable (the python
    package installs without it; its functions then fail at import)."""
    installed = needs(f"causal_conv1d's {what} (a CUDA extension)", ("causal_conv1d",),
                      CONV_INSTALL)

    def check() -> tuple[bool, str]:
        ok, why = installed()
        if not ok:
            return ok, why
        try:
            import causal_conv1d_cuda  # noqa: F401
        except ImportError as e:
            return False, f"causal_conv1d's CUDA extension not built ({CONV_INSTALL}): {e}"
        return True, ""

    return check


def _mamba_triton(module: str):
    """`mamba_ssm.ops.triton.<module>`, imported without running `mamba_ssm/__init__.py`.

    Why: that __init__ imports `mamba_ssm.ops.selective_scan_interface`, which does a hard
    `import selective_scan_cuda`, a CUDA extension that takes long to build and that the
    python-only install (MAMBA_SKIP_CUDA_BUILD=TRUE) leaves out; Python runs a package's
    __init__ before importing any of its submodules, so a plain import of the Triton module
    fails. The Triton ops need only triton, torch, einops and packaging, and the packages on
    their import path (mamba_ssm.ops, mamba_ssm.ops.triton, mamba_ssm.utils) have empty
    __init__ files.

    How: `importlib.util.find_spec("mamba_ssm")` locates the top-level package without
    executing it (for a dotted name find_spec would import the parents, running that
    __init__); an empty module with the package's `__path__` (and a spec saying so) goes into
    `sys.modules["mamba_ssm"]`, and the submodule is imported through it. A mamba_ssm already
    imported (a full install, its extension built) is used as it is. The stand-in stays in
    sys.modules: `from mamba_ssm import Mamba2` then fails in this process (kparity never
    does it)."""
    if "mamba_ssm" not in sys.modules:
        found = importlib.util.find_spec("mamba_ssm")
        if found is None or found.submodule_search_locations is None:
            raise ImportError(f"mamba_ssm not installed: {MAMBA_INSTALL}")
        spec = importlib.machinery.ModuleSpec("mamba_ssm", None, is_package=True)
        spec.submodule_search_locations = list(found.submodule_search_locations)
        sys.modules["mamba_ssm"] = importlib.util.module_from_spec(spec)  # nothing executed
    return importlib.import_module(f"mamba_ssm.ops.triton.{module}")


def _into(outputs, name: str, value):
    """`outputs[name]` (the runner's poisoned, guarded buffer) holding a copy of `value`, for a
    kernel that updates it in place; a fresh copy where the runner gives no outputs."""
    if outputs is None:
        return value.clone()
    return outputs[name].copy_(value)


# --- the SSD scans -----------------------------------------------------------------------------

def _chunk_scan(launch, inputs, outputs, case):
    combined = _mamba_triton("ssd_combined")
    torch = _torch()
    lo, hi = dt_limits(case)
    y, state = combined.mamba_chunk_scan_combined(
        inputs["x"], inputs["dt_raw"], -torch.exp(inputs["A_log"]), inputs["Bm"], inputs["Cm"],
        case.params["chunk"], D=inputs["D"], z=inputs["z"] if case.params["gate"] else None,
        dt_bias=inputs["dt_bias"], initial_states=inputs["h0"], dt_softplus=True,
        dt_limit=(lo, math.inf if hi is None else hi), return_final_states=True)
    return {"y": y, "state": state}


def _state_update(launch, inputs, outputs, case):
    update = _mamba_triton("selective_state_update")
    torch = _torch()
    x = inputs["x"]  # [B, H, P]
    heads, dim_p = x.shape[1:]
    dim_n = inputs["Bm"].shape[-1]

    def over_p(v):  # v repeated over P with stride 0, as Mamba2.step's `repeat` makes it
        return v[..., None].expand(*v.shape, dim_p)

    A = -torch.exp(inputs["A_log"])[:, None, None].expand(heads, dim_p, dim_n)
    state = _into(outputs, "state_out", inputs["state_in"])
    y = update.selective_state_update(
        state, x, over_p(inputs["dt_raw"]), A, inputs["Bm"], inputs["Cm"], D=over_p(inputs["D"]),
        z=inputs["z"] if case.params["gate"] else None, dt_bias=over_p(inputs["dt_bias"]),
        dt_softplus=True)
    return {"y": y, "state_out": state}


NO_DT_CLAMP = Invariant(
    name="no dt clamp", holds=lambda ns: ns["dt_min"] == 0 and ns["dt_max"] is None,
    why="selective_state_update applies no dt limit (Mamba2.step passes none)",
    fix=lambda ns: "dt_min=0 and dt_max=null, or torch:ssm_step for a clamped dt",
    violation={"dt_min": 0.01, "dt_max": 0.1}, shows=("dt_min", "dt_max"))
CHUNK_SCAN_CONTRACT = Contract(
    invariants=(param_is("dots", "T", "torch:ssd_chunked (f32 dots)", other="f32"),),
    dtypes=("f16", "bf16"))  # f32: tl.dot at TF32 (module docstring)
STATE_UPDATE_CONTRACT = Contract(
    invariants=(param_is("layout", "hpn", "torch:ssm_step (either layout)", other="hnp"),
                NO_DT_CLAMP))


# --- the causal conv1d -------------------------------------------------------------------------

def _conv_args(inputs, case) -> dict:
    """causal_conv1d's weight [D, W] (contiguous), bias and activation."""
    return {"weight": inputs["weight"].t().contiguous(),
            "bias": inputs["bias"] if case.params["bias"] else None,
            "activation": "silu" if case.params["silu"] else None}


def _conv_fn(launch, inputs, outputs, case):
    from causal_conv1d import causal_conv1d_fn

    state = outputs["conv_state"] if outputs is not None else inputs["conv_state_in"].clone()
    given = case.params["initial_state"] != "zero"
    y, _ = causal_conv1d_fn(
        inputs["x"].transpose(1, 2),
        initial_states=inputs["conv_state_in"].transpose(1, 2) if given else None,
        return_final_states=True, final_states_out=state.transpose(1, 2),
        **_conv_args(inputs, case))
    return {"y": y.transpose(1, 2), "conv_state": state}


def _conv_update(launch, inputs, outputs, case):
    from causal_conv1d import causal_conv1d_update

    state = _into(outputs, "conv_state_out", inputs["conv_state_in"])
    y = causal_conv1d_update(inputs["x"], state.transpose(1, 2), **_conv_args(inputs, case))
    return {"y": y, "conv_state_out": state}


WIDTH_2_TO_4 = Invariant(
    name="width <= 4", holds=lambda ns: ns["width"] <= 4,
    why="causal_conv1d's kernels are instantiated for widths 2, 3 and 4",
    fix=lambda ns: "width 2, 3 or 4 (Mamba-2's is 4), or torch:conv1d_causal(_step)",
    violation={"width": 5}, shows=("width",))
CHANNELS_8 = Invariant(
    name="channels % 8 == 0", holds=lambda ns: ns["channels"] % 8 == 0,
    why="initial and final states take causal_conv1d's channel-last kernel, which loads 8 "
        "channels a vector (its check: dim % 8 == 0)",
    fix=lambda ns: f"channels={nearest_multiples(ns['channels'], 8)}, or torch:conv1d_causal",
    violation={"channels": 12}, shows=("channels",))

register(
    Impl("ssd_chunked", "torch", "mamba_chunk_scan_combined", _chunk_scan, CHUNK_SCAN_CONTRACT,
         requires=_chunk_scan_available,
         doc="mamba_ssm's Triton mamba_chunk_scan_combined (dots rounded to T), CUDA only; "
             "optional extra kparity[mamba]"),
    Impl("ssm_step", "torch", "mamba_selective_state_update", _state_update,
         STATE_UPDATE_CONTRACT, requires=_state_update_available,
         doc="mamba_ssm's Triton selective_state_update as Mamba2.step calls it, CUDA only; "
             "optional extra kparity[mamba]"),
    Impl("conv1d_causal", "torch", "causal_conv1d_fn", _conv_fn,
         Contract(invariants=(WIDTH_2_TO_4, CHANNELS_8)), requires=conv_needs("causal_conv1d_fn"),
         numerics=FAST_MATH,
         doc="causal_conv1d's causal_conv1d_fn (channel-last, initial and final states), its "
             "CUDA extension; optional extra kparity[mamba]"),
    Impl("conv1d_causal_step", "torch", "causal_conv1d_update", _conv_update,
         Contract(invariants=(WIDTH_2_TO_4,)), requires=conv_needs("causal_conv1d_update"),
         numerics=FAST_MATH,
         doc="causal_conv1d's causal_conv1d_update (the state updated in place), its CUDA "
             "extension; optional extra kparity[mamba]"),
)
