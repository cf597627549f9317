"""qmm (quantized matmul over M rows): the oracle against an independent float64 formula and
against dequant_gemv, its bound against the seed's, the CPU impls on every gate case, the CUDA
contract's rules, and batch invariance (the check itself can fail: a mutant is caught)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gpu_impls
from cases.generate import Work, gate_cases, plan, violating_cases
from cases.model import Case, make_inputs
from gpu_impls.contract import ContractError
from oracle.qmm import SEED_TOL_QMM
from oracle.spec import get_op
from runners.correctness import batch_variant_rows, check
from runners.verdicts import is_failure, repro_command

QMM_IMPLS = sorted(i for i, impl in gpu_impls.impls().items() if impl.op == "qmm")


def _case(m=3, out=8, n=512, bits=4, group=64, dtype="f32", dist="normal") -> Case:
    return Case.make("qmm", {"m": m, "out": out, "in": n, "bits": bits, "group_size": group},
                     dtype, dist)


def _codes_by_bit_stream(words: np.ndarray, bits: int, n: int) -> np.ndarray:
    """codes [out, n] read from each row's words as one little-endian integer (Python ints):
    code k is bits k*bits .. k*bits + bits - 1 of it; no shared code with oracle.quant."""
    rows = []
    for row in words:
        stream = sum(int(word) << (32 * j) for j, word in enumerate(row))
        rows.append([(stream >> (k * bits)) & ((1 << bits) - 1) for k in range(n)])
    return np.array(rows, dtype=np.float64)


# --- oracle --------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits, group", [(3, 32), (4, 64), (8, 128)])
def test_oracle_matches_an_independent_float64_formula(bits, group):
    """out[i, r] = sum_d (q[r,d] s[r,d//G] + b[r,d//G]) x[i,d], written out element by element
    from codes read as a bit stream."""
    case = _case(m=3, out=5, n=256, bits=bits, group=group, dtype="bf16")
    inputs = make_inputs(case)
    q = _codes_by_bit_stream(inputs["w"], bits, 256)
    group_of = np.arange(256) // group
    s = inputs["scales"].astype(np.float64)[:, group_of]
    b = inputs["biases"].astype(np.float64)[:, group_of]
    x = inputs["x"].astype(np.float64)
    expected = np.einsum("rd,id->ir", q * s + b, x)
    exact, rounded = case.spec.reference(inputs, case)
    assert exact["out"].shape == (3, 5) and rounded["out"].dtype == inputs["x"].dtype
    np.testing.assert_allclose(exact["out"], expected, rtol=1e-12, atol=1e-15)


def test_m1_is_dequant_gemv_and_every_row_is_its_own_gemv():
    """M = 1 is dequant_gemv bit for bit (oracle and bound); row i of M = 4 is dequant_gemv on
    x[i] (up to float64 summation order)."""
    gemv = Case.make("dequant_gemv", {"out": 40, "in": 1536, "bits": 4, "group_size": 64},
                     "f16")
    for m in (1, 4):
        case = _case(m=m, out=40, n=1536, dtype="f16")
        inputs = make_inputs(case)
        exact, _ = case.spec.reference(inputs, case)
        bound = case.spec.tolerance(inputs, exact, case)
        for i in range(m):
            row = {**inputs, "x": inputs["x"][i]}
            g_exact, _ = gemv.spec.reference(row, gemv)
            g_bound = gemv.spec.tolerance(row, g_exact, gemv)
            if m == 1:
                assert np.array_equal(exact["out"][0], g_exact["out"])
                assert np.array_equal(bound["out"][0], g_bound["out"])
            np.testing.assert_allclose(exact["out"][i], g_exact["out"], rtol=1e-13)
            np.testing.assert_allclose(bound["out"][i], g_bound["out"], rtol=1e-13)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_bounds_are_never_looser_than_the_seed(dtype, tier_cases):
    """mt_qmm's seed tolerance (abs, outputs of order 1) relative to each case's output RMS,
    over the run's tier's cases."""
    cases = [c for c in gate_cases("qmm") if c.dtype == dtype and c.dist == "normal"]
    assert {c.dims["m"] for c in cases} == {1, 2, 3, 4, 8, 16, 32}
    for case in tier_cases(cases):
        inputs = make_inputs(case)
        exact, _ = case.spec.reference(inputs, case)
        bound = case.spec.tolerance(inputs, exact, case)["out"]
        rms = float(np.sqrt(np.mean(exact["out"] ** 2)))
        assert bound.max() / rms <= SEED_TOL_QMM[dtype], case.short()


def test_zero_rows_of_x_give_exact_zero_outputs_and_bounds():
    case = _case(m=7, dist="zero_rows", dtype="bf16")
    inputs = make_inputs(case)
    exact, _ = case.spec.reference(inputs, case)
    bound = case.spec.tolerance(inputs, exact, case)["out"]
    zero = [0, 3, 6]
    assert np.all(inputs["x"][zero].astype(np.float64) == 0)
    assert np.all(exact["out"][zero] == 0) and np.all(bound[zero] == 0)
    assert np.all(exact["out"][[1, 2, 4, 5]] != 0)


def test_work_model_reads_the_weight_once_for_all_rows():
    one, many = _case(m=1, dtype="bf16"), _case(m=32, dtype="bf16")
    assert many.spec.bytes(many) - one.spec.bytes(one) == 31 * (512 + 8) * 2
    assert one.spec.bytes(one) == 8 * 512 // 2 + 2 * 8 * 8 * 2 + 512 * 2 + 8 * 2
    assert many.spec.flops(many) == 2 * 32 * 8 * 512


def test_gate_and_bench_cases_cover_the_issue():
    cases = gate_cases("qmm")
    assert {c.dims["m"] for c in cases} == {1, 2, 3, 4, 8, 16, 32}
    assert {c.dims["bits"] for c in cases} == {3, 4, 8}
    assert {c.dims["group_size"] for c in cases} == {32, 64, 128}
    assert {c.dtype for c in cases} == {"f32", "f16", "bf16"}
    from cases.generate import bench_cases

    bench = bench_cases("qmm")
    assert {c.dims["m"] for c in bench} == {1, 4, 16, 32}
    assert {(c.dims["out"], c.dims["in"], c.dims["bits"], c.dims["group_size"])
            for c in bench} == {(14336, 4096, 4, 64)}


# --- CPU impls against the oracle ----------------------------------------------------------------

def _on_cpu(impl_id: str) -> bool:
    impl = gpu_impls.impls()[impl_id]
    be = gpu_impls.backend(impl.backend)
    return impl.available(be)[0] and not be.accelerator


# report-only speed baselines (mlx:qmm_quantized_matmul_half) gate nothing: `check` runs
# only their contracts' rejections (tests/test_contracts.py)
CPU_IMPLS = [i for i in QMM_IMPLS if _on_cpu(i) and not gpu_impls.impls()[i].report_only]


def test_the_cpu_impls_are_here():
    assert "torch:qmm_dequant_linear" in CPU_IMPLS and "mlx:qmm_quantized_matmul" in CPU_IMPLS


@pytest.mark.parametrize("impl_id", CPU_IMPLS)
def test_cpu_impl_passes_every_gate_case(impl_id):
    impl = gpu_impls.impls()[impl_id]
    work = plan([impl])
    assert any(w.expect == "valid" for w in work)
    be = gpu_impls.backend(impl.backend)
    failed = [(w, r) for w in work for r in [check(w, be)] if is_failure(r)]
    assert not failed, "\n".join(f"{w.case.short()}: {r['status']} {r['message']}\nrepro: "
                                 f"{repro_command(impl_id, w.case.id)}" for w, r in failed[:5])


# --- contracts -----------------------------------------------------------------------------------

@pytest.mark.parametrize("impl_id", QMM_IMPLS)
def test_contracts_reject_their_violating_cases(impl_id):
    impl = gpu_impls.impls()[impl_id]
    work = violating_cases(impl)
    assert [w.invariant for w in work] == [inv.name for inv in impl.contract.invariants]
    for w in work:
        with pytest.raises(ContractError) as info:
            impl.contract.check(impl.id, w.case)
        assert info.value.invariant == w.invariant


def test_kp_qmm_contract_rules_and_geometry():
    """The CUDA kernel's own rules (pure Python, no GPU): int4/int8, M <= 32, any K the layout
    admits (a partial last step); MT is M rounded up to a power of two, one block per 32 rows."""
    impl = gpu_impls.impls()["cuda:kp_qmm"]
    names = {inv.name for inv in impl.contract.invariants}
    assert {"bits in (4, 8)", "1 <= m <= 32"} <= names
    for m, mt in ((1, 1), (2, 2), (3, 4), (17, 32), (32, 32)):
        launch = impl.contract.check(impl.id, _case(m=m, out=40, n=1536))
        assert launch.extra["mt"] == mt and launch.grid == (2, 1, 1)
    for bad, invariant in (({"m": 33}, "1 <= m <= 32"), ({"bits": 3}, "bits in (4, 8)")):
        with pytest.raises(ContractError) as info:
            impl.contract.check(impl.id, _case(n=1536, group=32).replace(**bad))
        assert info.value.invariant == invariant
    for n, bits in ((640, 8), (640, 4), (576, 4), (32, 4)):  # partial last steps
        assert impl.contract.admits(_case(n=n, bits=bits, group=32))


# --- batch invariance ----------------------------------------------------------------------------

def _declared_on_cpu():
    """Impls of ops with a batch dim that declare batch invariance on their CPU backend here."""
    out = []
    for impl in sorted(gpu_impls.impls().values(), key=lambda i: i.id):
        be = gpu_impls.backend(impl.backend)
        if (get_op(impl.op).batch is not None and impl.available(be)[0] and not be.accelerator
                and impl.batch_invariant_on(be.device()) and not impl.report_only):
            out.append(impl)
    return out


def _batched_cases(impl, most_per_dtype: int = 2):
    """Valid normal cases with more than one row: the largest M first, per dtype."""
    cases = sorted((w.case for w in plan([impl], invalid=False)
                    if w.case.dist == "normal" and w.case.dims[w.case.spec.batch.dim] > 1),
                   key=lambda c: (-c.dims[c.spec.batch.dim], c.id))
    by_dtype: dict[str, list] = {}
    for c in cases:
        by_dtype.setdefault(c.dtype, [])
        if len(by_dtype[c.dtype]) < most_per_dtype:
            by_dtype[c.dtype].append(c)
    return [c for cs in by_dtype.values() for c in cs]


INVARIANCE_WORK = [(impl, case) for impl in _declared_on_cpu() for case in _batched_cases(impl)]


def test_some_cpu_impl_declares_batch_invariance():
    """MLX's CPU qmm does (verified); without one the parametrized check below would be empty."""
    assert "mlx:qmm_quantized_matmul" in {impl.id for impl, _ in INVARIANCE_WORK}


@pytest.mark.parametrize("impl, case", INVARIANCE_WORK, ids=lambda v: getattr(v, "id", str(v)))
def test_declared_batch_invariant_impls_match_each_row_alone(impl, case):
    be = gpu_impls.backend(impl.backend)
    assert batch_variant_rows(impl, be, case) == [], (
        f"{impl.id} declares batch invariance; rows of {case.short()} differ from M = 1")


def _row_by_row(launch, inputs, outputs, case):
    """Each row through torch's M = 1 path: batch invariant by construction."""
    import torch

    from gpu_impls.torch.gemv import dequant_linear_run

    rows = [dequant_linear_run(launch, {**inputs, "x": inputs["x"][i:i + 1]}, None, case)["out"]
            for i in range(inputs["x"].shape[0])]
    return {"out": torch.cat(rows)}


def _k_reversed_when_batched(launch, inputs, outputs, case):
    """Mutant: the same dots, but with K summed back to front when M > 1 (an M-dependent order,
    as a kernel choosing its tiling by M would): within the oracle's bound, not invariant."""
    import torch.nn.functional as F

    from gpu_impls.torch.gemv import dequantize_f32

    x = inputs["x"]
    if x.shape[0] == 1:
        return _row_by_row(launch, inputs, outputs, case)
    w_hat = dequantize_f32(inputs["w"], inputs["scales"], inputs["biases"], case)
    return {"out": F.linear(x.flip(-1).float(), w_hat.flip(-1)).to(x.dtype)}


def test_the_batch_check_catches_an_m_dependent_summation_order():
    """Positive control, then the mutant: both pass the oracle, only the mutant's rows differ."""
    torch_be = gpu_impls.backend("torch")
    base = gpu_impls.impls()["torch:qmm_dequant_linear"]
    invariant = dataclasses.replace(base, name="row_by_row", run=_row_by_row,
                                    batch_invariant=True)
    mutant = dataclasses.replace(base, name="mutant_k_reversed_when_batched",
                                 run=_k_reversed_when_batched, batch_invariant=True)
    case = _case(m=32, out=40, n=1536, dtype="f32")
    for impl in (invariant, mutant):
        assert check(Work(impl, case, "valid"), torch_be)["status"] == "pass", impl.id
    assert batch_variant_rows(invariant, torch_be, case) == []
    assert len(batch_variant_rows(mutant, torch_be, case)) > 0


def test_torch_f_linear_is_not_batch_invariant_so_it_does_not_declare_it():
    """The measured reason behind torch:qmm_dequant_linear's missing declaration (CPU: one row
    goes through a GEMV, several through a GEMM that orders K differently)."""
    impl = gpu_impls.impls()["torch:qmm_dequant_linear"]
    assert impl.batch_invariant is False
    assert batch_variant_rows(impl, gpu_impls.backend("torch"), _case(m=32, out=40, n=1536))


def test_a_row_dependent_perturbation_is_named_by_row():
    """The check reports exactly the rows that differ: +1 ULP on rows 1 and 4 of a batch."""
    base = gpu_impls.impls()["mlx:qmm_quantized_matmul"]

    def nudged(launch, inputs, outputs, case):
        import mlx.core as mx

        out = np.array(base.run(launch, inputs, outputs, case)["out"])
        if out.shape[0] > 1:
            out[[1, 4]] = np.nextafter(out[[1, 4]], np.float32(np.inf))
        return {"out": mx.array(out)}

    mutant = dataclasses.replace(base, name="mutant_nudged_rows", run=nudged)
    assert batch_variant_rows(mutant, gpu_impls.backend("mlx"), _case(m=6)) == [1, 4]


def test_an_op_without_a_batch_dim_is_refused():
    impl = gpu_impls.impls()["torch:dequant_linear"]
    case = Case.make("dequant_gemv", {"out": 8, "in": 512, "bits": 4, "group_size": 64}, "f32")
    with pytest.raises(ValueError, match="declares no batch dim"):
        batch_variant_rows(impl, gpu_impls.backend("torch"), case)
