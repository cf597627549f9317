"""FP4 (NVFP4, MXFP4) cases: tiny gate shapes (rows 1-4, cols 32-128) for every format and scale
rule, with the named distributions and three planted ones (`oracle/fp4.py`'s `plant`):

    e2m1_ties        every E2M1 tie point t (0.25, 0.75, ..., 5) and -t, as t/2 in blocks of amax
                     3 whose scaled values are exactly t (nvfp4: x[0, 0] = 5.25, so gs_enc = 512,
                     sf = 256, enc = 2; mxfp4: 2^e = 1/2)
    scale_edges      block amaxes just below, at and just above 6 * 2^k and 4 * 2^k (where
                     floor(log2 amax) and ceil(log2(amax / 6)) change: the MX rules part)
    one_outlier      x[0, 0] 1e4 x the rest (the tensor's amax), and an all-zero block
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


# --- fp4_gemv: tiny gate shapes (m, out, in); the model shapes as bench presets ----------------
GEMV_SHAPES = ((1, 8, 64), (3, 32, 256))
GEMV_DISTS = ("normal", "outlier_rows", "zero_rows", "e2m1_ties", "scale_edges", "one_outlier")


@gate_cases("fp4_gemv")
def fp4_gemv_cases():
    """Each format's first rule over every shape and distribution; the other rules (the weights'
    encoding only: the GEMV reads whatever codes and scales it is given) on normal data."""
    out = []
    for fmt, rules in RULES.items():
        for rule, dtype, (m, n, k), dist in product(rules, FLOAT_DTYPES, GEMV_SHAPES, GEMV_DISTS):
            if rule != rules[0] and (dist != "normal" or m == 1):
                continue
            out.append(Case.make("fp4_gemv", {"m": m, "out": n, "in": k}, dtype, dist,
                                 params={"format": fmt, "scale_rule": rule},
                                 label=f"preset:{fmt}-{rule}"))
    return out


@bench_cases("fp4_gemv")
def fp4_gemv_bench():
    return [Case.make("fp4_gemv", {"m": 1, "out": r, "in": c}, "bf16",
                      params={"format": fmt, "scale_rule": RULES[fmt][0]}, label=f"bench:{name}")
            for (name, r, c), fmt in product(BENCH, RULES)]
