"""Gated DeltaNet cases (`oracle/gdn.py`): the recurrence, the decode step and its fused prep.

Shapes: Qwen3-Next / Qwen3.5's linear-attention layers (Hk 16, Hv 32, K = V = 128), the seed
kernels' test shapes (Hk 2, Hv 4, K = V = 128), and tiny heads (Hk 1, Hv 2, K 16, V 8) where the
CPU sweep runs many tokens. Batch 1 and 4; T in {1, 63, 64, 65} in the gate (one chunk of 64
and its neighbours), T in {512, 4096, 16384} in the bench presets only (the float64 oracle walks
every token: minutes at the model's heads).

Distributions (params, each an input init below): the log-decay g `mixed` (log-uniform on
[−20, −1e-4]: gates exp(g) from 2e-9 to 0.9999), `near_one` (g in [−1e-3, −1e-4]: the state
remembers ~10^4 tokens) or `near_zero` (g in [−20, −5]: it forgets each token); beta `uniform`
on [0, 1], `near_zero` ([0, 1e-3]) or `near_one` ([1 − 1e-3, 1]); keys unnormalised (N(0, 1),
with `l2norm`, which normalises them) or unit rows (without it, as a caller that normalised
upstream passes them); the initial state zero, N(0, 1) (`given`) or N(0, 1000²) (`large`).
"""

from __future__ import annotations

from itertools import product

import numpy as np

from cases.distributions import values as distribution_values
from cases.inits import init
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES

# (label, heads_k, heads_v, dim_k, dim_v)
QWEN = ("preset:qwen3-next", 16, 32, 128, 128)  # Qwen3-Next-80B-A3B and Qwen3.5's GDN layers
SEED = ("preset:seed", 2, 4, 128, 128)          # the metaltile / mlx-native tests' shapes
TINY = ("edge", 1, 2, 16, 8)
GATE_TOKENS = (1, 63, 64, 65)
BENCH_TOKENS = (512, 4096, 16384)
# (label suffix, params): each distribution away from the defaults
DISTS = (("decay-near-one", {"decay": "near_one"}), ("decay-near-zero", {"decay": "near_zero"}),
         ("beta-near-zero", {"beta": "near_zero"}), ("beta-near-one", {"beta": "near_one"}),
         ("unit-keys", {"l2norm": False}), ("state-given", {"initial_state": "given"}),
         ("state-large", {"initial_state": "large"}))


# --- inits ---------------------------------------------------------------------------------------

@init("gdn_qk", adversarial=True)
def gdn_qk(shape, dtype, rng, case, drawn, dist):
    """q or k: the case's distribution, as is where the op normalises (`l2norm`), else unit rows
    (a caller that normalised upstream; unnormalised keys there make the recurrence expand)."""
    x = distribution_values(dist, shape, dtype, rng)
    if case.params.get("l2norm", True):
        return x
    norm = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
    return np.where(norm > 0, x / np.where(norm > 0, norm, 1.0), x)


LOG_DECAY = {"mixed": (1e-4, 20.0), "near_one": (1e-4, 1e-3), "near_zero": (5.0, 20.0)}


@init("gdn_log_decay")
def gdn_log_decay(shape, dtype, rng, case, drawn):
    """g <= 0, −|g| log-uniform over the range of param `decay` (module docstring)."""
    lo, hi = LOG_DECAY[case.params["decay"]]
    return -np.exp(rng.uniform(np.log(lo), np.log(hi), shape))


@init("gdn_beta")
def gdn_beta(shape, dtype, rng, case, drawn):
    """beta in [0, 1], by param `beta` (module docstring)."""
    kind = case.params["beta"]
    if kind == "near_zero":
        return rng.uniform(0.0, 1e-3, shape)
    if kind == "near_one":
        return 1.0 - rng.uniform(0.0, 1e-3, shape)
    return rng.uniform(0.0, 1.0, shape)


STATE_SCALE = {"zero": 0.0, "given": 1.0, "large": 1000.0}


@init("gdn_state")
def gdn_state(shape, dtype, rng, case, drawn):
    """The initial state, by param `initial_state`: zero, N(0, 1) or N(0, 1000²)."""
    return STATE_SCALE[case.params["initial_state"]] * rng.standard_normal(shape)


# The fused prep's parameters as Qwen3-Next initialises them (HF `Qwen3NextGatedDeltaNet`):
# A = U(0, 16) (here U(1, 16)), dt log-uniform on [1e-3, 0.1] through dt_bias = softplus⁻¹(dt);
# the norm weights fold the scale (metaltile's `mt_gated_delta_prep_chunk` doc,
# `src/ffai/gated_delta_prep_chunk.rs`: invKeyScale² = K^-1 for q, invKeyScale = K^-0.5 for k),
# so k̂ has norm ~1.

@init("gdn_q_norm_weight")
def gdn_q_norm_weight(shape, dtype, rng, case, drawn):
    return (1.0 + 0.1 * rng.standard_normal(shape)) / shape[-1]


@init("gdn_k_norm_weight")
def gdn_k_norm_weight(shape, dtype, rng, case, drawn):
    return (1.0 + 0.1 * rng.standard_normal(shape)) / np.sqrt(shape[-1])


@init("gdn_a_log")
def gdn_a_log(shape, dtype, rng, case, drawn):
    return np.log(rng.uniform(1.0, 16.0, shape))


@init("gdn_dt_bias")
def gdn_dt_bias(shape, dtype, rng, case, drawn):
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), shape))
    return np.log(np.expm1(dt))


@init("gdn_a_raw")
def gdn_a_raw(shape, dtype, rng, case, drawn):
    return rng.standard_normal(shape)


@init("gdn_b_raw")
def gdn_b_raw(shape, dtype, rng, case, drawn):
    return 2.0 * rng.standard_normal(shape)


# --- cases -------------------------------------------------------------------------------------

def _dims(heads, batch: int, tokens: int | None = None) -> dict:
    _, hk, hv, dk, dv = heads
    dims = {"batch": batch, "heads_k": hk, "heads_v": hv, "dim_k": dk, "dim_v": dv}
    return dims if tokens is None else {**dims, "tokens": tokens}


def _case(op, heads, batch, tokens, dtype, params=None, label=""):
    return Case.make(op, _dims(heads, batch, tokens), dtype, params=params or {},
                     label=label or heads[0])


@gate_cases("gdn_recurrent")
def gdn_recurrent_cases() -> list[Case]:
    """Tiny heads over T in {1, 63, 64, 65}, a batch of 4, the seed's heads over one chunk,
    and every distribution at 64 tokens (f32 and bf16)."""
    op = "gdn_recurrent"
    cases = [_case(op, TINY, 1, t, dtype) for t, dtype in product(GATE_TOKENS, FLOAT_DTYPES)]
    cases += [_case(op, TINY, 4, 17, dtype, label="edge-batch4") for dtype in ("f32", "bf16")]
    cases += [_case(op, SEED, 1, 64, dtype) for dtype in ("f32", "bf16")]
    cases += [_case(op, TINY, 2, 64, dtype, params, f"dist:{name}")
              for (name, params), dtype in product(DISTS, ("f32", "bf16"))]
    return cases


@bench_cases("gdn_recurrent")
def gdn_recurrent_bench() -> list[Case]:
    """Prefill at the model's heads, batch 1, T in {512, 4096, 16384}, and batch 4 at 512; the
    seed's heads, batch 4 at 512."""
    return ([_case("gdn_recurrent", QWEN, 1, t, "bf16", label=f"bench:qwen3-next-t{t}")
             for t in BENCH_TOKENS]
            + [_case("gdn_recurrent", heads, 4, 512, "bf16", label=f"bench:{name}-b4-t512")
               for name, heads in (("qwen3-next", QWEN), ("seed", SEED))])


def _step_cases(op: str, dists) -> list[Case]:
    cases = [_case(op, TINY, b, None, dtype) for b, dtype in product((1, 4), FLOAT_DTYPES)]
    cases += [_case(op, SEED, b, None, dtype) for b, dtype in product((1, 4), FLOAT_DTYPES)]
    cases += [_case(op, QWEN, 1, None, "bf16")]
    cases += [_case(op, TINY, 4, None, dtype, params, f"dist:{name}")
              for (name, params), dtype in product(dists, ("f32", "bf16"))]
    return cases


STEP_DISTS = tuple((n, p) for n, p in DISTS if n != "state-given") + (
    ("state-zero", {"initial_state": "zero"}),)


@gate_cases("gdn_step")
def gdn_step_cases() -> list[Case]:
    """Tiny and the seed's heads, batch 1 and 4, every dtype; one token at the model's heads;
    every distribution (the default state is `given`: a decode step carries one)."""
    return _step_cases("gdn_step", STEP_DISTS)


@gate_cases("gdn_step_prep")
def gdn_step_prep_cases() -> list[Case]:
    return _step_cases("gdn_step_prep", (("state-zero", {"initial_state": "zero"}),
                                         ("state-large", {"initial_state": "large"})))


def _step_bench(op: str) -> list[Case]:
    """A decode step at the model's heads, batch 1, 4 and 64 (issue 29's speed target: state
    read and write at >= 90 % of the copy ceiling at B = 64)."""
    return [_case(op, QWEN, b, None, "bf16", label=f"bench:qwen3-next-b{b}") for b in (1, 4, 64)]


@bench_cases("gdn_step")
def gdn_step_bench() -> list[Case]:
    return _step_bench("gdn_step")


@bench_cases("gdn_step_prep")
def gdn_step_prep_bench() -> list[Case]:
    return _step_bench("gdn_step_prep")
