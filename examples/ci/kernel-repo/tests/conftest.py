"""pytest setup for the kparity gate (tests/test_kparity_gate.py).

kparity installs no pytest plugin: its `--tier` option and the `-m gpu` guard live in its own
tests/conftest.py. A kernel repository declares what it needs here:

- `--tier commit|nightly`: the gate's cases (kparity's `cases/tiers.py`); commit by default.
- `-m gpu` on a machine without an accelerator exits with status 3, naming what it looked for,
  instead of passing on the CPU; `KPARITY_ALLOW_CPU=1` runs the gate on the CPU anyway (the CI
  of this recipe, on a machine without a GPU).
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--tier", choices=("commit", "nightly"), default="commit",
                     help="the kparity gate's cases: commit (each impl's smallest cases that "
                          "cover what all show) or nightly (every gate case)")


def accelerators() -> tuple[list[str], list[str]]:
    """(backends with an accelerator here, why not for the others)."""
    import gpu_impls

    found, why = [], []
    for name in gpu_impls.BACKENDS:
        backend = gpu_impls.backend(name)
        ok, reason = backend.available()
        if ok and backend.accelerator:
            found.append(f"{name} ({backend.device()})")
        else:
            why.append(f"{name}: {reason if not ok else 'runs on cpu'}")
    return found, why


def pytest_configure(config):
    markexpr = config.getoption("markexpr") or ""
    wants_gpu = "gpu" in markexpr and "not gpu" not in markexpr
    if wants_gpu and os.environ.get("KPARITY_ALLOW_CPU") != "1":
        found, why = accelerators()
        if not found:
            pytest.exit("pytest -m gpu: no accelerator here, refusing to pass on the CPU "
                        "(KPARITY_ALLOW_CPU=1 runs it there). Looked for: " + "; ".join(why),
                        returncode=3)
