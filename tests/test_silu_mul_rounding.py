"""`silu_mul`'s rounding conventions (`oracle/activations.py`): "once" (one rounding at the
store) and "act" (HF's LlamaMLP in T and Liger: silu rounded to T before the product). Each
torch impl passes every gate case of its own convention, and the same computation judged under
the other convention fails some bf16 case: the bound tells the two apart (a kernel that skips
the declared rounding, or adds one, is caught)."""

from __future__ import annotations

import dataclasses

import pytest

import gpu_impls
from cases.generate import Work, gate_cases
from gpu_impls.contract import NO_CONTRACT
from runners.correctness import check

OWN = {"torch:silu_mul": "once", "torch:silu_mul_hf": "act"}


def _cases(rounding: str, dtype: str) -> list:
    return [c for c in gate_cases("silu_mul") if c.params["rounding"] == rounding
            and c.dtype == dtype and c.label.startswith("preset:")]


@pytest.mark.parametrize("impl_id", sorted(OWN))
def test_each_convention_passes_its_own_and_fails_the_other(impl_id):
    impl = gpu_impls.impls()[impl_id]
    backend = gpu_impls.backend("torch")
    own = _cases(OWN[impl_id], "bf16")
    assert own and all(impl.contract.admits(c) for c in own)
    rows = [check(Work(impl, c, "valid"), backend) for c in own]
    assert all(r["status"] == "pass" for r in rows), [r["message"] for r in rows][:2]
    other = "act" if OWN[impl_id] == "once" else "once"
    forced = dataclasses.replace(impl, contract=NO_CONTRACT)  # run where its contract refuses
    rows = [check(Work(forced, c, "valid"), backend) for c in _cases(other, "bf16")]
    assert any(r["status"] == "fail" for r in rows), (
        f"{impl_id} ({OWN[impl_id]}) passed every rounding={other} case")
