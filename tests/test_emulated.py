"""`oracle/emulated.py`: the one answer of a kernel whose declaration fixes its f32 arithmetic
(issue 49: "the check then holds the impl to that one answer"). The emulation's FMA rounds once,
its sums follow the declared order, and on `cuda:kp_qgemv` it is the source's own arithmetic
(tests/emulate_kp.py, loop for loop) bit for bit; the bound it gives bites where the interval
around every admissible kernel could not."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest

import gpu_impls
from cases.model import Case, make_inputs
from oracle.dtypes import spacing
from oracle.emulated import Emulated, Em, Undetermined, emulated_sum, fma32, rn32
from oracle.numerics import SEQUENTIAL, Numerics, lanes, model_for, plan
from tests import emulate_kp


def _exact_fma32(a: float, b: float, c: float) -> float:
    """RN_f32(a b + c) from the exact rational value: the nearest f32, ties to even."""
    z = Fraction(a) * Fraction(b) + Fraction(c)
    near = float(np.float32(float(z)))  # within an f32 ULP of z: search its neighbours
    candidates = {near, float(np.nextafter(np.float32(near), np.float32(np.inf))),
                  float(np.nextafter(np.float32(near), np.float32(-np.inf)))}
    best = min(candidates, key=lambda v: (abs(Fraction(v) - z),
                                          int(np.float32(v).view(np.int32)) & 1))
    return best


def test_fma_rounds_once_where_float64_then_f32_rounds_twice():
    """a b + c = 1 + 2^-24 + 2^-60 lies just above the midpoint of 1 and 1 + 2^-23: one rounding
    gives 1 + 2^-23; float64 first (1 + 2^-24, the midpoint) then f32 (ties to even) gives 1."""
    a, b, c = 2.0 ** -24 * (1 + 2.0 ** -12), 1 - 2.0 ** -12 + 2.0 ** -24, 1.0
    assert np.float32(a) == a and np.float32(b) == b
    assert float(np.float32(a * b + c)) == 1.0  # the double rounding
    assert fma32(np.array(a * b), np.array(c)) == 1 + 2.0 ** -23 == _exact_fma32(a, b, c)


def test_fma_matches_exact_rounding_on_random_and_cancelling_triples():
    rng = np.random.default_rng(7)
    a = rn32(rng.standard_normal(3000) * 2.0 ** rng.integers(-20, 20, 3000))
    b = rn32(rng.standard_normal(3000))
    c = rn32(np.where(rng.random(3000) < 0.5, -a * b * (1 + 2.0 ** -30),  # cancelling
                      rng.standard_normal(3000) * 2.0 ** rng.integers(-40, 40, 3000)))
    got = fma32(a * b, c)
    want = np.array([_exact_fma32(x, y, z) for x, y, z in zip(a, b, c)])
    assert np.array_equal(got, want)


def test_declared_orders_add_in_f32_in_their_order():
    rng = np.random.default_rng(3)
    t = rn32(rng.standard_normal((5, 64)) * 2.0 ** rng.integers(-12, 12, (5, 64)))
    seq = t[:, 0].astype(np.float32)
    for i in range(1, 64):
        seq = seq + t[:, i].astype(np.float32)
    assert np.array_equal(emulated_sum(Em(t), SEQUENTIAL).x, seq.astype(np.float64))
    tree = t.astype(np.float32)
    while tree.shape[-1] > 1:
        tree = tree[:, 0::2] + tree[:, 1::2]
    assert np.array_equal(emulated_sum(Em(t), plan({"i": 64}, ("i", "pairwise"))).x,
                          tree[:, 0].astype(np.float64))
    fly = t.astype(np.float32)
    while fly.shape[-1] > 1:
        h = fly.shape[-1] // 2
        fly = fly[:, :h] + fly[:, h:]
    assert np.array_equal(emulated_sum(Em(t), plan({"i": 64}, ("i", "butterfly"))).x,
                          fly[:, 0].astype(np.float64))
    # lanes(8): lane j sums t_j, t_{j+8}, ... in order, then adjacent lane totals pairwise
    lane = t.astype(np.float32).reshape(5, 8, 8)  # [row, step, lane]
    acc = lane[:, 0]
    for k in range(1, 8):
        acc = acc + lane[:, k]
    while acc.shape[-1] > 1:
        acc = acc[:, 0::2] + acc[:, 1::2]
    assert np.array_equal(emulated_sum(Em(t), lanes(8)).x, acc[:, 0].astype(np.float64))


def test_an_open_choice_is_named_not_guessed():
    with pytest.raises(Undetermined, match="any order"):
        emulated_sum(Em(np.ones((2, 4))), Numerics().reduction)
    with pytest.raises(Undetermined, match="rsqrt"):
        Em(np.ones(3)).rsqrt()
    case = Case.make("dequant_gemv", {"out": 8, "in": 256, "bits": 4, "group_size": 64}, "f32")
    inputs = make_inputs(case)
    exact = case.spec.reference(inputs, case)[0]
    with pytest.raises(ValueError, match="one answer.*leaves open a sum in any order"):
        case.spec.bounds(inputs, exact, case, Numerics(one_answer=True))


def _kp_qgemv(case):
    from gpu_impls.cuda.gemv import kp_warps
    from oracle.quant import unpack

    impl = gpu_impls.impls()["cuda:kp_qgemv"]
    numerics = impl.numerics_for(case)
    assert numerics.one_answer
    inputs = make_inputs(case)
    d = case.dims
    source = emulate_kp.kp_qgemv(unpack(inputs["w"], d["bits"], d["in"]), inputs["scales"],
                                 inputs["biases"], inputs["x"], d["bits"], kp_warps(d))
    answer = case.spec.kernel(Emulated(model_for(case, numerics)), inputs, case)["out"].x
    exact = case.spec.reference(inputs, case)[0]
    bound = case.spec.bounds(inputs, exact, case, numerics)["out"]
    return inputs, source.astype(np.float64), answer, exact["out"], bound


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n, dist, dtype", [(256, "normal", "f32"), (4096, "outlier_rows", "f32"),
                                            (8192, "quantized", "bf16"),
                                            (14336, "normal", "f32"), (1024, "tiny", "f16")])
def test_kp_qgemvs_one_answer_is_its_source_arithmetic(bits, n, dist, dtype):
    """1, 2 and 4 warps (in 256 .. 14336): the emulated model equals the transcription of
    kp_qgemv.cu bit for bit, and that transcription passes its bound."""
    case = Case.make("dequant_gemv", {"out": 32, "in": n, "bits": bits, "group_size": 64},
                     dtype, dist)
    _, source, answer, exact, bound = _kp_qgemv(case)
    assert np.array_equal(source, answer), case.short()
    from oracle.dtypes import round_to

    stored = round_to(source, dtype).astype(np.float64)
    assert np.all(np.abs(stored - exact) <= bound), case.short()


@pytest.mark.parametrize("bits", [4, 8])
def test_kp_qgemvs_f32_bound_is_within_4x_its_error_and_one_code_off_fails(bits):
    """Issue 49's targets on kparity's own GEMV, f32: median bound <= 4x the median observed
    error at in = 4096 (it was ~150x under the interval over every kernel of the declared
    order); one code off by one fails at in = 4096 and 14336 (int8's failed to at 4096)."""
    from runners.bite import code_pm1

    for n in (4096, 14336):
        case = Case.make("dequant_gemv", {"out": 256, "in": n, "bits": bits, "group_size": 64},
                         "f32", "normal")
        inputs, source, _, exact, bound = _kp_qgemv(case)
        ulp = spacing(exact, "f32")
        if n == 4096:
            assert np.median(bound / ulp) <= 4 * np.median(np.abs(source - exact) / ulp)
        off = case.spec.reference({**inputs, **code_pm1(case, inputs)[1]}, case)[0]["out"]
        changed = off != exact
        assert changed.any() and np.all(np.abs(off - exact)[changed] > bound[changed]), n


def test_a_declaration_without_one_answer_keeps_the_interval():
    case = Case.make("dequant_gemv", {"out": 16, "in": 4096, "bits": 4, "group_size": 64},
                     "f32")
    impl = gpu_impls.impls()["cuda:kp_qgemv"]
    inputs = make_inputs(case)
    exact = case.spec.reference(inputs, case)[0]
    one = case.spec.bounds(inputs, exact, case, impl.numerics_for(case))["out"]
    interval = case.spec.bounds(inputs, exact, case, dataclasses.replace(
        impl.numerics_for(case), one_answer=False))["out"]
    assert np.median(interval / one) > 20


def test_a_fused_product_plus_a_value_is_one_fma():
    a, b, c = 2.0 ** -24 * (1 + 2.0 ** -12), 1 - 2.0 ** -12 + 2.0 ** -24, 1.0
    fused = Emulated.fused(Em(np.array(a)), Em(np.array(b)))
    assert (fused + Em(np.array(c))).x == 1 + 2.0 ** -23 == (Em(np.array(c)) + fused).x
    assert (Em(np.array(c)) - fused.neg()).x == 1 + 2.0 ** -23


@pytest.mark.parametrize("bits, n, m, dtype", [(4, 1024, 1, "f32"), (4, 4096, 3, "bf16"),
                                               (8, 4096, 5, "f32"), (8, 512, 32, "f16"),
                                               (4, 576, 8, "bf16"), (8, 704, 3, "f32")])
def test_kp_qmms_declaration_read_as_one_answer_is_its_source_arithmetic(bits, n, m, dtype):
    """kp_qmm's declaration (form dequantized_fma: w = fma(q, s, b), then its FMA chains)
    emulated equals the transcription of kp_qmm.cu bit for bit: complete enough to declare one
    answer, which it does since the GPU kernel measured equal too (tests/test_gpu_one_answer.py)."""
    from oracle.quant import unpack

    case = Case.make("qmm", {"m": m, "out": 64, "in": n, "bits": bits, "group_size": 64}, dtype)
    inputs = make_inputs(case)
    source = emulate_kp.kp_qmm(unpack(inputs["w"], bits, n), inputs["scales"], inputs["biases"],
                               inputs["x"], bits).astype(np.float64)
    numerics = dataclasses.replace(gpu_impls.impls()["cuda:kp_qmm"].numerics_for(case),
                                   one_answer=True)
    answer = case.spec.kernel(Emulated(model_for(case, numerics)), inputs, case)["out"].x
    assert np.array_equal(source, answer), case.short()


@pytest.mark.parametrize("fmt, n, m", [("nvfp4", 1024, 1), ("nvfp4", 8192, 3),
                                       ("mxfp4", 4096, 1), ("mxfp4", 16384, 4)])
def test_kp_fp4_gemvs_declaration_read_as_one_answer_is_its_source_arithmetic(fmt, n, m):
    from gpu_impls.cuda.fp4 import _gemv_warps
    from oracle.fp4 import e2m1_values, scale_values, unpack

    case = Case.make("fp4_gemv", {"m": m, "out": 32, "in": n}, "f32", "normal",
                     params={"format": fmt, "scale_rule": "ocp" if fmt == "mxfp4" else "exact"})
    inputs = make_inputs(case)
    ts = float(np.asarray(inputs["tensor_scale"]).reshape(-1)[0])
    source = emulate_kp.kp_fp4_gemv(
        e2m1_values(unpack(inputs["codes"])), scale_values(inputs["scales"], fmt),
        ts if fmt == "nvfp4" else 1.0, inputs["x"], fmt, _gemv_warps(case.dims))
    numerics = dataclasses.replace(gpu_impls.impls()["cuda:kp_fp4_gemv"].numerics_for(case),
                                   one_answer=True)
    answer = case.spec.kernel(Emulated(model_for(case, numerics)), inputs, case)["y"].x
    assert np.array_equal(source.astype(np.float64), answer), case.short()
