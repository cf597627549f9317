"""No case that cannot fail (issue 49 item 3): over one gate case per (op, label, dist, dtype),
every preset and case generator, the all-zero output is admitted only where the exact answer
rounds to zero or the op's contract says why (`runners.bite.ZERO_ADMITTED`)."""

from __future__ import annotations

import numpy as np
import pytest

from cases.model import Case
from oracle.spec import registry
from runners import bite


@pytest.mark.nightly  # the oracle over ~1,100 cases: minutes on a 2-core CPU
def test_only_the_declared_cases_admit_the_all_zero_output():
    found = bite.zero_admitting(sorted(registry()))
    flagged = {(op, dist) for op, _, dist, _, _ in found}
    assert flagged <= set(bite.ZERO_ADMITTED), (
        "these cases admit the all-zero output where the exact answer is not zero, and their "
        "op does not say why (runners.bite.ZERO_ADMITTED):\n"
        + "\n".join(f"{op} {label} {dist} {dtype} case {cid}"
                    for op, label, dist, dtype, cid in found
                    if (op, dist) not in bite.ZERO_ADMITTED))
    assert set(bite.ZERO_ADMITTED) <= flagged, "a ZERO_ADMITTED entry no case needs"


def test_admits_zeros_tells_the_three_answers():
    """f32_overflow rms_norm: zeros admitted (True); a normal row: not (False); silu_mul of
    tiny x and y, whose products underflow to 0: the right answer (None)."""
    over = next(c for c in bite.representatives("rms_norm")
                if c.dist == "f32_overflow" and c.dtype == "f32")
    assert bite.admits_zeros(over) is True
    normal = Case.make("rms_norm", {"rows": 3, "n": 64}, "f32", "normal")
    assert bite.admits_zeros(normal) is False
    tiny = Case.make("silu_mul", {"rows": 2, "n": 64}, "f32", "tiny")
    assert bite.admits_zeros(tiny) is None


def test_the_zeros_mistake_changes_every_element():
    x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    assert (bite.zeros(x, "f32") == 0).all() and bite.zeros(x[:0], "f32") is None
