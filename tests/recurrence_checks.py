"""What the recurrent ops' tests share (`tests/test_gdn.py`, `tests/test_ssd.py`): arrays compared
bit for bit (`bits`), and the state carrying across a split (`assert_state_carries`): tokens
[0, T1) and then [T1, T) from the first run's final state equal one run over [0, T), bit for bit
for an impl (its token loop does not know where the run began), within float64 noise for the
oracle."""

from __future__ import annotations

import numpy as np

from runners.correctness import run_impl


def bits(a) -> np.ndarray:
    """`a`'s storage bits, to compare bit for bit."""
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def assert_state_carries(case, inputs: dict, impl, backend, sliced, out: str, t1: int,
                         oracle_atol: float) -> None:
    """The property on `case` and its `inputs`, split at token `t1`. `sliced(inputs, lo, hi,
    state)`: the inputs over tokens [lo, hi) from `state`; `out`: the per-token output; the
    oracle's within rtol 1e-12 and `oracle_atol` (`out`) or 1e-14 (the state)."""
    t = case.dims["tokens"]
    whole = run_impl(impl, backend, case, inputs)
    first = run_impl(impl, backend, case.replace(tokens=t1), sliced(inputs, 0, t1, inputs["h0"]))
    second = run_impl(impl, backend, case.replace(tokens=t - t1),
                      sliced(inputs, t1, t, first["state"]))
    np.testing.assert_array_equal(bits(np.concatenate([first[out], second[out]], axis=1)),
                                  bits(whole[out]))
    np.testing.assert_array_equal(bits(second["state"]), bits(whole["state"]))
    exact = case.spec.oracle(inputs, case)
    a = case.spec.oracle(sliced(inputs, 0, t1, inputs["h0"]), case.replace(tokens=t1))
    b = case.spec.oracle(sliced(inputs, t1, t, a["state"]), case.replace(tokens=t - t1))
    np.testing.assert_allclose(np.concatenate([a[out], b[out]], axis=1), exact[out],
                               rtol=1e-12, atol=oracle_atol)
    np.testing.assert_allclose(b["state"], exact["state"], rtol=1e-12, atol=1e-14)
