"""The MoE grouped GEMM's CUDA-side impls on the GPU (issue 31), beyond the gate (tests/test_gpu.py
runs `cuda:kp_moe_grouped_gemm` and `torch:grouped_mm` over the op's gate cases):

* `cuda:kp_moe_grouped_gemm` on its three kernels (`gpu_impls/cuda/moe_gemm.py`): the GEMV at
  every rows-a-tile instance (MT 1, 2, 4, 8) and with 1, 2 and 4 warps splitting K, a partial
  slab of columns; the tensor-core tiles with an expert over three 64-row tiles, a partial
  column slab, several K steps, one expert, empty experts; dense and affine4, every dtype each
  kernel takes; a decode step (k rows on k of 128 experts, the lookup scanning 4 warps' worth
  of experts); kp_moe_qgemv_mma (affine4 decode) at the models' decode shapes, on normal,
  outlier and zero rows, three runs bit for bit; T = 2048, k = 8, E = 128, K 2048, N 768
  (Qwen3-30B-A3B's up projection) in bf16 dense and affine4, every row written, rows at every tile edge of several experts within the
  oracle's bound, and two runs bit for bit;
* the mutant `cuda:mutant_kp_moe_tile_first_row` fails the gate's hot routing and passes a
  decode step (every expert one tile): the gate needs its expert over one tile;
* `torch:grouped_mm` (torch._grouped_mm) at T = 2048 in bf16: sampled rows within the bound and
  two runs bit for bit (its determinism is declared, not documented by torch).

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpu_impls
from cases.generate import Work, plan
from cases.model import Case, make_inputs
from gpu_impls.cuda.moe_gemm import uses_mma
from runners.correctness import check, oracle_for, run_impl
from runners.verdicts import is_failure, repro_command
from tests.gpu_helpers import assert_passes, cuda_backend as _cuda, impl as _impl

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]
KP = "cuda:kp_moe_grouped_gemm"
MUTANT = "cuda:mutant_kp_moe_tile_first_row"


def _case(rows, experts, k, n, dtype="bf16", weights="dense", routing="hot",
          dist="normal") -> Case:
    return Case.make("moe_grouped_gemm", {"rows": rows, "experts": experts, "in": k, "out": n},
                     dtype, dist, params={"weights": weights, "routing": routing}, label="gpu")


def _extra(case: Case) -> dict:
    return dict(_impl(KP).contract.check(KP, case).extra)


# (rows, experts, in, out, routing, the f16/bf16 kernel, rows a GEMV tile): each line one
# geometry; f32 always runs the GEMV
SHAPES = (
    (6, 128, 256, 64, "random", "gemv", 1),    # decode: 6 rows on 6 of 128 experts
    (6, 128, 256, 30, "sparse", "gemv", 1),    # odd experts only; a partial slab of 4 columns
    (6, 128, 192, 30, "random", "gemv", 1),    # K % 128 != 0: affine4 decode on the GEMV
    (7, 4, 128, 36, "random", "gemv", 2),
    (14, 4, 128, 30, "hot", "gemv", 4),        # 12 rows on one expert: 3 tiles of 4
    (70, 8, 2048, 36, "hot", "mma", 8),        # 66 rows on one expert; 32 K steps; f32 dense:
                                               # 2 warps
    (150, 4, 192, 96, "hot", "mma", 8),        # 148 rows on one expert: tiles of 64, 64, 20;
                                               # columns 64 + 32; 3 K steps
    (150, 8, 128, 64, "sparse", "mma", 8),     # 4 empty experts
    (130, 1, 64, 64, "balanced", "mma", 8),    # one expert, 3 tiles
)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s[:5])))
@pytest.mark.parametrize("weights", ["dense", "affine4"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_both_kernels_every_instance_and_edge(shape, weights, dtype):
    rows, experts, k, n, routing, kernel, mt = shape
    case = _case(rows, experts, k, n, dtype, weights, routing)
    extra = _extra(case)
    mma = dtype != "f32" and kernel == "mma"
    qgemv = weights == "affine4" and dtype != "f32" and rows <= experts and k % 128 == 0
    assert extra["qgemv"] == int(qgemv), extra
    if not qgemv:
        assert (extra["mma"], extra["mt"]) == (int(mma), 0 if mma else mt), extra
    assert_passes(KP, case)


def test_gemv_with_four_warps_and_k_not_a_multiple_of_64():
    """Dense f32 K 8192 (2048 chunks: 4 warps); f16 K 1032 at M >= 8 E (no tensor cores: K
    steps of 64)."""
    for case in (_case(9, 2, 8192, 12, "f32", routing="random"),
                 _case(70, 8, 1032, 20, "f16", routing="hot")):
        assert not uses_mma(case.dims, {**case.params, "dtype": case.dtype})
        assert_passes(KP, case)


@pytest.mark.parametrize("dist", ["outlier_rows", "zero_rows"])
@pytest.mark.parametrize("weights", ["dense", "affine4"])
def test_tensor_core_tiles_on_the_adversarial_rows(dist, weights):
    assert_passes(KP, _case(150, 4, 192, 96, "bf16", weights, "hot", dist))


@pytest.mark.nightly  # a real model's shape: the nightly tier
def test_decode_at_qwen3_shape():
    """k = 8 rows on 8 of Qwen3-30B-A3B's 128 experts, K 2048, N 768: dense on the GEMV,
    affine4 bf16 on kp_moe_qgemv_mma."""
    dense = _case(8, 128, 2048, 768, routing="random")
    assert _extra(dense) == {"mma": 0, "qgemv": 0, "mt": 1, "tiles": 8, "slabs": 192}
    assert_passes(KP, dense)
    case = _case(8, 128, 2048, 768, weights="affine4", routing="random")
    assert _extra(case)["qgemv"] == 1
    assert_passes(KP, case)


# (rows, experts, in, out): Nemotron-3-Nano's up projection at T = 1 and 7 (42 rows on 128
# experts: some own two), Qwen3-30B-A3B's gate+up at T = 1, GPT-OSS-20B-like K 2816 (22 blocks)
# experts. The model-sized ones (9-40 s each on an H100, the float64 oracle over every expert's
# weights) are the nightly tier's; the GPT-OSS-like K 2816 keeps the commit tier's check.
QGEMV_SHAPES = (*(pytest.param(s, marks=pytest.mark.nightly, id="-".join(map(str, s)))
                  for s in ((6, 128, 2688, 1856), (42, 128, 2688, 1856), (8, 128, 2048, 1536))),
                (4, 32, 2816, 640))


@pytest.mark.parametrize("shape", QGEMV_SHAPES, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("dist", ["normal", "outlier_rows", "zero_rows"])
def test_affine4_decode_on_kp_qgemv_mma(shape, dtype, dist):
    """kp_moe_qgemv_mma at the models' decode shapes; outlier rows put x outside the
    no-subtraction window (the subtraction path, per row: each row's blocks read their row)."""
    rows, experts, k, n = shape
    case = _case(rows, experts, k, n, dtype, "affine4", "random", dist)
    assert _extra(case)["qgemv"] == 1
    assert_passes(KP, case)


def test_affine4_decode_is_bit_identical_across_runs():
    case = _case(42, 128, 2688, 1856, weights="affine4", routing="random")
    inputs = make_inputs(case)
    runs = [run_impl(_impl(KP), _cuda(), case, inputs)["y"].tobytes() for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


# --- T = 2048: every row written, sampled rows against the oracle, two runs bit for bit -------

PREFILL = {"rows": 2048 * 8, "experts": 128, "k": 2048, "n": 768}


def _edge_rows(offsets: np.ndarray, experts) -> np.ndarray:
    """Rows at every 64-row tile edge of `experts` (first, last, both sides of each edge)."""
    picks = []
    for e in experts:
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        for t0 in range(lo, hi, 64):
            picks += [t0, min(t0 + 63, hi - 1)]
        picks += [hi - 1]
    return np.unique(np.array(picks, dtype=np.int64))


def _sampled_budget(impl_id, backend, case, inputs, y, picks) -> float:
    """The largest error / bound of rows `picks` of y, the oracle computed over those rows
    alone (the op is per row: a row's value depends on its x row and its expert only)."""
    off = inputs["offsets"].astype(np.int64)
    expert_of = np.searchsorted(off, picks, side="right") - 1
    counts = np.bincount(expert_of, minlength=case.dims["experts"])
    sub_case = case.replace(rows=len(picks))
    sub = {**inputs, "x": np.ascontiguousarray(inputs["x"][picks]),
           "offsets": np.concatenate([[0], np.cumsum(counts)]).astype(inputs["offsets"].dtype)}
    exact, _, bound = oracle_for(_impl(impl_id), backend, sub_case, sub, own_inputs=False)
    err = np.abs(y[picks].astype(np.float64) - exact["y"])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / bound["y"])
    return float(np.max(np.where(np.isnan(ratio), np.inf, ratio)))


def _prefill(impl_id, backend, weights):
    case = _case(PREFILL["rows"], PREFILL["experts"], PREFILL["k"], PREFILL["n"],
                 weights=weights, routing="random")
    inputs = make_inputs(case)
    impl = _impl(impl_id)
    first = run_impl(impl, backend, case, inputs)["y"]  # raises where a row went unwritten
    again = run_impl(impl, backend, case, inputs)["y"]
    assert first.tobytes() == again.tobytes(), f"{impl_id}: two runs differ"
    counts = np.diff(inputs["offsets"].astype(np.int64))
    assert counts.max() > 128 and (counts > 0).all()  # experts over 3 tiles
    experts = [0, 1, int(np.argmax(counts)), int(np.argmin(counts)), case.dims["experts"] - 1]
    picks = _edge_rows(inputs["offsets"], experts)
    assert _sampled_budget(impl_id, backend, case, inputs, first, picks) <= 1.0


@pytest.mark.nightly  # a real model's shape: the nightly tier
@pytest.mark.parametrize("weights", ["dense", "affine4"])
def test_prefill_t2048_qwen3_up(weights):
    _prefill(KP, _cuda(), weights)


@pytest.mark.nightly  # a real model's shape: the nightly tier
def test_torch_grouped_mm_prefill_t2048():
    backend = gpu_impls.backend("torch")
    ok, why = _impl("torch:grouped_mm").available(backend)
    if not ok:
        pytest.skip(why)
    _prefill("torch:grouped_mm", backend, "dense")


# --- the mutant -----------------------------------------------------------------------------------

def test_tile_first_row_mutant_fails_the_gate_and_passes_a_decode_step():
    """Red on every gate case of the hot routing (an expert over one tile of either kernel);
    green on a decode step, where every expert owns one row: the bug needs that gate case."""
    backend = _cuda()
    mutant = _impl(MUTANT)
    work = plan([mutant], invalid=False)
    failed = {w.case.id for w in work if is_failure(check(w, backend))}
    hot = [w.case for w in work if w.case.params["routing"] == "hot"]
    assert hot and all(c.id in failed for c in hot), (
        f"{MUTANT} passed a hot case; repro: {repro_command(MUTANT, hot[0].id)}")
    decode = _case(6, 128, 256, 64, routing="random")
    row = check(Work(mutant, decode, "valid"), backend)
    assert row["status"] == "pass", row["message"]
