"""A kernel's declared summation order (`oracle.numerics.plan`): the plan machinery forms the
same partial sums as the orders it generalises, its bound covers the plan evaluated in f32;
cuda:kp_rms_norm's declared plan is the order its source adds the squares in, for the
geometry its launch uses on every case; cuda:kp_qgemv's declared form and orders bound its
source's f32 arithmetic (`tests/emulate_kp.py`) and catch a code off by one."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_impls
from cases.model import Case
from gpu_impls.cuda.kp_norms import CONFIGS, VEC, sum_order
from oracle.numerics import (SEQUENTIAL, Model, Numerics, Val, addition_magnitudes, f32_sum,
                             lanes, plan)
from tests import emulate_kp

F32 = np.float32


def _plan_in_f32(terms: np.ndarray, reduction) -> np.float32:
    """One row of f32 terms summed in f32 in the plan's order (absent terms: an exact +0)."""
    names = [name for name, _ in reduction.layout]
    x = np.zeros(reduction.terms, dtype=F32)
    x[:len(terms)] = terms
    x = x.reshape([size for _, size in reduction.layout])
    for step, how in reduction.steps:
        rest = [d for d in names if d not in step.split()]
        x = x.transpose([names.index(d) for d in rest + [d for d in names if d in step.split()]])
        x = x.reshape(x.shape[:len(rest)] + (-1,))
        if how in ("sequential", "fma"):  # fma: exact products (the callers' terms)
            total = x[..., 0].copy()
            for k in range(1, x.shape[-1]):
                total = (total + x[..., k]).astype(F32)
            x = total
        else:
            while x.shape[-1] > 1:
                if how == "pairwise":
                    if x.shape[-1] % 2:
                        x = np.concatenate([x, np.zeros(x.shape[:-1] + (1,), F32)], axis=-1)
                    x = (x[..., 0::2] + x[..., 1::2]).astype(F32)
                else:
                    h = x.shape[-1] // 2
                    x = (x[..., :h] + x[..., h:]).astype(F32)
            x = x[..., 0]
        names = rest
    return F32(x)


def test_a_plan_forms_the_partial_sums_of_the_orders_it_generalises():
    v = np.random.default_rng(1).standard_normal((3, 77))
    as_lanes = plan({"step": 10, "lane": 8}, ("step", "sequential"), ("lane", "pairwise"))
    as_sequence = plan({"i": 77}, ("i", "sequential"))
    for declared, known in ((as_lanes, lanes(8)), (as_sequence, SEQUENTIAL)):
        mine = np.sort(addition_magnitudes(v, declared), axis=-1)
        assert mine.shape == (3, 76)  # n - 1 additions, none with an absent operand
        np.testing.assert_array_equal(mine, np.sort(addition_magnitudes(v, known), axis=-1))


@pytest.mark.parametrize("bad, says", [
    (lambda: plan({"a": 4}, ("a", "diagonal")), "how 'diagonal'"),
    (lambda: plan({"a": 4, "b": 2}, ("a", "sequential")), "every digit exactly once"),
    (lambda: plan({"a": 6}, ("a", "butterfly")), "power of two"),
    (lambda: plan({"a": 4}, ("z", "sequential")), "outside the layout"),
])
def test_a_malformed_plan_is_refused_naming_the_fault(bad, says):
    with pytest.raises(ValueError, match=says):
        bad()


def test_a_plan_too_small_for_the_sum_is_refused():
    small = Model(numerics=Numerics(plan({"a": 8}, ("a", "sequential"))))
    with pytest.raises(ValueError, match="covers 8 terms, this sum has 9"):
        f32_sum(Val(np.ones(9), np.zeros(9), small))


def _hard_rows(n: int) -> np.ndarray:
    """Rows that stress a sum's rounding: random signs, heavy cancellation, a wide exponent
    spread, subnormals."""
    rng = np.random.default_rng(n)
    normal = rng.standard_normal(n)
    cancel = np.concatenate([np.full(n // 2, 1.0 + 2.0 ** -20), np.full(n - n // 2, -1.0)])
    spread = rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)
    tiny = rng.standard_normal(n) * 2.0 ** -140
    return np.stack([normal, cancel, rng.permutation(cancel), spread, tiny]).astype(F32)


@pytest.mark.parametrize("items, tpr", [(1, 1), (4, 1), (3, 8), (2, 32), (4, 64), (1, 256)])
def test_a_plans_bound_covers_the_plan_evaluated_in_f32(items, tpr):
    reduction = sum_order(items, tpr, 8)
    n = reduction.terms - 5  # the last thread's last vector partly absent
    rows = _hard_rows(n)
    bound = f32_sum(Val(rows.astype(np.float64), np.zeros(rows.shape),
                        Model(numerics=Numerics(reduction)))).e
    exact = rows.astype(np.float64).sum(axis=-1)
    got = np.array([_plan_in_f32(r, reduction) for r in rows], dtype=np.float64)
    assert np.all(np.abs(got - exact) <= bound), (got - exact, bound)


@pytest.mark.parametrize("items, tpr", CONFIGS[::7] + CONFIGS[-1:])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_kp_rms_norms_plan_is_its_source_order_bit_for_bit(items, tpr, dtype):
    """Three rows of spread magnitudes each (a wrong tree or chain differs in some row's last
    bit: tried with the lanes paired adjacently, the accumulators as a butterfly or a chain)."""
    vec = VEC[dtype]
    vecs = (items - 1) * tpr + max(1, tpr // 2)  # the last item held by half the threads
    for seed in range(3):
        rng = np.random.default_rng([items, tpr, seed])
        x = rng.standard_normal(vecs * vec).astype(F32)
        x *= F32(2.0) ** rng.integers(-12, 12, x.size).astype(F32)
        declared = _plan_in_f32((x * x).astype(F32), sum_order(items, tpr, vec))
        assert declared == emulate_kp.kp_rms_norm_sum_of_squares(x, items, tpr, vec), seed


def _admitted(impl, keep=lambda case: True) -> list:
    """(case, launch) for each gate case of the impl's op that `keep` takes and its contract
    admits; at least one."""
    from cases.generate import gate_cases
    from gpu_impls.contract import ContractError

    admitted = []
    for case in gate_cases(impl.op):
        if not keep(case):
            continue
        try:
            admitted.append((case, impl.contract.check(impl.id, case)))
        except ContractError:
            continue
    assert admitted, impl.id
    return admitted


KP_NORMS = ["cuda:kp_rms_norm", "cuda:kp_rms_norm_residual", "cuda:kp_add_rms_norm",
            "cuda:kp_rms_norm_per_head"]


@pytest.mark.parametrize("impl_id", KP_NORMS)
def test_each_kp_norm_declares_the_geometry_its_launch_uses(impl_id):
    """For every gate case its contract admits, the declared plan's threads per row and items
    per thread are the launch's, and the plan covers the row."""
    impl = gpu_impls.impls()[impl_id]
    for case, launch in _admitted(impl):
        digits = dict(impl.numerics_for(case).reduction.layout)
        assert (digits["item"], digits["warp"] * digits["lane"]) == \
            (launch.extra["items"], launch.extra["tpr"]), case.short()
        row = case.dims.get("n", case.dims.get("head_dim"))
        assert digits["item"] * digits["warp"] * digits["lane"] * digits["half"] * 4 >= row


def test_the_declared_order_tightens_kp_rms_norms_f32_bound():
    """Median f32 bound at n = 4096 under the kernel's plan, in ULPs (issue: <= 32; any order:
    ~780)."""
    from cases.model import make_inputs
    from oracle.dtypes import spacing

    impl = gpu_impls.impls()["cuda:kp_rms_norm"]
    case = Case.make("rms_norm", {"rows": 16, "n": 4096}, "f32", "normal",
                     params={"rounding": "once"})
    inputs = make_inputs(case)
    exact, _ = case.spec.reference(inputs, case)
    ulps = {}
    for name, numerics in (("plan", impl.numerics_for(case)),
                           ("any", Numerics().on("cuda"))):
        bound = case.spec.bounds(inputs, exact, case, numerics)["out"]
        ulps[name] = float(np.median(bound / spacing(exact["out"], "f32")))
    assert ulps["plan"] <= 32 < ulps["any"], ulps


# --- cuda:kp_qgemv: the form "chunk_split" with FMA chains ---------------------------------------

def _kp_qgemv_run(case, inputs):
    """(the f32 transcription's output, exact, the bound under kp_qgemv's declaration)."""
    from gpu_impls.cuda.gemv import kp_warps
    from oracle.quant import unpack

    d = case.dims
    y = emulate_kp.kp_qgemv(unpack(inputs["w"], d["bits"], d["in"]), inputs["scales"],
                            inputs["biases"], inputs["x"], d["bits"], kp_warps(d))
    exact = case.spec.reference(inputs, case)[0]["out"]
    impl = gpu_impls.impls()["cuda:kp_qgemv"]
    bound = case.spec.bounds(inputs, {"out": exact}, case, impl.numerics_for(case))["out"]
    return y.astype(np.float64), exact, bound


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n, dist", [(256, "normal"), (4096, "normal"), (8192, "quantized"),
                                     (14336, "outlier_rows"), (512, "constant_rows")])
def test_kp_qgemvs_source_arithmetic_stays_within_its_declared_bound(bits, n, dist):
    """1 warp (in <= 4096; 8192 int4), 2 (8192 int8, 14336 int4) and 4 (14336 int8)."""
    from cases.model import make_inputs

    case = Case.make("dequant_gemv", {"out": 32, "in": n, "bits": bits, "group_size": 64},
                     "f32", dist)
    inputs = make_inputs(case)
    y, exact, bound = _kp_qgemv_run(case, inputs)
    assert np.all(np.abs(y - exact) <= bound), case.short()


@pytest.mark.parametrize("n", [4096, 14336])
def test_one_code_off_fails_kp_qgemvs_f32_bound_and_passed_the_any_order_one(n):
    """The issue's target: an f32 int4 GEMV whose first code is off by one fails at in = 4096
    and 14336 under kp_qgemv's declared numerics; under the any-order bound it passed."""
    from cases.model import make_inputs
    from runners.bite import code_pm1

    case = Case.make("dequant_gemv", {"out": 32, "in": n, "bits": 4, "group_size": 64}, "f32",
                     "normal")
    inputs = make_inputs(case)
    _, exact, bound = _kp_qgemv_run(case, inputs)
    off = case.spec.reference({**inputs, **code_pm1(case, inputs)[1]}, case)[0]["out"]
    wrong = np.abs(off - exact)
    assert wrong[0] > 10 * bound[0]
    any_order = case.spec.bounds(inputs, {"out": exact}, case, Numerics().on("cuda"))["out"]
    assert wrong[0] < any_order[0]


@pytest.mark.parametrize("impl_id", ["cuda:kp_qgemv", "cuda:kp_fp4_gemv"])
def test_the_gemvs_declare_the_warps_their_launch_uses(impl_id):
    """The row's plan has the launch's warps and covers the row's chunks (16 bytes of codes:
    128 / bits of them, 32 FP4 codes) with its steps, the last one partly."""
    impl = gpu_impls.impls()[impl_id]
    for case, launch in _admitted(impl):
        numerics = impl.numerics_for(case)
        row = dict(numerics.order("row").layout)
        chunks = case.dims["in"] * case.dims.get("bits", 4) // 128
        assert row["warp"] * 32 == launch.block[0], case.short()
        assert row["step"] * row["warp"] * 32 >= chunks > (row["step"] - 1) * row["warp"] * 32
        first = "chunk_dot" if impl_id == "cuda:kp_qgemv" else "block_dot"
        assert numerics.order(first).terms in (128 // case.dims.get("bits", 4), 16)


# --- the warp-dot kernels and the conv chain -----------------------------------------------------

def _source(name: str) -> str:
    from pathlib import Path

    return (Path(gpu_impls.__file__).parent / "cuda" / "kernels" / name).read_text()


@pytest.mark.parametrize("per_lane", range(1, 9))
def test_warp_of_vectors_is_gdn_and_ssm_hpn_steps_order_bit_for_bit(per_lane):
    from gpu_impls.cuda.sum_orders import warp_of_vectors

    for seed in range(3):
        t = _hard_rows(32 * per_lane)[seed % 5] * F32(1 + seed)
        assert _plan_in_f32(t, warp_of_vectors(per_lane)) == \
            emulate_kp.warp_of_vectors_dot(t, per_lane), seed
    # the vector width the plan assumes is the kernels' own rule, in both sources
    for name, share in (("gdn_step.cu", "KPL"), ("ssm_step.cu", "NPL")):
        assert (f"constexpr int W = {share} % 4 == 0 ? 4 : {share} % 2 == 0 ? 2 : 1;"
                in _source(name)), name


@pytest.mark.parametrize("npl", range(1, 9))
def test_ssm_hnp_order_is_its_source_order_bit_for_bit(npl):
    from gpu_impls.cuda.ssm import SSM_THREADS, ssm_step_order

    assert f"#define KP_SSM_WARPS {SSM_THREADS // 32} " in _source("ssm_step.cu")
    for seed in range(3):
        t = _hard_rows(32 * npl)[seed] * F32(1 + seed)
        assert _plan_in_f32(t, ssm_step_order("hnp", 32 * npl)) == \
            emulate_kp.ssm_hnp_dot(t, npl), seed


@pytest.mark.parametrize("op, impl_id, share", [("gdn_step", "cuda:kp_gdn_step", "kpl"),
                                                ("ssm_step", "cuda:kp_ssm_step", "npl")])
def test_the_warp_dot_kernels_declare_their_launchs_share(op, impl_id, share):
    impl = gpu_impls.impls()[impl_id]
    assert impl.op == op
    layouts = set()
    for case, launch in _admitted(impl):
        order = impl.numerics_for(case).reduction
        assert order.terms == 32 * launch.extra[share], case.short()
        layouts.add(case.params.get("layout"))
    assert layouts == ({"hpn", "hnp"} if op == "ssm_step" else {None})


def _conv_chain_case():
    """A conv1d step whose chains start at a bias of +-3e4 and add products that cancel (taps
    +1, -1, +1, -1 over inputs near 1): every partial sum is near the bias."""
    from cases.model import make_inputs

    case = Case.make("conv1d_causal_step", {"batch": 4, "channels": 256, "width": 4}, "f32",
                     "normal", params={"bias": 1, "silu": 0})
    inputs = make_inputs(case)
    rng = np.random.default_rng(3)
    inputs["bias"] = (rng.choice([-1, 1], 256) * (3e4 + rng.random(256))).astype(F32)
    inputs["weight"] = np.repeat(np.array([[1.0], [-1.0], [1.0], [-1.0]], F32), 256, axis=1)
    for name in ("x", "conv_state_in"):
        inputs[name] = (1 + rng.random(inputs[name].shape) * 1e-2).astype(F32)
    return case, inputs


def test_the_conv_chains_bias_comes_first_and_its_error_stays_in_the_bound():
    """conv1d.cu starts each channel's chain at the bias (`conv_out`); the model sums its
    terms bias first (oracle/conv1d.py `_terms`), so the declared sequential order charges
    the partial sums near the bias that the kernel forms."""
    case, inputs = _conv_chain_case()
    window = np.concatenate([inputs["conv_state_in"], inputs["x"][:, None]], axis=1)
    y = emulate_kp.conv_out(inputs["bias"], inputs["weight"].T[None],
                            np.swapaxes(window, 1, 2)).astype(np.float64)
    exact = case.spec.reference(inputs, case)[0]["y"]
    impl = gpu_impls.impls()["cuda:kp_conv1d_causal_step"]
    bound = case.spec.bounds(inputs, {"y": exact}, case, impl.numerics_for(case))["y"]
    assert np.all(np.abs(y - exact) <= bound)
    assert np.max(np.abs(y - exact) / bound) > 0.25  # the chain's roundings near the bias


def test_the_report_and_the_matrix_say_what_each_impl_declares():
    from cases.generate import gate_cases
    from results.report_impl import declared_order
    from verbs.catalog import _sum_order, _summing_case

    assert "per case" in declared_order("cuda:kp_rms_norm")
    assert "sequential" in declared_order("cuda:kp_attn_combine")
    assert "undeclared" in declared_order("torch:rms_norm")
    impls = gpu_impls.impls()
    norm, gemv = _summing_case(gate_cases("rms_norm")), _summing_case(gate_cases("dequant_gemv"))
    assert norm and gemv
    assert _summing_case(gate_cases("rope")) is None  # no sum: nothing to declare
    assert "per case" in _sum_order(impls["cuda:kp_rms_norm"], norm)
    assert "sequential" in _sum_order(impls["cuda:kp_attn_combine"],
                                      _summing_case(gate_cases("attn_combine")))
    sdpa = _summing_case(gate_cases("sdpa_decode"))
    assert _sum_order(impls["cuda:kp_sdpa_decode"], sdpa) == "[green]partly[/] (score)"
    assert "undeclared" in _sum_order(impls["cuda:kp_qgemv_mma"], gemv)
    assert _sum_order(impls["cuda:kp_rope"], None) == "-"


@pytest.mark.parametrize("bits, n, m, dist", [(4, 1024, 1, "normal"), (4, 4096, 3, "quantized"),
                                              (8, 4096, 5, "normal"), (8, 512, 32, "outlier_rows"),
                                              (4, 576, 8, "normal"), (4, 64, 2, "quantized")])
def test_kp_qmms_source_arithmetic_stays_within_its_declared_bound(bits, n, m, dist):
    """kp_qmm declares dequantize-then-dot with w = fma(q, s, b) and one FMA chain per lane:
    its transcription stays within that bound, which is far below the any-order one."""
    from cases.model import make_inputs
    from oracle.quant import unpack

    case = Case.make("qmm", {"m": m, "out": 64, "in": n, "bits": bits, "group_size": 64},
                     "f32", dist)
    inputs = make_inputs(case)
    y = emulate_kp.kp_qmm(unpack(inputs["w"], bits, n), inputs["scales"], inputs["biases"],
                          inputs["x"], bits).astype(np.float64)
    exact = case.spec.reference(inputs, case)[0]["out"]
    impl = gpu_impls.impls()["cuda:kp_qmm"]
    bound = case.spec.bounds(inputs, {"out": exact}, case, impl.numerics_for(case))["out"]
    wide = case.spec.bounds(inputs, {"out": exact}, case, Numerics().on("cuda"))["out"]
    assert np.all(np.abs(y - exact) <= bound), case.short()
    assert np.median(bound) < np.median(wide) / 10


def test_kp_qmm_without_its_partial_step_fails_its_declared_bound():
    """The kernel's mutant KPARITY_MUTANT_NO_PARTIAL_STEP (whole steps only) transcribed: at
    in = 576 (int4: two steps and 2 of 8 chunks) the last 64 codes go unsummed, which the
    declared bound refuses."""
    from cases.model import make_inputs
    from oracle.quant import unpack

    case = Case.make("qmm", {"m": 3, "out": 64, "in": 576, "bits": 4, "group_size": 64}, "f32")
    inputs = make_inputs(case)
    x = np.array(inputs["x"], copy=True)
    x[:, 512:] = 0  # the partial step's chunks never added
    y = emulate_kp.kp_qmm(unpack(inputs["w"], 4, 576), inputs["scales"], inputs["biases"], x,
                          4).astype(np.float64)
    exact = case.spec.reference(inputs, case)[0]["out"]
    impl = gpu_impls.impls()["cuda:kp_qmm"]
    bound = case.spec.bounds(inputs, {"out": exact}, case, impl.numerics_for(case))["out"]
    assert np.any(np.abs(y - exact) > bound)


@pytest.mark.parametrize("fmt, n, m", [("nvfp4", 1024, 1), ("nvfp4", 8192, 3),
                                       ("mxfp4", 4096, 1), ("mxfp4", 16384, 4)])
def test_kp_fp4_gemvs_source_arithmetic_stays_within_its_declared_bound(fmt, n, m):
    """kp_fp4_gemv declares the form block_split and its chains' orders (1 warp at in <= 8192,
    2 at 16384): its transcription stays within that bound, far below the any-order one."""
    from cases.model import make_inputs
    from gpu_impls.cuda.fp4 import _gemv_warps
    from oracle.fp4 import e2m1_values, scale_values, unpack

    case = Case.make("fp4_gemv", {"m": m, "out": 32, "in": n}, "f32", "normal",
                     params={"format": fmt, "scale_rule": "ocp" if fmt == "mxfp4" else "exact"})
    assert not case.spec.domain_error(case)
    inputs = make_inputs(case)
    ts = float(np.asarray(inputs["tensor_scale"]).reshape(-1)[0])
    y = emulate_kp.kp_fp4_gemv(e2m1_values(unpack(inputs["codes"])),
                               scale_values(inputs["scales"], fmt), ts if fmt == "nvfp4" else 1.0,
                               inputs["x"], fmt, _gemv_warps(case.dims)).astype(np.float64)
    exact = case.spec.reference(inputs, case)[0]["y"]
    impl = gpu_impls.impls()["cuda:kp_fp4_gemv"]
    bound = case.spec.bounds(inputs, {"y": exact}, case, impl.numerics_for(case))["y"]
    wide = case.spec.bounds(inputs, {"y": exact}, case, Numerics().on("cuda"))["y"]
    assert np.all(np.abs(y - exact) <= bound), case.short()
    assert np.median(bound) < np.median(wide) / 10


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_kp_sdpa_decodes_score_order_is_its_source_order_bit_for_bit(head_dim, dtype):
    """With products exact in f32 (few significant bits), an FMA chain adds exactly the
    products: the transcription of pass 1's score equals the declared plan evaluated in f32."""
    from gpu_impls.cuda.kp_attention import score_order

    rng = np.random.default_rng(head_dim)
    for seed in range(3):
        q = (rng.integers(-63, 64, head_dim) * 2.0 ** rng.integers(-20, 20, head_dim)).astype(F32)
        k = (rng.integers(-63, 64, (5, head_dim))
             * 2.0 ** rng.integers(-20, 20, (5, head_dim))).astype(F32)
        vec = 4 if dtype == "f32" else 8
        got = emulate_kp.kp_sdpa_score(q, k, 1.0, vec)
        want = [_plan_in_f32((q * row).astype(F32), score_order(head_dim, dtype)) for row in k]
        assert np.array_equal(got, np.array(want, F32)), seed


def test_kp_sdpa_decode_declares_the_scaled_q_form_and_passes_its_bound_on_gate_cases():
    """The declared score order (its FMA chains and butterfly) tightens only the score's sum;
    on f32 gate cases the transcribed scores stay within an f32 dot's bound in that order."""
    from cases.model import make_inputs

    impl = gpu_impls.impls()["cuda:kp_sdpa_decode"]
    case = Case.make("sdpa_decode", {"batch": 1, "heads": 4, "kv_heads": 1, "head_dim": 96,
                                     "max_len": 64}, "f32", "normal")
    numerics = impl.numerics_for(case)
    assert numerics.form == "scaled_q" and numerics.order("score").terms >= 96
    assert numerics.order(None).kind == "any"  # the softmax sums: undeclared
    inputs = make_inputs(case)
    assert case.spec.bounds(inputs, case.spec.reference(inputs, case)[0], case, numerics)


def test_kp_ssd_chunked_declares_its_kernel_path_and_its_bound_is_never_wider():
    """The form "kernel" drops the listing's path and declares three dots' FMA chains: on its
    admitted f32 gate cases the bound is nowhere wider than the any-order, either-form one."""
    from cases.model import make_inputs

    impl = gpu_impls.impls()["cuda:kp_ssd_chunked"]
    cases = _admitted(impl, lambda c: c.dtype == "f32" and c.dist == "normal"
                      and c.dims["tokens"] <= 300)
    assert len(cases) >= 2
    for case, _ in cases:
        numerics = impl.numerics_for(case)
        assert numerics.form == "kernel" and numerics.order("chunk_state").terms == \
            case.params["chunk"]
        inputs = make_inputs(case)
        exact = case.spec.reference(inputs, case)[0]
        own = case.spec.bounds(inputs, exact, case, numerics)
        wide = case.spec.bounds(inputs, exact, case, Numerics().on("cuda"))
        for name in own:
            assert np.all(own[name] <= wide[name] * (1 + 1e-12)), (name, case.short())


# --- a declared overflow: kp_rms_norm's f32 sum of squares ---------------------------------------

def _overflow_case(op="rms_norm"):
    return Case.make(op, {"rows": 4, "n": 512}, "f32", "f32_overflow")


@pytest.mark.parametrize("op, out", [("rms_norm", "out"), ("rms_norm_residual", "out"),
                                     ("add_rms_norm", "normed_out")])
def test_a_declared_ieee_overflow_holds_the_impl_to_zero_and_nothing_else(op, out):
    """Undeclared, an f32_overflow row admits every output between 0 and the exact one; an impl
    declaring overflow="inf" (kp_rms_norm's family) is held to IEEE's answer: the oracle's
    reference is 0 there (residual for rms_norm_residual) with a zero bound, so an impl that
    rescales (the exact answer) fails, as would one writing anything else."""
    from cases.model import make_inputs
    from runners.oracle_cache import reference_and_bounds

    case = _overflow_case(op)
    inputs = make_inputs(case)
    undeclared = reference_and_bounds(case, inputs, Numerics().on("cuda"), False, cache=False)
    impl = next(i for i in gpu_impls.impls().values()
                if i.op == op and i.id.startswith("cuda:kp_"))
    declared = reference_and_bounds(case, inputs, impl.numerics_for(case), False, cache=False)
    exact_wide, bound_wide = undeclared[0][out], undeclared[2][out]
    exact_ieee, bound_ieee = declared[0][out], declared[2][out]
    ieee = (np.asarray(inputs["residual"], np.float64) if op == "rms_norm_residual"
            else np.zeros_like(exact_ieee))
    assert np.all(np.abs(exact_wide - ieee) <= bound_wide)  # undeclared: IEEE's is admitted
    np.testing.assert_array_equal(exact_ieee, ieee)
    assert np.all(bound_ieee <= bound_wide)
    if op != "rms_norm_residual":  # (there residual + normed rounds to the residual anyway)
        assert np.all(bound_ieee == 0)  # declared: a kernel that rescales (exact_wide) fails
        assert np.all(np.abs(exact_wide) > 0)


def test_the_overflow_param_is_checked_at_load(tmp_path):
    from cases.casefile import CaseFileError, load_cases

    path = tmp_path / "cases.json"
    path.write_text('[{"op": "rms_norm", "dims": {"rows": 2, "n": 64}, "dtype": "f32", '
                    '"params": {"overflow": "saturate"}}]')
    with pytest.raises(CaseFileError, match="params.overflow.*either, inf"):
        load_cases(path)
