"""Determinism on CPU backends: every impl that declares `deterministic=True` gives the same bits
twice on one case per op and dtype (the GPU gate does the same on the accelerator)."""

from __future__ import annotations

import pytest

import gpu_impls
from cases.generate import valid_cases
from runners.correctness import nondeterministic_outputs


def _work():
    out = []
    for impl in sorted(gpu_impls.impls().values(), key=lambda i: i.id):
        backend = gpu_impls.backend(impl.backend)
        if not impl.deterministic or not impl.available(backend)[0] or backend.accelerator:
            continue
        seen = set()
        for case in valid_cases(impl):
            if case.dist == "normal" and case.dtype not in seen:
                seen.add(case.dtype)
                out.append((impl, case))
    return out


@pytest.mark.parametrize("impl, case", _work(), ids=lambda v: getattr(v, "id", str(v)))
def test_deterministic_impls_repeat_bit_for_bit(impl, case):
    backend = gpu_impls.backend(impl.backend)
    assert nondeterministic_outputs(impl, backend, case) == []


def test_a_nondeterministic_output_is_named():
    """The check can fail: an impl adding run-dependent noise is caught by name."""
    import itertools

    import numpy as np

    from gpu_impls.impl import Impl

    counter = itertools.count()
    base = gpu_impls.impls()["torch:rms_norm"]

    def noisy(launch, inputs, outputs, case):
        out = base.run(launch, inputs, outputs, case)["out"]
        return {"out": out + np.float32(next(counter)) * 1e-3}
    impl = Impl(base.op, "torch", "noisy", noisy, base.contract)
    case = next(c for c in valid_cases(base) if c.dtype == "f32")
    assert nondeterministic_outputs(impl, gpu_impls.backend("torch"), case) == ["out"]
