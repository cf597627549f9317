"""moe_grouped_gemm and moe_experts: the oracles against a masked dense reference (every expert
applied to every row, then each row's own kept), the routing layouts the gate needs, the bound
against the seed's, determinism, each expert's rows against the plain op on that expert alone,
and the segment off-by-one mutant caught by a gate case."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_impls
from cases.generate import Work, gate_cases
from cases.model import Case, make_inputs
from oracle.dtypes import round_to
from oracle.gemv import SEED_TOL
from oracle.moe_gemm import GROUP, expert_counts
from oracle.quant import dequantize
from runners.correctness import check, run_impl
from runners.verdicts import is_failure

SMALL = {"rows": 70, "experts": 4, "in": 64, "out": 32}
SMALL_MLP = {"rows": 70, "experts": 4, "hidden": 64, "inter": 32}
# The seeds (docs/seed_kernels.md): mt_moe_gather_qmm_int4 and the down_swiglu_accum kernel test
# at the GEMV's
SEED = SEED_TOL["dequant_gemv"]


def _gemm(weights="dense", routing="hot", dtype="bf16", **dims):
    return Case.make("moe_grouped_gemm", {**SMALL, **dims}, dtype,
                     params={"weights": weights, "routing": routing})


def _mlp(act="relu2", routing="hot", dtype="bf16", **dims):
    return Case.make("moe_experts", {**SMALL_MLP, **dims}, dtype,
                     params={"act": act, "routing": routing})


def _row_expert(case) -> np.ndarray:
    """The expert of each sorted row, from the counts (not the offsets input)."""
    d = case.dims
    return np.repeat(np.arange(d["experts"]), expert_counts(d["rows"], d["experts"],
                                                            case.params["routing"]))


def _masked(per_expert: np.ndarray, case) -> np.ndarray:
    """[E, M, N] -> [M, N]: each row's own expert's result."""
    return per_expert[_row_expert(case), np.arange(case.dims["rows"])]


# --- oracle ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("weights", ["dense", "affine4"])
def test_grouped_gemm_oracle_is_the_masked_dense_product(weights):
    case = _gemm(weights, "random", rows=23)
    inputs = make_inputs(case)
    if weights == "dense":
        w = inputs["w"].astype(np.float64)
    else:
        w = np.stack([dequantize(inputs["w_q"][e], inputs["scales"][e], inputs["biases"][e], 4,
                                 GROUP) for e in range(case.dims["experts"])])
    every = np.einsum("mk,enk->emn", inputs["x"].astype(np.float64), w)
    exact, rounded = case.spec.reference(inputs, case)
    np.testing.assert_allclose(exact["y"], _masked(every, case), rtol=1e-12, atol=1e-14)
    assert rounded["y"].dtype == inputs["x"].dtype


@pytest.mark.parametrize("act", ["relu2", "silu_mul"])
def test_experts_oracle_is_the_masked_dense_mlp(act):
    case = _mlp(act, "random", rows=23)
    inputs = make_inputs(case)
    x, up, down = (inputs[k].astype(np.float64) for k in ("x", "w_up", "w_down"))
    h = np.einsum("mk,euk->emu", x, up)
    inter = case.dims["inter"]
    a = (np.maximum(h, 0) ** 2 if act == "relu2"
         else h[..., :inter] / (1 + np.exp(-h[..., :inter])) * h[..., inter:])
    a = round_to(a, case.dtype).astype(np.float64)  # the declared rounding point
    every = np.einsum("emi,ehi->emh", a, down)
    exact, _ = case.spec.reference(inputs, case)
    np.testing.assert_allclose(exact["y"], _masked(every, case), rtol=1e-9, atol=1e-12)


def test_routing_layouts_cover_the_issue():
    """Counts sum to the rows; the hot gate expert spans more than one 64-row tile; hot and
    sparse leave experts empty; random is deterministic; every layout is in the gate."""
    for routing in ("balanced", "hot", "sparse", "random"):
        for rows, e in ((1, 4), (7, 4), (70, 8)):
            counts = expert_counts(rows, e, routing)
            assert counts.sum() == rows and (counts >= 0).all() and len(counts) == e
    assert expert_counts(70, 8, "hot").max() > 64 and expert_counts(70, 4, "hot").max() > 64
    assert (expert_counts(70, 8, "hot") == 0).any() and (expert_counts(70, 8, "sparse") == 0).any()
    assert (expert_counts(70, 8, "random") == expert_counts(70, 8, "random")).all()
    for op in ("moe_grouped_gemm", "moe_experts"):
        cases = gate_cases(op)
        assert {c.params["routing"] for c in cases} == {"balanced", "hot", "sparse", "random"}
        assert {c.dtype for c in cases} == {"f32", "f16", "bf16"}
        assert max(c.dims["rows"] for c in cases) <= 70
    assert {c.params["weights"] for c in gate_cases("moe_grouped_gemm")} == {"dense", "affine4"}
    assert {c.params["act"] for c in gate_cases("moe_experts")} == {"relu2", "silu_mul"}


def test_offsets_are_the_counts_prefix_sums_and_bytes_count_used_experts_only():
    case = _gemm("affine4", "sparse", rows=7, experts=8)
    offsets = make_inputs(case)["offsets"]
    assert offsets.dtype == np.int32
    assert list(offsets) == [0, *np.cumsum(expert_counts(7, 8, "sparse"))]
    # 4 of 8 experts own rows: half the weight bytes
    full = case.spec.io_bytes(case)
    weights = 8 * 32 * (64 // 8 * 4 + 2 * 2 * 64 // GROUP)  # words, then scales and biases
    assert case.spec.bytes(case) == full - weights // 2
    mlp = _mlp(routing="sparse", rows=7, experts=8)  # relu2: w_up [8, 32, 64], w_down [8, 64, 32]
    assert mlp.spec.bytes(mlp) == mlp.spec.io_bytes(mlp) - 2 * 8 * 32 * 64 * 2 // 2


@pytest.mark.parametrize("op", ["moe_grouped_gemm", "moe_experts"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_bounds_are_never_looser_than_the_seed(op, dtype):
    """bound / RMS(y) below the seed's test tolerance on every normal gate case."""
    for case in (c for c in gate_cases(op) if c.dtype == dtype and c.dist == "normal"):
        inputs = make_inputs(case)
        exact, _ = case.spec.reference(inputs, case)
        bound = case.spec.bounds(inputs, exact, case)["y"]
        assert bound.max() / np.sqrt(np.mean(exact["y"] ** 2)) < SEED[dtype], case.short()


# --- impls ----------------------------------------------------------------------------------------

def _backend(impl_id):
    return gpu_impls.backend(impl_id.split(":")[0])


def _run(impl_id, case, inputs=None):
    impl = gpu_impls.impls()[impl_id]
    return run_impl(impl, _backend(impl_id), case, make_inputs(case) if inputs is None
                    else inputs)


DETERMINISTIC = [("torch:grouped_linear", _gemm("dense")),
                 ("torch:grouped_dequant_linear", _gemm("affine4")),
                 ("torch:experts_linear_loop", _mlp("silu_mul")),
                 ("mlx:grouped_gather_mm", _gemm("dense", dtype="f32")),
                 ("mlx:grouped_gather_qmm", _gemm("affine4", dtype="f32")),
                 ("mlx:experts_gather_mm", _mlp("relu2", dtype="f32"))]


@pytest.mark.parametrize("impl_id, case", DETERMINISTIC, ids=[i for i, _ in DETERMINISTIC])
def test_impls_are_bit_identical_across_runs(impl_id, case):
    a, b = _run(impl_id, case)["y"], _run(impl_id, case)["y"]
    assert a.tobytes() == b.tobytes()


def _alone(case, inputs, e, lo, hi):
    """The grouped op on expert e's rows and weights alone (E = 1)."""
    alone = case.replace(rows=hi - lo, experts=1, routing="balanced")
    sub = {k: (v[e:e + 1] if v.size else v) for k, v in inputs.items()
           if k not in ("x", "offsets")}
    return alone, {**sub, "x": inputs["x"][lo:hi],
                   "offsets": np.array([0, hi - lo], dtype=inputs["offsets"].dtype)}


def _segments(case):
    off = np.concatenate([[0], np.cumsum(expert_counts(case.dims["rows"], case.dims["experts"],
                                                       case.params["routing"]))])
    return [(e, int(off[e]), int(off[e + 1])) for e in range(case.dims["experts"])
            if off[e + 1] > off[e]]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_torch_affine4_rows_equal_the_plain_qmm_of_their_expert(dtype):
    """Rows of expert e in one grouped call == torch:qmm_dequant_linear on e's slab and rows,
    bit for bit (the same f32 arithmetic), over a hot expert of 68 rows and empty experts."""
    case = _gemm("affine4", "hot", dtype=dtype)
    inputs = make_inputs(case)
    y = _run("torch:grouped_dequant_linear", case, inputs)["y"]
    for e, lo, hi in _segments(case):
        plain = Case.make("qmm", {"m": hi - lo, "out": case.dims["out"], "in": case.dims["in"],
                                  "bits": 4, "group_size": GROUP}, dtype)
        out = _run("torch:qmm_dequant_linear", plain,
                   {"w": inputs["w_q"][e], "scales": inputs["scales"][e],
                    "biases": inputs["biases"][e], "x": inputs["x"][lo:hi]})["out"]
        assert y[lo:hi].tobytes() == out.tobytes(), f"expert {e}"


@pytest.mark.parametrize("impl_id, case", [
    ("torch:grouped_linear", _gemm("dense", "hot")),
    ("torch:experts_linear_loop", _mlp("relu2", "sparse")),
    ("mlx:grouped_gather_mm", _gemm("dense", "random", dtype="f32")),
    ("mlx:grouped_gather_qmm", _gemm("affine4", "hot", dtype="f32"))])
def test_rows_of_an_expert_equal_the_op_on_that_expert_alone(impl_id, case):
    """The grouped call's rows of expert e, bit for bit, against the same impl given only e's
    rows and weights: no row depends on another expert's segment."""
    inputs = make_inputs(case)
    y = _run(impl_id, case, inputs)["y"]
    for e, lo, hi in _segments(case):
        alone, alone_in = _alone(case, inputs, e, lo, hi)
        assert y[lo:hi].tobytes() == _run(impl_id, alone, alone_in)["y"].tobytes(), f"expert {e}"


@pytest.fixture(scope="module")
def mutants():
    from pathlib import Path

    gpu_impls.load_plugin(str(Path(__file__).with_name("mutants.py")))
    return gpu_impls.impls()


def test_segment_off_by_one_is_caught_by_a_gate_case(mutants):
    """The mutant fails the gate cases (its control, the same loop on the right offsets,
    passes them): the first case here is M = 1 on 4 experts, the row read by expert 3."""
    torch_be = gpu_impls.backend("torch")
    cases = [c for c in gate_cases("moe_grouped_gemm") if c.params["weights"] == "dense"
             and c.dtype == "f32"][:4]
    for case in cases:
        assert not is_failure(check(Work(mutants["torch:grouped_linear"], case, "valid"),
                                    torch_be))
    failed = [c for c in cases
              if is_failure(check(Work(mutants["torch:mutant_moe_segment_off_by_one"], c,
                                       "valid"), torch_be))]
    assert failed == cases


# --- torch:grouped_mm (torch._grouped_mm: CUDA sm_90 / sm_100 only) ------------------------------

def test_grouped_mm_is_unavailable_off_its_gpus():
    """Registered for bf16 dense weights (in % 8), `requires` turning it away with the reason
    on a machine without an sm_90 / sm_100 GPU: `check` skips it there."""
    import torch

    impl = gpu_impls.impls()["torch:grouped_mm"]
    assert impl.contract.dtypes == ("bf16",)
    assert [inv.name for inv in impl.contract.invariants] == ["weights == 'dense'", "in % 8 == 0"]
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: tests/test_gpu_moe_gemm.py runs the impl")
    ok, why = impl.available(gpu_impls.backend("torch"))
    assert not ok and "sm_90" in why and "no GPU here" in why


def _grouped_mm_budget(case, call) -> float:
    """The largest error / bound of `call(x, w, offsets)` (torch CPU tensors) over the case's
    rows, judged as torch:grouped_mm is."""
    import torch

    from runners.correctness import oracle_for

    inputs = make_inputs(case)
    be = gpu_impls.backend("torch")
    args = (be.to_device(inputs[k]) for k in ("x", "w", "offsets"))
    with torch.no_grad(), np.errstate(invalid="ignore"):  # unwritten rows may hold NaN bits
        y = be.to_host(call(*args), case.dtype).astype(np.float64)
    exact, _, bound = oracle_for(gpu_impls.impls()["torch:grouped_mm"], be, case, inputs)
    err = np.abs(y - exact["y"])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / bound["y"])
    return float(np.max(np.where(np.isnan(ratio), np.inf, ratio)))  # NaN: rows never written


@pytest.mark.parametrize("routing", ["hot", "sparse", "random"])
def test_grouped_mm_call_takes_end_offsets_and_w_transposed(routing):
    """The impl's call (offs = offsets[1:], each group's END row, int32; W [E, N, K] viewed
    [E, K, N]) within the op's bound over empty experts and a 66-row expert, run by torch's CPU
    fallback (the same op: a per-group mm loop) where this torch has one; the start offsets
    instead (offsets[:-1], a leading zero) shift every group by one and leave the last
    expert's rows unwritten (torch's output is uninitialized past offs[-1]): they fail."""
    import torch

    from gpu_impls.torch.moe_gemm import grouped_mm

    case = _gemm("dense", routing, rows=70, experts=8, out=64, **{"in": 128})
    try:
        assert _grouped_mm_budget(case, grouped_mm) <= 1.0
    except (NotImplementedError, RuntimeError) as e:
        pytest.skip(f"torch {torch.__version__} runs no _grouped_mm on a CPU: {e}")
    starts = lambda x, w, off: torch._grouped_mm(x, w.transpose(-2, -1),  # noqa: E731
                                                 offs=off[:-1].to(torch.int32))
    assert _grouped_mm_budget(case, starts) > 1.0
