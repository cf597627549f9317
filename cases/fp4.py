"""FP4 (NVFP4, MXFP4) cases: tiny gate shapes (rows 1-4, cols 32-128) for every format and scale
rule, with the named distributions and three planted ones (`oracle/fp4.py`'s `plant`):

    e2m1_ties        every E2M1 tie point (0.25, 0.75, ..., 5) and its negative, exactly, in
                     blocks whose amax makes the block scale 1 (nvfp4: amax 6 -> sf 1 with
                     gs_enc 2688/6 = 448... the tensor amax is 6 * 448 / 448)
    scale_edges      block amaxes just below, at and just above 6 * 2^k (where the MX rules part)
    one_outlier      one element 1e4 x the rest in a block, and an all-zero block
Model-like shapes are bench presets only.
"""

from __future__ import annotations

from itertools import product

from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES
from oracle.fp4 import RULES

GATE_SHAPES = ((1, 32), (3, 64), (4, 128))
GATE_DISTS = ("normal", "outlier_rows", "zero_rows", "constant_rows", "tiny", "f16_overflow",
              "e2m1_ties", "scale_edges", "one_outlier")


def _cases(op: str) -> list[Case]:
    out = []
    for fmt, rules in RULES.items():
        for rule, dtype, (rows, cols), dist in product(rules, FLOAT_DTYPES, GATE_SHAPES,
                                                       GATE_DISTS):
            if dist == "f16_overflow" and (rows, cols) != GATE_SHAPES[0]:
                continue
            out.append(Case.make(op, {"rows": rows, "cols": cols}, dtype, dist,
                                 params={"format": fmt, "scale_rule": rule},
                                 label=f"preset:{fmt}-{rule}"))
    return out


@gate_cases("fp4_quantize")
def fp4_quantize_cases():
    return _cases("fp4_quantize")


@gate_cases("fp4_dequantize")
def fp4_dequantize_cases():
    return _cases("fp4_dequantize")


# Nemotron-3-Nano's expert FFN (1856 x 2688) and GPT-OSS-20B's expert (2880 x 2880).
BENCH = (("nemotron-expert-up", 1856, 2688), ("gpt-oss-20b-expert", 2880, 2880))


def _bench(op: str) -> list[Case]:
    return [Case.make(op, {"rows": r, "cols": c}, "bf16",
                      params={"format": fmt, "scale_rule": RULES[fmt][0]}, label=f"bench:{name}")
            for (name, r, c), fmt in product(BENCH, RULES)]


@bench_cases("fp4_quantize")
def fp4_quantize_bench():
    return _bench("fp4_quantize")


@bench_cases("fp4_dequantize")
def fp4_dequantize_bench():
    return _bench("fp4_dequantize")
