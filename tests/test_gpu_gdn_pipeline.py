"""`cuda:kp_gdn_chunked` on the GPU (issue 29, `gpu_impls/cuda/gdn_pipeline.py`): the chunked
pipeline of kparity's CUDA stages against the float64 recurrence, beyond the gate
(tests/test_gpu.py runs it over gdn_chunked's seed-shaped gate cases):

* T padded to a multiple of 64 (a tail of 2 over a batch of 2; one token), without l2norm, a large
  initial state, the decay extremes, GQA 4;
* the stage kernels' mutants (kkt's decay sign, chunk_h's unscaled state, chunk_o's exclusive
  mask) carried through the composition go red: a wrong stage fails the whole pipeline too.

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run.
"""

from __future__ import annotations

import pytest

import gpu_impls
from cases.generate import Work
from cases.model import Case
from runners.correctness import check
from tests.gpu_helpers import cuda_backend as _cuda

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]
IMPL = "cuda:kp_gdn_chunked"
SEED = {"heads_k": 2, "heads_v": 4, "dim_k": 128, "dim_v": 128}


def _row(impl, case: Case) -> dict:
    return check(Work(impl, case, "valid"), _cuda())


# (heads, batch, tokens, dtype, params)
CASES = (
    (SEED, 2, 130, "bf16", {}),
    (SEED, 1, 1, "f16", {}),
    (SEED, 1, 192, "bf16", {"l2norm": False, "initial_state": "large"}),
    (SEED, 1, 100, "bf16", {"decay": "near_zero"}),
    (SEED, 1, 128, "f16", {"decay": "near_one", "beta": "near_one", "initial_state": "given"}),
    ({"heads_k": 1, "heads_v": 4, "dim_k": 128, "dim_v": 64}, 1, 64, "bf16", {}),
)


@pytest.mark.parametrize("heads, batch, tokens, dtype, params", CASES,
                         ids=[f"hk{h['heads_k']}-hv{h['heads_v']}-v{h['dim_v']}-b{b}-t{t}-{d}"
                              f"{'-' + '-'.join(map(str, p.values())) if p else ''}"
                              for h, b, t, d, p in CASES])
def test_pipeline_against_the_recurrence(heads, batch, tokens, dtype, params):
    case = Case.make("gdn_chunked", {**heads, "batch": batch, "tokens": tokens}, dtype,
                     params=params)
    row = _row(gpu_impls.impls()[IMPL], case)
    assert row["status"] == "pass", f"{row['status']} on {case.short()}: {row['message']}"


@pytest.mark.parametrize("define", ["KPARITY_MUTANT_DECAY_SIGN", "KPARITY_MUTANT_UNSCALED_STATE",
                                    "KPARITY_MUTANT_EXCLUSIVE_MASK"])
def test_a_wrong_stage_fails_the_pipeline(define):
    from gpu_impls.cuda._module import mutant

    impl = mutant(IMPL, f"mutant_kp_gdn_chunked_{define.lower()}", define)
    case = Case.make("gdn_chunked", {**SEED, "batch": 1, "tokens": 130}, "bf16",
                     params={"initial_state": "given"})
    row = _row(impl, case)
    assert row["status"] == "fail", f"{define}: {row['status']} {row['message']}"


def test_two_lengths_padding_to_one_workspace():
    """T = 100 then T = 65 pad to the same 128 tokens and share the workspace: the second must
    see a zero tail, not the first's rows 65..99 (the gate's T = 65 case failed so, its state off
    by budget 68, when the tail was zeroed only at allocation)."""
    impl = gpu_impls.impls()[IMPL]
    for tokens in (100, 65):
        case = Case.make("gdn_chunked", {**SEED, "batch": 1, "tokens": tokens}, "bf16")
        row = _row(impl, case)
        assert row["status"] == "pass", f"T={tokens}: {row['status']} {row['message']}"
