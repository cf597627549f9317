"""Quantized embedding gather cases: every bit width at group 64 and int4 at every group size,
a decode token and a short prefill (ids covering the table's first and last rows, one repeated),
at a small table (correctness depends on the layout, not on the vocabulary); bench at the
models' tables (`cases/configs.py`)."""

from __future__ import annotations

from itertools import product

import numpy as np

from cases.configs import config
from cases.inits import init
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES
from oracle.quant import BITS, GROUP_SIZES

GATE_VOCAB, GATE_HIDDEN = 300, 576  # SmolLM2's hidden: 18 groups of 32, 9 of 64
TOKENS = (1, 7)


@init("token_ids")
def token_ids(shape, dtype, rng, case, drawn):
    """Uniform ids in [0, vocab); with several tokens the last row, row 0 and a repeat."""
    vocab = case.dims["vocab"]
    ids = rng.integers(0, vocab, shape)
    if ids.size >= 3:
        ids[0], ids[1], ids[2] = vocab - 1, 0, ids[-1]
    return ids.astype(np.float64)


def _case(tokens: int, bits: int, group: int, dtype: str, label: str) -> Case:
    return Case.make("quant_embedding", {"tokens": tokens, "vocab": GATE_VOCAB,
                                         "hidden": GATE_HIDDEN if 576 % group == 0 else 512,
                                         "bits": bits, "group_size": group}, dtype, label=label)


@gate_cases("quant_embedding")
def quant_embedding_cases() -> list[Case]:
    widths = [_case(t, bits, 64, dtype, f"preset:int{bits}-g64")
              for t, bits, dtype in product(TOKENS, BITS, FLOAT_DTYPES)]
    groups = [_case(t, 4, g, dtype, f"preset:int4-g{g}")
              for t, g, dtype in product(TOKENS, GROUP_SIZES, FLOAT_DTYPES) if g != 64]
    return widths + groups


BENCH_MODELS = ("smollm2-135m", "llama-3.1-8b")


@bench_cases("quant_embedding")
def quant_embedding_bench() -> list[Case]:
    """A decode token and a 512-token prefill at each model's table, int4 g64."""
    return [Case.make("quant_embedding", {"tokens": t, "vocab": config(m).vocab,
                                          "hidden": config(m).hidden, "bits": 4,
                                          "group_size": 64}, dtype, label=f"bench:{m}-t{t}")
            for m, t, dtype in product(BENCH_MODELS, (1, 512), FLOAT_DTYPES)]
