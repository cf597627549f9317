"""Test-only example op with an FP8-typed input (issue 24): `fp8_dequant_scale`.

    out[i] = x[i] * scale        x [n] in dtype role "x8" (default e4m3), scale [1] f32, out in T

The oracle is the product in float64. The kernel model: the kernel widens x to f32 (exact) and
multiplies by the f32 scale, one f32 rounding (x has at most 4 significant bits, the scale 24:
the product needs up to 28), then stores to T. A case picks the fp8 format of x with
`dtypes={"x8": "e5m2"}`; the torch impl is built for both formats (`Contract.role_dtypes`).

Not an op of kparity: `install(monkeypatch)` registers the op, its gate cases and the torch impl
for one test; `kparity --plugin tests/fp8_example.py ...` registers them for a CLI run.
"""

from __future__ import annotations

from itertools import product

import numpy as np

from gpu_impls.contract import Contract
from gpu_impls.impl import Impl
from oracle.dtypes import FLOAT_DTYPES
from oracle.spec import OpSpec, TensorSpec

OP = "fp8_dequant_scale"
N = lambda d: (d["n"],)  # noqa: E731


def oracle(inputs: dict, case) -> dict:
    """out = x * scale in float64 (the pre-store value)."""
    x = np.asarray(inputs["x"]).astype(np.float64)
    return {"out": x * np.asarray(inputs["scale"]).astype(np.float64)}


def kernel(A, inputs: dict, case) -> dict:
    """One f32 product of the widened fp8 value and the f32 scale."""
    return {"out": A.load(inputs["x"]) * A.load(inputs["scale"])}


def scale_init(shape, dtype, rng, case, drawn):
    """A one-off init: a per-tensor dequantization scale, 2^k * U(1, 2), k in [-4, 4]."""
    return np.exp2(rng.integers(-4, 5, shape)) * rng.uniform(1.0, 2.0, shape)


SPEC = OpSpec(
    name=OP, family="example", dims=("n",),
    inputs=(TensorSpec("x", N, role="x8"),
            TensorSpec("scale", lambda d: (1,), role="f32", init=scale_init)),
    outputs=(TensorSpec("out", N),),
    oracle=oracle, tolerance=None, kernel=kernel, roles={"x8": "e4m3"},
    bytes=lambda case: SPEC.io_bytes(case), flops=lambda case: case.dims["n"],
    doc=__doc__)

GATE_DISTS = ("normal", "tiny", "zero_rows", "nonfinite")


def gate_cases() -> list:
    from cases.model import Case

    return [Case.make(OP, {"n": n}, dtype, dist, dtypes={"x8": x8}, label="example")
            for n, dtype, dist, x8 in product((64, 1000), FLOAT_DTYPES, GATE_DISTS,
                                              ("e4m3", "e5m2"))]


def torch_run(launch, inputs, outputs, case):
    outputs["out"].copy_(inputs["x"].float() * inputs["scale"].float())


IMPL = Impl(OP, "torch", "fp8_dequant_scale", torch_run,
            Contract(role_dtypes={"x8": ("e4m3", "e5m2")}), doc="test-only: x.float() * scale")


def install(monkeypatch=None) -> None:
    """Register the op, its gate cases and the torch impl: through `monkeypatch` (undone after
    the test), or for good (a plugin)."""
    import cases.registry
    import gpu_impls
    import oracle.spec

    oracle.spec.registry(), cases.registry.sources(), gpu_impls.impls()  # load the real ones first
    entries = ((oracle.spec._REGISTRY, OP, SPEC), (cases.registry._SOURCES, OP, gate_cases),
               (gpu_impls._IMPLS, IMPL.id, IMPL))
    for table, key, value in entries:
        if monkeypatch is not None:
            monkeypatch.setitem(table, key, value)
        else:
            table.setdefault(key, value)


if __name__.startswith("kparity_plugin_"):  # `kparity --plugin tests/fp8_example.py`
    install()
