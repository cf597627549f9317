"""The GPU gate's batch invariance: every accelerator impl that declares `batch_invariant` on its
device gives row i of an M-row batch the bits of the 1-row run on row i alone, on every valid
gate case with more than one row (`runners.correctness.batch_variant_rows`, generic over any op
with an `OpSpec.batch`). A CUDA mutant proves the check goes red on the device.

`pytest -m gpu` selects it, with tests/test_gpu.py; without an accelerator the conftest guard fails
the run instead of passing empty.
"""

from __future__ import annotations

import pytest

import gpu_impls
from cases.generate import plan
from cases.model import Case
from runners.correctness import batch_variant_rows, check
from runners.verdicts import repro_command

pytestmark = pytest.mark.gpu


def _declared_on_accelerator(impl) -> bool:
    be = gpu_impls.backend(impl.backend)
    return (impl.available(be)[0] and be.accelerator and "mutant" not in impl.name
            and impl.batch_invariant_on(be.device()))


def _invariance_work():
    impls = sorted((i for i in gpu_impls.impls().values() if _declared_on_accelerator(i)),
                   key=lambda i: i.id)
    return [w for impl in impls for w in plan([impl], invalid=False)
            if w.case.dims[w.case.spec.batch.dim] > 1]


@pytest.mark.parametrize("work", _invariance_work(), ids=lambda w: f"{w.impl.id}-{w.case.id}")
def test_declared_batch_invariant_impls_match_each_row_alone(work):
    rows = batch_variant_rows(work.impl, gpu_impls.backend(work.impl.backend), work.case)
    assert not rows, (f"{work.impl.id} declares batch invariance but rows {rows} of case "
                      f"{work.case.id} ({work.case.short()}) differ from the same row run alone\n"
                      f"repro: {repro_command(work.impl.id, work.case.id)}")


@pytest.mark.cuda
def test_kp_qmm_mutant_with_an_m_dependent_sum_is_caught():
    """KPARITY_MUTANT_M_DEPENDENT_SUM sums a row's 8 lanes in another order when M > 1: the oracle
    still passes it (both orders are within the bound), the batch check does not."""
    from gpu_impls.cuda._module import mutant

    impl = mutant("cuda:kp_qmm", "mutant_kp_qmm_m_dependent_sum",
                  "KPARITY_MUTANT_M_DEPENDENT_SUM")
    cuda = gpu_impls.backend("cuda")
    case = Case.make("qmm", {"m": 32, "out": 40, "in": 1536, "bits": 4, "group_size": 64}, "f32")
    work = next(w for w in plan([impl], invalid=False) if w.case.id == case.id)
    assert check(work, cuda)["status"] == "pass"
    assert batch_variant_rows(impl, cuda, case), "the M-dependent lane order went unnoticed"


@pytest.mark.cuda
def test_kp_qmm_mutant_that_drops_a_partial_step_fails_the_commit_tier():
    """KPARITY_MUTANT_NO_PARTIAL_STEP walks only whole steps of 8 chunks (kp_qmm before it took
    SmolLM2's in = 576): the commit tier's cases with a partial last step fail it, and the real
    kernel passes them (tests/test_gpu.py)."""
    from gpu_impls.cuda._module import mutant
    from gpu_impls.cuda.qmm import step_codes

    impl = mutant("cuda:kp_qmm", "mutant_kp_qmm_no_partial_step", "KPARITY_MUTANT_NO_PARTIAL_STEP")
    cuda = gpu_impls.backend("cuda")
    partial = [w for w in plan([impl], tier="commit", invalid=False)
               if w.case.dims["in"] % step_codes(w.case.dims["bits"])]
    assert partial, "the commit tier has no qmm case with a partial K step"
    rows = [check(w, cuda) for w in partial]
    assert all(r["status"] == "fail" for r in rows), [
        (w.case.short(), r["status"]) for w, r in zip(partial, rows)]
