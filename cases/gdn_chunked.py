"""Gated DeltaNet chunked-pipeline cases (`oracle/gdn_chunked.py`): every stage op and the
composition `gdn_chunked`.

Shapes: Qwen3-Next / Qwen3.5's linear-attention layers (Hk 16, Hv 32, K = V = 128), the seed
kernels' test shapes (Hk 2, Hv 4, K = V = 128), and tiny heads (Hk 2, Hv 4, K 16, V 8) where the
CPU sweep runs. The gate (the default sweep, CPU in CI) stays on tiny heads and T <= 130:
`gdn_chunked` over T in {1, 63, 64, 65, 130} (one token, a chunk of 64 and its neighbours, two
chunks and a tail), each stage over T in {1, 65, 130}, all three dtypes; chunks of 16 and 32 at
T = 130, a batch of 4, and every distribution below at T = 65 (bf16). `gdn_chunk_o` adds one
seed-shaped case (T = 128, bf16: the CUDA port's contract, K = 128 and T % 64 == 0). The model
presets (labels `bench:qwen3-next-b{B}-t{T}`, `bench:seed-b{B}-t{T}`: batch 1 and 4, T in {1,
63, 64, 65, 512, 4096, 16384}, bf16) are bench cases of every stage and of `gdn_chunked`
(`kparity bench --preset qwen3-next`); their float64 oracles take seconds to minutes (the bench's check skips the large
ones by size). `scripts/gdn_chunked_budget.py` checks the bound on T up to 16384.

Raw inputs (`oracle.gdn_chunked.RAW_INPUTS`, drawn by these inits; the stage ops' inputs are
the pipeline's stored intermediates on them, `oracle.gdn_chunked.make_stage_inputs`): q, k, v
from the case's distribution (`outlier_rows`, `tiny`, ...); with `l2norm` q and k as drawn (the op normalises them), without it unit rows (a
caller that normalised upstream: unnormalised keys with beta ‖k‖² > 2 make the recurrence
expand). The log-decay g by param `decay`: `mixed` (−|g| log-uniform on [1e-4, 20]: gates from
2e-9 to 0.9999), `near_one` ([1e-4, 1e-3]: the state remembers ~10^4 tokens) or `near_zero`
([5, 20]: it forgets every token); beta by param `beta`: `uniform` on [0, 1], `near_zero`
([0, 1e-3]) or `near_one` ([1 − 1e-3, 1]); h0 by `initial_state`: zero, N(0, 1) or N(0, 1000²).
`cases/gdn.py`'s params and inits, as its recurrence cases draw them.
"""

from __future__ import annotations

from itertools import product

import cases.gdn  # noqa: F401  the inits the raw inputs use
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


# --- raw inputs ----------------------------------------------------------------------------------

# --- cases ---------------------------------------------------------------------------------------

def dims(heads, batch: int, tokens: int) -> dict:
    _, hk, hv, dk, dv = heads
    return {"batch": batch, "tokens": tokens, "heads_k": hk, "heads_v": hv, "dim_k": dk,
            "dim_v": dv}


def case(op, heads, batch, tokens, dtype, params=None, label="", dist="normal") -> Case:
    return Case.make(op, dims(heads, batch, tokens), dtype, dist, params=params or {},
                     label=label or heads[0])


def gate(op: str) -> list[Case]:
    """The CPU gate of one op (module docstring): the composition's in full, each stage's on
    fewer token counts; the seed shapes only where a kernel's contract needs them (K = 128)."""
    tokens = GATE_TOKENS if op == "gdn_chunked" else (1, 65, 130)
    cases = [case(op, TINY, 1, t, dtype) for t, dtype in product(tokens, FLOAT_DTYPES)]
    cases += [case(op, TINY, 1, 130, "bf16", {"chunk": c}, label=f"edge-chunk{c}")
              for c in (16, 32)]
    cases += [case(op, TINY, 4, 33, "bf16", label="edge-batch4")]
    cases += [case(op, TINY, 1, 65, "bf16", params, label=f"edge-{suffix}")
              for suffix, params in DISTS]
    cases += [case(op, TINY, 1, 65, "bf16", label="edge-outlier_rows", dist="outlier_rows")]
    if op == "gdn_chunk_o":  # the CUDA port's contract: K = 128, T % 64 == 0
        cases += [case(op, SEED, 1, 128, "bf16")]
    if op == "gdn_chunked":  # the CUDA composition's contract (K = 128): two chunks, and a tail
        cases += [case(op, SEED, 1, 128, "f16"), case(op, SEED, 1, 65, "bf16")]
    return cases


def presets(op: str) -> list[Case]:
    """The model shapes over the issue's T, batch 1 and 4, bf16 (bench and `--preset`)."""
    return [case(op, heads, batch, t, "bf16",
                 label=f"bench:{heads[0].split(':')[1]}-b{batch}-t{t}")
            for heads, batch, t in product((QWEN, SEED), (1, 4), PRESET_TOKENS)]


for _op in STAGES:
    gate_cases(_op)(lambda op=_op: gate(op))
for _op in STAGES:  # every stage: the composition's time split by stage
    bench_cases(_op)(lambda op=_op: presets(op))
