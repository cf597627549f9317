"""Quantized matmul (`qmm`) cases: M activation rows against one quantized W.

Gate (correctness): every M in GATE_M (odd M included: a kernel tiling M by 2, 4 or 8 must
handle a partial tile) at int4 g64 in every dtype; the layout sweep (bits 3, 4, 8 x group
32/64/128: int3 straddles words and is for the generic impls, the CUDA kernel takes int4/int8)
at M = 3 and 32; the adversarial x distributions at M = 3 and 16 (`zero_rows` makes every third
row of x zero, `outlier_rows` one element per row 1000x, `constant_rows` a constant per row).
Shapes are small: (8, 512), and (40, 1536) whose 40 rows are one whole and one partial block of
32 rows, with in = 1536 not a power of two. A K that is not a whole number of a K-splitting
kernel's steps (kp_qmm walks 256 int4 / 128 int8 codes a step): SmolLM2's hidden 576 (int4: two
steps and 2 of 8 chunks; int8: four and 4 of 8) at M = 1, 3, 8, 32, and in = 64 (one partial
step).

Bench (timing): Llama-3-8B's MLP up projection (14336 x 4096) at int4 g64 for M in
{1, 4, 16, 32} (`docs/model_shapes.md`).
"""

from __future__ import annotations

from itertools import product

from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES

GATE_M = (1, 2, 3, 4, 8, 16, 32)
GATE_SHAPES = ((8, 512), (40, 1536))
LAYOUT_BITS = (3, 4, 8)
LAYOUT_GROUPS = (32, 64, 128)
ADVERSARIAL = ("outlier_rows", "zero_rows", "constant_rows")
BENCH_M = (1, 4, 16, 32)


def _case(m: int, shape: tuple[int, int], bits: int, group: int, dtype: str,
          dist: str = "normal") -> Case:
    out, n = shape
    return Case.make("qmm", {"m": m, "out": out, "in": n, "bits": bits, "group_size": group},
                     dtype, dist, label=f"preset:int{bits}-g{group}-m{m}")


@gate_cases("qmm")
def qmm_cases():
    every_m = [_case(m, shape, 4, 64, dtype)
               for m, shape, dtype in product(GATE_M, GATE_SHAPES, FLOAT_DTYPES)]
    layouts = [_case(m, GATE_SHAPES[1], bits, group, dtype)
               for m, bits, group, dtype in product((3, 32), LAYOUT_BITS, LAYOUT_GROUPS,
                                                    FLOAT_DTYPES)]
    adversarial = [_case(m, GATE_SHAPES[1], 4, 64, dtype, dist)
                   for m, dtype, dist in product((3, 16), FLOAT_DTYPES, ADVERSARIAL)]
    partial_steps = [*(_case(m, (24, 576), 4, 64, dtype)
                       for m, dtype in product((1, 3, 8, 32), FLOAT_DTYPES)),
                     _case(8, (24, 576), 8, 32, "bf16"), _case(2, (8, 64), 4, 32, "f32")]
    return every_m + layouts + adversarial + partial_steps


@bench_cases("qmm")
def qmm_bench():
    return [Case.make("qmm", {"m": m, "out": 14336, "in": 4096, "bits": 4, "group_size": 64},
                      dtype, label=f"bench:llama3-8b-up-m{m}")
            for m, dtype in product(BENCH_M, FLOAT_DTYPES)]
