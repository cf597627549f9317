"""Quantized GEMV cases: every bit width and group size at small shapes (correctness), and the
issue's model shapes at int4 g64 (timing). `reference/ops.md` §4 for the model shapes.

Gate shapes are small (out 8 and 24, in 512 and 1536): correctness depends on the layout (bits,
group size, where groups and words fall), not on the matrix size. Distributions apply to x:
normal, outlier (one x element 1000x), zero (x all zero: out must be exactly 0), constant.
"""

from __future__ import annotations

from itertools import product

from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES
from oracle.quant import BITS, GROUP_SIZES

GATE_SHAPES = ((8, 512), (24, 1536))
GATE_DISTS = ("normal", "outlier_rows", "zero_rows", "constant_rows")
# (preset, out, in): Llama-3-8B MLP up/down, Qwen2.5-32B MLP up, a 4096 square.
BENCH_SHAPES = (("llama3-8b-up", 14336, 4096), ("llama3-8b-down", 4096, 14336),
                ("qwen2.5-32b-up", 27648, 5120), ("square-4096", 4096, 4096))


@gate_cases("dequant_gemv")
def dequant_gemv_cases():
    cases = []
    for (out, n), bits, group, dtype in product(GATE_SHAPES, BITS, GROUP_SIZES, FLOAT_DTYPES):
        dists = GATE_DISTS if bits == 4 else ("normal",)
        for dist in dists:
            cases.append(Case.make("dequant_gemv", {"out": out, "in": n, "bits": bits,
                                                    "group_size": group}, dtype, dist,
                                   label=f"preset:int{bits}-g{group}"))
    return cases


@bench_cases("dequant_gemv")
def dequant_gemv_bench():
    return [Case.make("dequant_gemv", {"out": out, "in": n, "bits": 4, "group_size": 64}, dtype,
                      label=f"bench:{name}")
            for (name, out, n), dtype in product(BENCH_SHAPES, FLOAT_DTYPES)]
