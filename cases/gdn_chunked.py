"""Gated DeltaNet chunked-pipeline cases (`oracle/gdn_chunked.py`): every stage op and the
composition `gdn_chunked`.

Shapes: Qwen3-Next / Qwen3.5's linear-attention layers (Hk 16, Hv 32, K = V = 128), the seed
kernels' test shapes (Hk 2, Hv 4, K = V = 128), and tiny heads (Hk 2, Hv 4, K 16, V 8) where the
CPU sweep runs. The gate (the default sweep, CPU in CI) stays on tiny heads and T <= 130: T in
{1, 63, 64, 65, 130} (one token, a chunk of 64 and its neighbours, two chunks and a tail), each
chunk size 16, 32, 64 at T = 65 and 130, a batch of 4, and the distributions below; plus the seed
shapes at T = 64 and 128 (f32 and bf16: one or two chunks at K = V = 128, the CUDA port's gate).
The model presets (label `preset:qwen3-next` / `preset:seed`, batch 1 and 4, T in {1, 63, 64,
65, 512, 4096, 16384}) are bench cases (`kparity bench --preset qwen3-next`) and a `--preset`
away for `check` on a GPU host: their float64 oracles take seconds to minutes.

Raw inputs (`draw_raw`; the stage ops' inputs are the pipeline's stored intermediates on them,
`oracle.gdn_chunked.make_stage_inputs`): q, k, v from the case's distribution (`outlier_rows`,
`tiny`, ...); with `l2norm` q and k as drawn (the op normalises them), without it unit rows (a
caller that normalised upstream: unnormalised keys with beta ‖k‖² > 2 make the recurrence
expand). The log-decay g by param `decay`: `mixed` (−|g| log-uniform on [1e-4, 20]: gates from
2e-9 to 0.9999), `near_one` ([1e-4, 1e-3]: the state remembers ~10^4 tokens) or `near_zero`
([5, 20]: it forgets every token); beta by param `beta`: `uniform` on [0, 1], `near_zero`
([0, 1e-3]) or `near_one` ([1 − 1e-3, 1]); h0 by `initial_state`: zero, N(0, 1) or N(0, 1000²).
The same params and draws as `cases/gdn.py`'s recurrence cases.
"""

from __future__ import annotations

from itertools import product

import numpy as np

from cases.distributions import values as distribution_values
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES

# (label, heads_k, heads_v, dim_k, dim_v)
QWEN = ("preset:qwen3-next", 16, 32, 128, 128)
SEED = ("preset:seed", 2, 4, 128, 128)
TINY = ("edge", 2, 4, 16, 8)
GATE_TOKENS = (1, 63, 64, 65, 130)
PRESET_TOKENS = (1, 63, 64, 65, 512, 4096, 16384)
STAGES = ("gdn_chunk_cumsum", "gdn_kkt", "gdn_solve_tril", "gdn_wy", "gdn_chunk_h",
          "gdn_chunk_o", "gdn_chunked")
# (label suffix, params): each distribution away from the defaults
DISTS = (("decay-near-one", {"decay": "near_one"}), ("decay-near-zero", {"decay": "near_zero"}),
         ("beta-near-zero", {"beta": "near_zero"}), ("beta-near-one", {"beta": "near_one"}),
         ("unit-keys", {"l2norm": False}), ("state-given", {"initial_state": "given"}),
         ("state-large", {"initial_state": "large"}))
LOG_DECAY = {"mixed": (1e-4, 20.0), "near_one": (1e-4, 1e-3), "near_zero": (5.0, 20.0)}
STATE_SCALE = {"zero": 0.0, "given": 1.0, "large": 1000.0}


# --- raw inputs ----------------------------------------------------------------------------------

def _unit_rows(x: np.ndarray) -> np.ndarray:
    norm = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
    return np.where(norm > 0, x / np.where(norm > 0, norm, 1.0), x)


def draw_raw(case, rng) -> dict:
    """q, k, v, g, beta, h0 (float64) for `case` (module docstring), in that order from `rng`."""
    d, p = case.dims, case.params
    b, t, hk, hv, dk, dv = (d[n] for n in ("batch", "tokens", "heads_k", "heads_v", "dim_k",
                                           "dim_v"))
    out = {}
    for name, shape in (("q", (b, t, hk, dk)), ("k", (b, t, hk, dk))):
        x = distribution_values(case.dist, shape, case.dtype, rng)
        out[name] = x if p["l2norm"] else _unit_rows(x)
    out["v"] = distribution_values(case.dist, (b, t, hv, dv), case.dtype, rng)
    lo, hi = LOG_DECAY[p["decay"]]
    out["g"] = -np.exp(rng.uniform(np.log(lo), np.log(hi), (b, t, hv)))
    if p["beta"] == "near_zero":
        out["beta"] = rng.uniform(0.0, 1e-3, (b, t, hv))
    elif p["beta"] == "near_one":
        out["beta"] = 1.0 - rng.uniform(0.0, 1e-3, (b, t, hv))
    else:
        out["beta"] = rng.uniform(0.0, 1.0, (b, t, hv))
    out["h0"] = STATE_SCALE[p["initial_state"]] * rng.standard_normal((b, hv, dv, dk))
    return out


# --- cases ---------------------------------------------------------------------------------------

def dims(heads, batch: int, tokens: int) -> dict:
    _, hk, hv, dk, dv = heads
    return {"batch": batch, "tokens": tokens, "heads_k": hk, "heads_v": hv, "dim_k": dk,
            "dim_v": dv}


def case(op, heads, batch, tokens, dtype, params=None, label="", dist="normal") -> Case:
    return Case.make(op, dims(heads, batch, tokens), dtype, dist, params=params or {},
                     label=label or heads[0])


def gate(op: str) -> list[Case]:
    """The CPU gate of one op (module docstring)."""
    cases = [case(op, TINY, 1, t, dtype) for t, dtype in product(GATE_TOKENS, FLOAT_DTYPES)]
    cases += [case(op, TINY, 1, t, "bf16", {"chunk": c}, label=f"edge-chunk{c}")
              for t, c in product((65, 130), (16, 32))]
    cases += [case(op, TINY, 4, 65, dtype, label="edge-batch4") for dtype in ("f32", "bf16")]
    cases += [case(op, TINY, 1, 65, "bf16", params, label=f"edge-{suffix}")
              for suffix, params in DISTS]
    cases += [case(op, TINY, 1, 65, "bf16", label="edge-outlier_rows", dist="outlier_rows")]
    cases += [case(op, SEED, 1, t, dtype) for t, dtype in product((64, 128), ("f32", "bf16"))]
    return cases


def presets(op: str) -> list[Case]:
    """The model shapes over the issue's T, batch 1 and 4, bf16 (bench and `--preset`)."""
    return [case(op, heads, batch, t, "bf16", label=f"bench:{heads[0].split(':')[1]}")
            for heads, batch, t in product((QWEN, SEED), (1, 4), PRESET_TOKENS)]


for _op in STAGES:
    gate_cases(_op)(lambda op=_op: gate(op))
for _op in ("gdn_chunk_o", "gdn_chunked"):
    bench_cases(_op)(lambda op=_op: presets(op))
