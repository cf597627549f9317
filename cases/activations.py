"""Activation cases: `silu_mul` over the models' MLP widths (`cases/configs.py`), block edges,
and the adversarial distributions (the gate's tails are where exp leaves f32's range)."""

from __future__ import annotations

from itertools import product

from cases.configs import config
from cases.distributions import DISTRIBUTIONS
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES

MLP_MODELS = ("qwen3-0.6b", "llama-3.2-1b", "qwen3-8b", "llama-3.1-8b", "gpt-oss-20b")
DECODE_ROWS = (1, 3)  # a decode token, and a short odd batch
# n within ±1 of one CUDA block (256 threads), a warp, and a single element
EDGE_N = (1, 31, 32, 33, 255, 256, 257)


@gate_cases("silu_mul")
def silu_mul_cases() -> list[Case]:
    presets = [Case.make("silu_mul", {"rows": rows, "n": config(m).intermediate}, dtype, dist,
                         label=f"preset:{m}")
               for m, rows, dtype, dist in product(MLP_MODELS, DECODE_ROWS, FLOAT_DTYPES,
                                                   DISTRIBUTIONS)]
    edges = [Case.make("silu_mul", {"rows": 2, "n": n}, dtype, label="edge")
             for n, dtype in product(EDGE_N, FLOAT_DTYPES)]
    return presets + edges


@bench_cases("silu_mul")
def silu_mul_bench() -> list[Case]:
    """A prefill chunk of 512 tokens at each MLP width."""
    return [Case.make("silu_mul", {"rows": 512, "n": config(m).intermediate}, dtype,
                      label=f"bench:{m}")
            for m, dtype in product(MLP_MODELS, FLOAT_DTYPES)]
