"""Helpers shared by the GPU test modules (`tests/test_gpu_*.py`, `pytest -m gpu`)."""

from __future__ import annotations

import pytest

import gpu_impls
from cases.generate import Work
from cases.model import Case
from runners.correctness import check

MUTANTS = "tests/mutants.py"


def cuda_backend():
    """The CUDA backend, or the test skipped with the reason it is not available."""
    backend = gpu_impls.backend("cuda")
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    return backend


def impl(impl_id: str):
    """A registered impl; a test mutant's plugin (tests/mutants.py) loaded first."""
    if "mutant" in impl_id:
        gpu_impls.load_plugin(MUTANTS)
    return gpu_impls.impls()[impl_id]


def assert_passes(impl_id: str, case: Case):
    """`impl_id` passes `case` on the CUDA backend, else the row's status and message."""
    row = check(Work(impl(impl_id), case, "valid"), cuda_backend())
    assert row["status"] == "pass", (f"{row['status']} {impl_id} on {case.short()}: "
                                     f"{row['message']}\ncase: {case.to_json()}")
