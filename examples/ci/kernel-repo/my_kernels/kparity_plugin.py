"""This repository's kernels as kparity impls: the `kparity.plugins` entry point
(pyproject.toml) calls `register()` once, when kparity first lists its impls.

Each impl is an existing kparity op (here `rms_norm`) run by one of this package's kernels, with
the contract the kernel is built for: kparity checks it on every gate case the contract admits
and checks that each invariant's violating case is refused before launch.
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register as register_impls
from gpu_impls.contract import Contract, Invariant, nearest_multiples, rounding_once
from gpu_impls.impl import Impl

import my_kernels

CONTRACT = Contract(
    dtypes=("f16", "bf16"),
    invariants=(
        Invariant(name="n % 8 == 0", holds=lambda ns: ns["n"] % 8 == 0,
                  why="each thread loads 8 values (16 bytes) at a time",
                  fix=lambda ns: f"n = {nearest_multiples(ns['n'], 8)}",
                  violation={"n": 100}, shows=("n",)),
        *rounding_once("torch:rms_norm_llama for rounding='normed'"),
    ))


def run_rms_norm(launch, inputs, outputs, case):
    """kparity's call: the inputs are torch tensors on the device; returns the outputs."""
    eps = float(np.float32(case.params["eps"]))  # the op's eps is an f32 value
    out = my_kernels.rms_norm(inputs["x"], inputs["w"], eps, case.params["weight_offset"])
    return {"out": out}


RMS_NORM = Impl("rms_norm", "torch", "my_rms_norm", run_rms_norm, CONTRACT,
                doc="my_kernels.rms_norm: f32 math, one rounding (f16/bf16, n % 8 == 0)")

IMPLS = (RMS_NORM,)  # this repository's impls: its tests gate each one


def register() -> None:
    """The entry point: register this package's impls with kparity."""
    register_impls(*IMPLS)
