"""Mamba-2 scan cases (`oracle/ssd.py`, `oracle/ssd_chunked.py`): the sequential scan, the
chunked SSD, the packed-sequence scan and the decode step.

Shapes (label, heads H, head dim P, groups G, state N): Nemotron-3-Nano's Mamba-2 layers (H 64,
P 64, G 8, N 128; `docs/model_shapes.md`), a Mamba-2-2.7B-like layer (H 80, P 64, G 1, N 128),
the seed's `ssm_replay` production cell (H 32, P 128, G 2, N 128; metaltile-std
`src/ffai/ssm_replay.rs`), and edge shapes: `edge` (H 4, P 8, G 2, N 16: two heads per group, so
h % G and h // (H / G) differ), `edge-odd` (H 6, P 3, G 3, N 5) and `edge-min` (H 1, P 1, G 1,
N 1). The CPU gate stays on the edge shapes over T in {1, 2, 4, 5, 63, 64, 65} (a chunk of 64
and its neighbours), the model shapes at T <= 2 (the scan) or one step; T in {2048, 16384} are
bench presets only (labels `bench:...`).

Distributions (params, each an input init below): dt by param `dt`, through dt_bias =
softplus⁻¹(dt0) with dt0 log-uniform per head on `mixed` [1e-3, 1] (decays exp(dt A) from 1e-7
to 0.999), `fast` [0.5, 5] (the state forgets every token) or `slow` [1e-4, 1e-3] (it remembers
~10^3 tokens: errors accumulate), and dt_raw ~ N(0, 0.5²); A = −exp(A_log), A in U(1, 16)
(Mamba-2's init); D ~ N(1, 0.5²); x, B and C from the case's distribution; z N(0, 2²) (`gate`);
the initial state zero, N(0, 1) (`given`) or N(0, 1000²) (`large`).
"""

from __future__ import annotations

from itertools import product

import numpy as np

from cases.inits import init
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES

# (label, heads, dim_p, groups, dim_n)
NEMOTRON = ("preset:nemotron-3-nano", 64, 64, 8, 128)
MAMBA2 = ("preset:mamba2-2.7b", 80, 64, 1, 128)
SEED = ("preset:seed", 32, 128, 2, 128)
TINY = ("edge", 4, 8, 2, 16)
ODD = ("edge-odd", 6, 3, 3, 5)
MIN = ("edge-min", 1, 1, 1, 1)
NARROW = ("edge-narrow", 2, 4, 1, 8)  # long chunks: the interval model holds Q² H P values
GATE_TOKENS = (1, 2, 4, 5, 63, 64, 65)
BENCH_TOKENS = (2048, 16384)
# (label suffix, params): each distribution away from the defaults
DISTS = (("dt-fast", {"dt": "fast"}), ("dt-slow", {"dt": "slow"}),
         ("state-given", {"initial_state": "given"}), ("state-large", {"initial_state": "large"}),
         ("gate", {"gate": True}), ("dt-clamp", {"dt_min": 0.01, "dt_max": 0.1}))


# --- inits ---------------------------------------------------------------------------------------

def softplus_inverse(y: np.ndarray) -> np.ndarray:
    return np.log(np.expm1(y))


DT_RANGE = {"mixed": (1e-3, 1.0), "fast": (0.5, 5.0), "slow": (1e-4, 1e-3)}


@init("ssd_dt_bias")
def ssd_dt_bias(shape, dtype, rng, case, drawn):
    """softplus⁻¹(dt0), dt0 log-uniform over the range of param `dt` (module docstring)."""
    lo, hi = DT_RANGE[case.params["dt"]]
    return softplus_inverse(np.exp(rng.uniform(np.log(lo), np.log(hi), shape)))


@init("ssd_dt_raw")
def ssd_dt_raw(shape, dtype, rng, case, drawn):
    return 0.5 * rng.standard_normal(shape)


@init("ssd_a_log")
def ssd_a_log(shape, dtype, rng, case, drawn):
    return np.log(rng.uniform(1.0, 16.0, shape))


@init("ssd_d")
def ssd_d(shape, dtype, rng, case, drawn):
    return 1.0 + 0.5 * rng.standard_normal(shape)


STATE_SCALE = {"zero": 0.0, "given": 1.0, "large": 1000.0}


@init("ssd_state")
def ssd_state(shape, dtype, rng, case, drawn):
    """The initial state, by param `initial_state`: zero, N(0, 1) or N(0, 1000²)."""
    return STATE_SCALE[case.params["initial_state"]] * rng.standard_normal(shape)


@init("ssd_cu_seqlens")
def ssd_cu_seqlens(shape, dtype, rng, case, drawn):
    """The exclusive prefix sums of param `segments`."""
    return np.cumsum([0, *case.params["segments"]])


# --- cases -------------------------------------------------------------------------------------

def dims(heads, batch: int | None = None, tokens: int | None = None) -> dict:
    _, h, p, g, n = heads
    out = {"heads": h, "dim_p": p, "groups": g, "dim_n": n}
    if batch is not None:
        out["batch"] = batch
    if tokens is not None:
        out["tokens"] = tokens
    return out


def case(op, heads, batch, tokens, dtype, params=None, label="", dist="normal") -> Case:
    return Case.make(op, dims(heads, batch, tokens), dtype, dist, params=params or {},
                     label=label or heads[0])


def _model_shapes(op: str, tokens: int | None) -> list[Case]:
    """One case per model shape, bf16: Nemotron-3-Nano with its gate as the model runs it (the
    norm folds it in HF; the op's gate stands in), Mamba-2-2.7B-like, the seed's cell."""
    return [case(op, NEMOTRON, 1, tokens, "bf16", {"initial_state": "given", "gate": True}),
            case(op, MAMBA2, 1, tokens, "bf16", {"initial_state": "given"}),
            case(op, SEED, 1, tokens, "bf16", {"initial_state": "given"})]


@gate_cases("ssd_scan")
def ssd_scan_cases() -> list[Case]:
    """Edge heads over T in GATE_TOKENS, every dtype; every distribution at T = 64 (f32 and bf16);
    non-finite inputs (IEEE propagation, token by token); a batch of 2, the odd and minimal edge
    shapes; the model shapes at T = 2."""
    op = "ssd_scan"
    cases = [case(op, TINY, 1, t, dtype) for t, dtype in product(GATE_TOKENS, FLOAT_DTYPES)]
    cases += [case(op, TINY, 1, 64, dtype, params, f"edge-{suffix}")
              for (suffix, params), dtype in product(DISTS, ("f32", "bf16"))]
    cases += [case(op, TINY, 1, 64, "bf16", label="edge-outlier_rows", dist="outlier_rows"),
              case(op, TINY, 1, 9, "f32", {"gate": True}, "edge-nonfinite", "nonfinite"),
              case(op, TINY, 2, 17, "bf16", {"initial_state": "given"}, "edge-batch2"),
              case(op, ODD, 1, 5, "f32", {"initial_state": "given", "gate": True}),
              case(op, MIN, 1, 5, "f16")]
    return cases + _model_shapes(op, 2)


def bench(op: str) -> list[Case]:
    """Prefill at the model shapes, batch 1, T in BENCH_TOKENS, bf16; the chunked form also
    with dots = "T" (`-dotsT`: the contract mamba_ssm's Triton kernels implement, so they time
    beside kparity's on the same cases)."""
    cases = [case(op, heads, 1, t, "bf16", {"initial_state": "given"},
                  label=f"bench:{heads[0].split(':')[1]}-t{t}")
             for heads, t in product((NEMOTRON, MAMBA2), BENCH_TOKENS)]
    if op == "ssd_chunked":
        cases += [case(op, NEMOTRON, 1, t, "bf16", {"initial_state": "given", "dots": "T"},
                       label=f"bench:nemotron-3-nano-t{t}-dotsT") for t in BENCH_TOKENS]
    return cases


@bench_cases("ssd_scan")
def ssd_scan_bench() -> list[Case]:
    return bench("ssd_scan")


@gate_cases("ssd_scan_varlen")
def ssd_scan_varlen_cases() -> list[Case]:
    """Packed sequences on the edge heads: three of (5, 1, 3) tokens from given states (the
    second and third start mid-batch, where a skipped reset shows), one of 65, a 1-token one
    first, every dtype; the distributions that move the state, bf16."""
    op = "ssd_scan_varlen"
    given = {"initial_state": "given"}
    cases = [case(op, TINY, None, None, dtype, {**given, "segments": segs})
             for segs, dtype in product(((5, 1, 3), (65,), (1, 64, 2)), FLOAT_DTYPES)]
    cases += [case(op, TINY, None, None, "bf16", {"segments": (7, 9), **params},
                   f"edge-{suffix}") for suffix, params in DISTS]
    cases += [case(op, NEMOTRON, None, None, "bf16", {**given, "segments": (1, 2)})]
    return cases


@gate_cases("ssm_step")
def ssm_step_cases() -> list[Case]:
    """The decode step: edge heads, batch 1 and 4, both layouts, every dtype; every distribution
    (the default state is `given`: a decode step carries one); the model shapes, both layouts."""
    op = "ssm_step"
    cases = [case(op, TINY, b, None, dtype, {"layout": layout})
             for b, layout, dtype in product((1, 4), ("hpn", "hnp"), FLOAT_DTYPES)]
    cases += [case(op, TINY, 4, None, dtype, params, f"edge-{suffix}")
              for (suffix, params), dtype in product(
                  DISTS + (("state-zero", {"initial_state": "zero"}),), ("f32", "bf16"))]
    cases += [case(op, ODD, 2, None, "f32", {"gate": True, "layout": "hnp"}),
              case(op, MIN, 1, None, "f16")]
    for c in _model_shapes(op, None):
        cases += [c, c.replace(layout="hnp")]
    return cases


@bench_cases("ssm_step")
def ssm_step_bench() -> list[Case]:
    """A decode step at the model shapes, batch 1 and 64 (issue 30's speed target: the state
    read and written at >= 90 % of the copy ceiling), both layouts."""
    return [case("ssm_step", heads, b, None, "bf16", {"layout": layout},
                 label=f"bench:{heads[0].split(':')[1]}-b{b}-{layout}")
            for heads, b, layout in product((NEMOTRON, MAMBA2), (1, 64), ("hpn", "hnp"))]


@gate_cases("ssd_chunked")
def ssd_chunked_cases() -> list[Case]:
    """Edge heads over T in GATE_TOKENS in chunks of 64, every dtype; chunks of 128 and 256 over
    one chunk and a tail (narrow heads); every distribution at T = 65 (f32 and bf16); the Triton
    roundings admitted (`dots="T"`, f16 and bf16); a batch of 2, the odd and minimal shapes;
    Nemotron-3-Nano and Mamba-2-2.7B at T = 2."""
    op = "ssd_chunked"
    cases = [case(op, TINY, 1, t, dtype) for t, dtype in product(GATE_TOKENS, FLOAT_DTYPES)]
    cases += [case(op, NARROW, 1, c + 3, "bf16", {"chunk": c, "initial_state": "given"},
                   f"edge-chunk{c}") for c in (128, 256)]
    cases += [case(op, TINY, 1, 65, dtype, params, f"edge-{suffix}")
              for (suffix, params), dtype in product(DISTS, ("f32", "bf16"))]
    cases += [case(op, TINY, 1, 65, dtype, {"dots": "T", "initial_state": "given"},
                   "edge-dots-T") for dtype in ("f16", "bf16")]
    cases += [case(op, TINY, 1, 65, "bf16", label="edge-outlier_rows", dist="outlier_rows"),
              case(op, TINY, 2, 33, "bf16", {"initial_state": "given"}, "edge-batch2"),
              case(op, ODD, 1, 70, "f32", {"initial_state": "given", "gate": True}),
              case(op, MIN, 1, 5, "f16")]
    return cases + _model_shapes(op, 2)[:2]


@bench_cases("ssd_chunked")
def ssd_chunked_bench() -> list[Case]:
    return bench("ssd_chunked")
