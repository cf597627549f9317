"""Mamba-2's causal conv1d (prefill and step) and gated group RMSNorm cases (`oracle/conv1d.py`,
`oracle/gated_norm.py`).

Shapes: Nemotron-3-Nano (`cases/configs.py`: conv_dim = inner + 2·groups·state = 6144, conv
kernel 4; the gated norm over rows × 4096 in 8 groups of 512), and small channels counts that
are no multiple of 4 or 32 (37, 5) at widths 2, 3 and 4, over T in {1, 2, 3, 4, 5, 64}: fewer
tokens than the state holds, exactly W-1 and W, one past, and a long run. The gate stays small
(CI: `kparity check` of the three ops takes seconds on CPU); model-sized work is in the bench
presets (`bench:` labels): the step at batch 1 and 64, the prefill at T = 2048.

Distributions: x and a given state take the case's (`initial_state`: "zero", a fresh sequence,
or "given", raw inputs like x); the weight and bias are PyTorch's `nn.Conv1d` default (Mamba-2's
conv1d): U(-1/√W, 1/√W) each, fan-in W for a depthwise conv. The norm's y takes the case's
distribution, z the `gate` init (N(0, 2²): silu sees both tails), weight ~ 1 + N(0, 0.1²).
"""

from __future__ import annotations

from itertools import product

import numpy as np

from cases.configs import config
from cases.distributions import DISTRIBUTIONS
from cases.distributions import values as distribution_values
from cases.inits import init
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES

NANO = config("nemotron-3-nano-30b-a3b").ssm
NANO_CONV_DIM = NANO["inner"] + 2 * NANO["groups"] * NANO["state"]  # 6144
NANO_WIDTH = NANO["conv_kernel"]  # 4
NANO_INNER, NANO_GROUPS = NANO["inner"], NANO["groups"]  # the gated norm: 4096 in 8 groups
SMALL_CHANNELS = 37  # no multiple of 4 or 32: a vectorised kernel's tail
GATE_TOKENS = (1, 2, 3, 4, 5, 64)
WIDTHS = (2, 3, 4)


# --- inits ---------------------------------------------------------------------------------------

def _fan_in_uniform(shape, rng, width: int):
    bound = 1.0 / np.sqrt(width)
    return rng.uniform(-bound, bound, shape)


@init("conv_weight")
def conv_weight(shape, dtype, rng, case, drawn):
    """nn.Conv1d's default: U(-1/√W, 1/√W) (kaiming_uniform with a = √5, fan-in W)."""
    return _fan_in_uniform(shape, rng, case.dims["width"])


@init("conv_bias")
def conv_bias(shape, dtype, rng, case, drawn):
    """nn.Conv1d's default bias: U(-1/√W, 1/√W). Drawn with bias=False too (to be ignored)."""
    return _fan_in_uniform(shape, rng, case.dims["width"])


@init("conv_state", adversarial=True)
def conv_state(shape, dtype, rng, case, drawn, dist):
    """The W-1 previous raw inputs: zero (param initial_state "zero") or the case's
    distribution, as x."""
    if case.params["initial_state"] == "zero":
        return np.zeros(shape)
    return distribution_values(dist, shape, dtype, rng)


# --- conv1d_causal --------------------------------------------------------------------------------

def _conv(op: str, batch: int, channels: int, width: int, dtype: str, tokens=None,
          dist: str = "normal", label: str = "edge", **params) -> Case:
    dims = {"batch": batch, "channels": channels, "width": width}
    if tokens is not None:
        dims["tokens"] = tokens
    return Case.make(op, dims, dtype, dist, params=params, label=label)


def _variants(op: str, tokens=None) -> list[Case]:
    """At W = 4: every distribution (f32 and bf16; a given state, so the state holds them too);
    without silu, without bias, each state (every dtype)."""
    cases = [_conv(op, 2, SMALL_CHANNELS, 4, dtype, tokens, dist, f"dist:{dist}",
                   initial_state="given")
             for dist, dtype in product(DISTRIBUTIONS, ("f32", "bf16")) if dist != "normal"]
    for name, params in (("no-silu", {"silu": False}), ("no-bias", {"bias": False}),
                         ("state-zero", {"initial_state": "zero"}),
                         ("state-given", {"initial_state": "given"})):
        cases += [_conv(op, 2, SMALL_CHANNELS, 4, dtype, tokens, label=f"params:{name}", **params)
                  for dtype in FLOAT_DTYPES]
    return cases


@gate_cases("conv1d_causal")
def conv1d_causal_cases() -> list[Case]:
    """Nemotron-3-Nano's conv (D 6144, W 4) over 5 tokens from a given state; D = 37 at W 2, 3,
    4 over T in {1, 2, 3, 4, 5, 64} (given state; f32 for every T, bf16 and f16 at 5 and 64);
    the distributions and params at W 4, T 5."""
    op = "conv1d_causal"
    cases = [_conv(op, 1, NANO_CONV_DIM, NANO_WIDTH, dtype, 5, label="preset:nemotron-3-nano",
                   initial_state="given") for dtype in FLOAT_DTYPES]
    cases += [_conv(op, 2, SMALL_CHANNELS, w, dtype, t, initial_state="given")
              for w, t, dtype in product(WIDTHS, GATE_TOKENS, FLOAT_DTYPES)
              if dtype == "f32" or t in (5, 64)]
    return cases + _variants(op, 5)


@gate_cases("conv1d_causal_step")
def conv1d_causal_step_cases() -> list[Case]:
    """Nemotron-3-Nano's conv (D 6144, W 4) at batch 1 and 4; D = 37 and 5 at W 2, 3, 4; the
    distributions and params at W 4 (the default state is given: a decode step carries one)."""
    op = "conv1d_causal_step"
    cases = [_conv(op, b, NANO_CONV_DIM, NANO_WIDTH, dtype, label="preset:nemotron-3-nano")
             for b, dtype in product((1, 4), FLOAT_DTYPES)]
    cases += [_conv(op, 3, d, w, dtype) for d, w, dtype in
              product((SMALL_CHANNELS, 5), WIDTHS, FLOAT_DTYPES)]
    return cases + _variants(op)


def _bench_conv(op: str, label: str, batch: int, tokens=None) -> Case:
    return _conv(op, batch, NANO_CONV_DIM, NANO_WIDTH, "bf16", tokens,
                 label=f"bench:nemotron-3-nano-{label}", initial_state="given")


@bench_cases("conv1d_causal")
def conv1d_causal_bench() -> list[Case]:
    """Prefill at Nemotron-3-Nano's conv: batch 1 over 2048 tokens."""
    return [_bench_conv("conv1d_causal", "t2048", 1, 2048)]


@bench_cases("conv1d_causal_step")
def conv1d_causal_step_bench() -> list[Case]:
    """The decode step at Nemotron-3-Nano's conv, batch 1 and 64 (issue 30's speed target: >= 90 %
    of the copy ceiling counting the state's read and write)."""
    return [_bench_conv("conv1d_causal_step", f"b{b}", b) for b in (1, 64)]


# --- gated_group_rmsnorm -------------------------------------------------------------------------

def _norm(rows: int, dim: int, groups: int, dtype: str, dist: str = "normal", label="edge",
          **params) -> Case:
    return Case.make("gated_group_rmsnorm", {"rows": rows, "dim": dim, "groups": groups}, dtype,
                     dist, params=params, label=label)


@gate_cases("gated_group_rmsnorm")
def gated_group_rmsnorm_cases() -> list[Case]:
    """Nemotron-3-Nano's norm (4096 in 8 groups of 512, 3 rows) in both cast conventions, every
    dtype and distribution; small rows (groups of 1, 5, 37 and 64; one group) in every dtype."""
    cases = [_norm(3, NANO_INNER, NANO_GROUPS, dtype, dist, "preset:nemotron-3-nano", cast=cast)
             for cast, dtype, dist in product(("once", "hf"), FLOAT_DTYPES, DISTRIBUTIONS)]
    cases += [_norm(5, dim, groups, dtype, cast=cast)
              for (dim, groups), dtype, cast in
              product(((4, 4), (40, 8), (74, 2), (64, 1)), FLOAT_DTYPES, ("once", "hf"))]
    return cases


@bench_cases("gated_group_rmsnorm")
def gated_group_rmsnorm_bench() -> list[Case]:
    """Decode (1 and 64 rows) and prefill (2048 rows) at Nemotron-3-Nano's 4096 in 8 groups."""
    return [_norm(r, NANO_INNER, NANO_GROUPS, "bf16", label=f"bench:nemotron-3-nano-{kind}-{r}")
            for kind, r in (("decode", 1), ("decode", 64), ("prefill", 2048))]
