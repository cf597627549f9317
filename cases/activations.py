"""Activation cases: `silu_mul` over the models' MLP widths (`cases/configs.py`), block edges,
and the adversarial distributions (the gate's tails are where exp leaves f32's range);
`clipped_swiglu` at GPT-OSS-20B's expert width, its inputs straddling the clamps."""

from __future__ import annotations

from itertools import product

from cases.configs import config
from cases.distributions import DISTRIBUTIONS
from cases.distributions import values as distribution_values
from cases.inits import init
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
    # HF's convention (silu rounded to T first) on every preset's normal rows and the edges
    act = [c.replace(rounding="act") for c in presets + edges if c.dist == "normal"]
    return presets + edges + act


@bench_cases("silu_mul")
def silu_mul_bench() -> list[Case]:
    """A prefill chunk of 512 tokens at each MLP width."""
    return [Case.make("silu_mul", {"rows": 512, "n": config(m).intermediate}, dtype,
                      label=f"bench:{m}")
            for m, dtype in product(MLP_MODELS, FLOAT_DTYPES)]


@init("clipped", adversarial=True)
def clipped(shape, dtype, rng, case, drawn, dist):
    """The case's distribution times limit / 2: ~5 % of normal values beyond +-limit."""
    return distribution_values(dist, shape, dtype, rng) * case.params["limit"] / 2


CLIPPED_MODEL = "gpt-oss-20b"  # the model whose MLP clips (limit 7, alpha 1.702)


@gate_cases("clipped_swiglu")
def clipped_swiglu_cases() -> list[Case]:
    n = config(CLIPPED_MODEL).intermediate
    label = f"preset:{CLIPPED_MODEL}"
    presets = [Case.make("clipped_swiglu", {"rows": rows, "n": n}, dtype, label=label)
               for rows, dtype in product(DECODE_ROWS, FLOAT_DTYPES)]
    dists = [Case.make("clipped_swiglu", {"rows": 3, "n": n}, dtype, dist, label=label)
             for dist, dtype in product(DISTRIBUTIONS[1:], FLOAT_DTYPES)]
    both = [Case.make("clipped_swiglu", {"rows": 3, "n": n}, dtype, params={"gate_clamp": "both"},
                      label=f"{label}-clamp-both") for dtype in FLOAT_DTYPES]
    edges = [Case.make("clipped_swiglu", {"rows": 2, "n": e}, dtype, label="edge")
             for e, dtype in product((1, 33, 257), FLOAT_DTYPES)]
    return presets + dists + both + edges


@bench_cases("clipped_swiglu")
def clipped_swiglu_bench() -> list[Case]:
    """A decode step's 4 routed experts (4 rows) and a prefill chunk of 512 tokens (labels
    without "decode", the CPU bench's default preset: the norms' small rows)."""
    n = config(CLIPPED_MODEL).intermediate
    return [Case.make("clipped_swiglu", {"rows": rows, "n": n}, dtype,
                      label=f"bench:{CLIPPED_MODEL}-{kind}")
            for (kind, rows), dtype in product((("experts4", 4), ("prefill512", 512)),
                                               FLOAT_DTYPES)]
