"""Small builders for the common op shapes, so a simple op's oracle file is its math.

`elementwise_op` registers an op over [rows, n] tensors whose inputs and output are all in T
(read once, written once), with the kernel model and the byte/flop counts every runner needs.
`kernel_view` and `silu` are the pieces several families share.
"""

from __future__ import annotations

import numpy as np

from oracle.spec import OpSpec, TensorSpec, register

TINY32 = float(np.finfo(np.float32).tiny)
ROWS = lambda d: (d["rows"], d["n"])  # noqa: E731


def kernel_view(inputs: dict, case) -> dict:
    """Inputs as float64, as the kernel sees them after widening to f32: with param `ftz`,
    values in the f32 subnormal range read as zero."""
    out = {k: np.asarray(v).astype(np.float64) for k, v in inputs.items()}
    if case.params.get("ftz"):
        out = {k: np.where(np.abs(v) < TINY32, 0.0, v) for k, v in out.items()}
    return out


def sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-z)) in float64 to full relative accuracy on both tails: exp(z) / (1 +
    exp(z)) for z < 0, where 1 + tanh(z/2) would cancel (all digits lost below z ~ -37)."""
    z = np.asarray(z, dtype=np.float64)
    with np.errstate(over="ignore"):
        e = np.exp(-np.abs(z))  # <= 1: never overflows
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(z: np.ndarray) -> np.ndarray:
    """z · sigmoid(z) in float64."""
    return z * sigmoid(z)


def elementwise_op(name: str, family: str, inputs: tuple[str, ...], oracle, kernel,
                   flops_per_elem: int, doc: str, params: dict | None = None,
                   version: int = 1, chain_input: str = "", param_values: dict | None = None,
                   inits: dict | None = None, conventions: tuple[str, ...] = (),
                   domain=None) -> OpSpec:
    """Register `name`: inputs `inputs` and output `out`, all [rows, n] in T; `oracle(inputs,
    case)` returns {"out": float64 pre-store values}, `kernel(A, inputs, case)` the admissible
    kernel's computation (`oracle/numerics.py`), from which the tolerance is derived;
    `chain_input`: the input the op before it writes (`OpSpec.chain_input`); `inits`: an
    input's init where it is not "data" (`TensorSpec.init`); `domain`: `OpSpec.domain`."""
    inits = inits or {}
    return register(OpSpec(
        name=name, family=family, dims=("rows", "n"),
        inputs=tuple(TensorSpec(k, ROWS, init=inits.get(k, "data")) for k in inputs),
        outputs=(TensorSpec("out", ROWS),),
        oracle=oracle, tolerance=None, kernel=kernel,
        bytes=lambda case: case.spec.io_bytes(case),
        flops=lambda case: flops_per_elem * case.dims["rows"] * case.dims["n"],
        params={"ftz": 0, **(params or {})}, param_values=param_values or {}, doc=doc,
        version=version, chain_input=chain_input, conventions=conventions, domain=domain))
