"""The dequant_gemv oracle: closed forms, the tolerance against the seed's, and layout errors."""

from __future__ import annotations

import numpy as np
import pytest

from cases.generate import gate_cases
from cases.model import Case, make_inputs
from oracle.dtypes import round_to, storage_dtype
from oracle.gemv import SEED_TOL
from oracle.quant import pack


def _case(dtype="f32", bits=4, group=64, out=3, n=256):
    return Case.make("dequant_gemv", {"out": out, "in": n, "bits": bits, "group_size": group},
                     dtype)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_constant_codes_give_the_closed_form(bits):
    case = _case(bits=bits)
    x = round_to(np.linspace(-1, 1, 256), "f32")
    code = (1 << bits) - 2
    inputs = {"w": pack(np.full((3, 256), code), bits),
              "scales": np.full((3, 4), 0.25, np.float32),
              "biases": np.full((3, 4), -0.5, np.float32), "x": x}
    exact, _ = case.spec.reference(inputs, case)
    assert np.allclose(exact["out"], (code * 0.25 - 0.5) * x.astype(np.float64).sum(), rtol=0,
                       atol=1e-12)


def test_group_index_matters():
    """Scales per group: doubling group 1's scale changes exactly the share of group 1."""
    case = _case(out=1, n=128)
    inputs = make_inputs(case)
    base, _ = case.spec.reference(inputs, case)
    changed = dict(inputs, scales=inputs["scales"].copy())
    changed["scales"][0, 1] *= 2
    new, _ = case.spec.reference(changed, case)
    from oracle.quant import unpack
    q = unpack(inputs["w"], 4, 128).astype(np.float64)[0, 64:]
    share = float(inputs["scales"][0, 1]) * (q @ inputs["x"][64:].astype(np.float64))
    assert new["out"][0] - base["out"][0] == pytest.approx(share, rel=1e-9)


def test_zero_x_gives_an_exact_zero_bound():
    case = next(c for c in gate_cases("dequant_gemv") if c.dist == "zero_rows")
    inputs = make_inputs(case)
    exact, _ = case.spec.reference(inputs, case)
    bound = case.spec.tolerance(inputs, exact, case)
    assert np.all(exact["out"] == 0) and np.all(bound["out"] == 0)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_bounds_are_never_looser_than_the_seed(dtype):
    """The seed's tolerance is absolute at outputs of order 1: relative to each case's output
    RMS, the derived bound stays under it (f32 ~1.1e-3 of 5e-3, f16 ~2.5e-3 of 5e-2, bf16
    ~9.2e-3 of 2e-1 on the gate cases)."""
    for case in (c for c in gate_cases("dequant_gemv") if c.dtype == dtype
                 and c.dist == "normal"):
        inputs = make_inputs(case)
        exact, _ = case.spec.reference(inputs, case)
        bound = case.spec.tolerance(inputs, exact, case)["out"]
        rms = float(np.sqrt(np.mean(exact["out"] ** 2)))
        assert bound.max() / rms <= SEED_TOL["dequant_gemv"][dtype], case.id


def test_inputs_have_the_packed_layout():
    case = _case(bits=3, n=96, group=32)
    inputs = make_inputs(case)
    assert inputs["w"].dtype == np.uint32 and inputs["w"].shape == (3, 96 * 3 // 32)
    assert inputs["scales"].shape == (3, 3) and inputs["scales"].dtype == storage_dtype("f32")
