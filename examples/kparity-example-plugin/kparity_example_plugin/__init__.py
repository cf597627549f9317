"""An example kparity plugin: one impl of an existing op, as a kernel repository would add it.

`torch:example_rms_norm` is RMSNorm for bf16 activations: x · rsqrt(mean(x²) + eps) · (w +
offset), computed in f32 and rounded to bf16 once, at the store (the op's `rounding="once"`).
Its contract says what the "kernel" is built for, as a real kernel's would: bf16 only, rows
whose length is a multiple of 8 (one 16-byte load of 8 bf16 per thread), one rounding. kparity
runs it on every `rms_norm` gate case the contract admits, and checks that each invariant's
violating case is refused before launch.

Registered through the `kparity.plugins` entry point of this package's pyproject.toml: kparity
calls `register()` once, when it first lists its impls.
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register as register_impls
from gpu_impls.contract import Contract, Invariant, nearest_multiples, rounding_once
from gpu_impls.impl import Impl

CONTRACT = Contract(
    dtypes=("bf16",),
    invariants=(
        Invariant(name="n % 8 == 0", holds=lambda ns: ns["n"] % 8 == 0,
                  why="each thread loads 8 bf16 values (16 bytes) at a time",
                  fix=lambda ns: f"n = {nearest_multiples(ns['n'], 8)}",
                  violation={"n": 100}, shows=("n",)),
        *rounding_once("torch:rms_norm_llama for rounding='normed'"),
    ))


def rms_norm_bf16(launch, inputs, outputs, case):
    """f32 throughout, one rounding to bf16 at the end; returns a fresh tensor."""
    import torch

    x = inputs["x"].float()
    w = inputs["w"].float() + case.params["weight_offset"]
    eps = float(np.float32(case.params["eps"]))  # the op's eps is an f32 value
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    return {"out": out.to(torch.bfloat16)}


EXAMPLE = Impl("rms_norm", "torch", "example_rms_norm", rms_norm_bf16, CONTRACT,
               doc="example plugin: f32 RMSNorm rounded to bf16 once (bf16 only, n % 8 == 0)")


def register() -> None:
    """The entry point: register this package's impls with kparity."""
    register_impls(EXAMPLE)
