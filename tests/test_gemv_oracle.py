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


# --- expert-indexed ------------------------------------------------------------------------------

def _expert_case(expert: int, dtype="bf16"):
    return Case.make("dequant_gemv_expert_indexed",
                     {"experts": 4, "out": 8, "in": 512, "bits": 4, "group_size": 64}, dtype,
                     params={"expert": expert})


def test_expert_oracle_is_the_plain_oracle_on_the_selected_slab():
    case = _expert_case(2)
    inputs = make_inputs(case)
    assert inputs["expert_index"].tolist() == [2]
    plain = Case.make("dequant_gemv", {"out": 8, "in": 512, "bits": 4, "group_size": 64}, "bf16")
    slab = {"w": inputs["w"][2], "scales": inputs["scales"][2], "biases": inputs["biases"][2],
            "x": inputs["x"]}
    exact, _ = case.spec.reference(inputs, case)
    expected, _ = plain.spec.reference(slab, plain)
    assert np.array_equal(exact["out"], expected["out"])
    other = dict(inputs, expert_index=np.array([1], np.uint32))
    assert not np.allclose(case.spec.reference(other, case)[0]["out"], exact["out"])


def test_expert_gate_cases_select_more_than_slab_zero():
    """An impl that always reads expert 0 (or the last) must meet a case selecting another."""
    chosen = {c.params["expert"] for c in gate_cases("dequant_gemv_expert_indexed")}
    assert {0, 3} < chosen


def test_expert_work_model_counts_one_slab():
    one, many = _expert_case(0), Case.make(
        "dequant_gemv_expert_indexed",
        {"experts": 64, "out": 8, "in": 512, "bits": 4, "group_size": 64}, "bf16")
    assert one.spec.bytes(one) == many.spec.bytes(many)
    assert one.spec.bytes(one) == 8 * 512 // 2 + 2 * 8 * 8 * 2 + 512 * 2 + 8 * 2 + 4


def test_expert_indexed_torch_is_bit_identical_to_plain_on_every_slab():
    from gpu_impls import backend, impls
    from runners.impl_vs_impl import exact_peer_mismatches

    impl = impls()["torch:dequant_linear_expert"]
    for dtype in ("f32", "f16", "bf16"):
        assert exact_peer_mismatches(impl, backend("torch"), _expert_case(0, dtype)) == []


def test_exact_peer_check_catches_a_different_summation_order():
    """An expert impl that passes the oracle (float64 dot, one rounding) but is not the plain
    impl's f32 computation is caught: bit identity is stricter than the tolerance."""
    import dataclasses


    from gpu_impls import backend, impls
    from runners.correctness import check
    from cases.generate import Work
    from runners.impl_vs_impl import exact_peer_mismatches
    from gpu_impls.torch.gemv import dequantize_f32

    def f64(launch, inputs, outputs, case):
        e = inputs["expert_index"].long()
        slab = [inputs[k].index_select(0, e)[0] for k in ("w", "scales", "biases")]
        w = dequantize_f32(*slab, case).double()
        return {"out": (w @ inputs["x"].double()).to(inputs["x"].dtype)}

    real = impls()["torch:dequant_linear_expert"]
    mutant = dataclasses.replace(real, name="mutant_f64_expert", run=f64)
    case = _expert_case(1, "f32")
    assert check(Work(mutant, case, "valid"), backend("torch"))["status"] == "pass"
    assert exact_peer_mismatches(mutant, backend("torch"), case)
