"""scripts/mma_trace.py's summary of a kp_qgemv_mma trace (CPU: a synthetic trace)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

_SPEC = importlib.util.spec_from_file_location(
    "mma_trace", Path(__file__).parent.parent / "scripts" / "mma_trace.py")
mma_trace = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(mma_trace)


def _trace(blocks: int, warps: int, steps: int) -> np.ndarray:
    """Each warp w sits on sub-partition (w + block) % 4 (%warpid = w + block, as the hardware
    may start a block's warps anywhere); warps on sub-partitions 0 and 1 take 2x as long a step."""
    t = np.zeros((blocks * warps, mma_trace.EVENTS), dtype=np.int64)
    for b in range(blocks):
        for w in range(warps):
            row = t[b * warps + w]
            sub = (w + b) % 4
            row[1] = 7 | (w + b) << 16
            row[2] = steps
            row[3] = 1000
            clock = 1000
            for e in (4, 5):
                clock += 100
                row[e] = clock
            for i in range(steps):
                clock += 300  # waiting
                row[6 + 2 * i] = clock
                clock += 400 if sub < 2 else 200  # computing
                row[7 + 2 * i] = clock
            row[38] = clock + 50
    return t


def _table(lines: list[str]) -> list[list[str]]:
    """The per-warp table's rows (those starting with the warp index), split into fields."""
    return [line.split() for line in lines if line.strip() and line.split()[0].isdigit()]


def test_per_warp_table_takes_medians_over_blocks_that_place_warps_differently():
    warps, steps = 14, 4
    table = _table(mma_trace.summarize(_trace(8, warps, steps), warps, ns_per_clock=1.0))
    assert [int(r[0]) for r in table] == list(range(warps))
    for row in table:
        assert int(row[2]) in (3, 4)  # 14 warps: two sub-partitions hold 4, two hold 3
        # each warp is on a slow sub-partition (4 steps x 400 clocks) in half of the blocks
        assert float(row[6]) == 1.2


def test_the_sub_partition_of_a_fixed_placement_and_its_load():
    warps, steps = 14, 2
    t = _trace(1, warps, steps)  # one block: warp w on sub-partition w % 4
    table = _table(mma_trace.summarize(t, warps, ns_per_clock=1.0))
    assert [int(r[1]) for r in table] == [w % 4 for w in range(warps)]
    assert [int(r[2]) for r in table] == [4 if w % 4 < 2 else 3 for w in range(warps)]
    # slow sub-partitions 0 and 1: 2 steps x 400 clocks; the others 2 x 200
    assert [float(r[6]) for r in table] == [0.8 if w % 4 < 2 else 0.4 for w in range(warps)]
