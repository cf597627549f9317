"""The kparity gate over this repository's own impls (`my_kernels.kparity_plugin.IMPLS`).

Each impl runs on its op's gate cases of the run's tier (`--tier`, tests/conftest.py) against
kparity's oracle, and each contract invariant's violating case must be refused before launch.
A failure names the impl, the case and a one-line `kparity repro` command.
"""

from __future__ import annotations

import pytest

import gpu_impls
from cases.generate import plan
from my_kernels.kparity_plugin import IMPLS
from runners.correctness import check
from runners.verdicts import is_failure, repro_command

pytestmark = pytest.mark.gpu


def gate_work(tier: str) -> list:
    """(impl, case) pairs of this repo's impls that can run here (their backend is available)."""
    registered = gpu_impls.impls()
    work = []
    for impl in IMPLS:
        impl = registered[impl.id]
        if impl.available(gpu_impls.backend(impl.backend))[0]:
            work += plan([impl], tier=tier)
    return work


def pytest_generate_tests(metafunc):
    if "work" in metafunc.fixturenames:
        metafunc.parametrize("work", gate_work(metafunc.config.getoption("tier")),
                             ids=lambda w: f"{w.impl.id}-{w.case.id}")


def test_entry_point_registers_every_impl():
    """pyproject.toml's `kparity.plugins` entry point is installed and registers IMPLS: what
    `kparity check` (no --plugin) finds too."""
    for impl in IMPLS:
        assert impl.id in gpu_impls.impls(), f"{impl.id}: not registered; pip install -e ."
        assert gpu_impls.origin(impl.id).startswith("entry point my_kernels = "), (
            f"{impl.id} registered by {gpu_impls.origin(impl.id)}, not by the entry point")


def test_every_impl_runs_here():
    missing = {i.id: i.available(gpu_impls.backend(i.backend))[1] for i in IMPLS
               if not i.available(gpu_impls.backend(i.backend))[0]}
    assert not missing, f"impls that cannot run on this machine: {missing}"


def test_gate(work):
    row = check(work, gpu_impls.backend(work.impl.backend))
    assert not is_failure(row), (
        f"{row['status']} {work.impl.id} case {work.case.id} ({work.case.short()}, "
        f"{work.case.label}): {row['message']}\n"
        f"repro: {repro_command(work.impl.id, work.case.id)}")
