"""RMSNorm family cases: model presets (`docs/model_shapes.md`), tile-window edges, distributions.

Rows are kept small and odd (7) for hidden-size presets: correctness depends on the row length and
the per-row geometry, not on the row count, and an odd count catches multi-row blocking bugs.
"""

from __future__ import annotations

from itertools import product

from cases.configs import config
from cases.distributions import DISTRIBUTIONS
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES

# (preset, hidden, eps, weight_offset): hidden-size norms (input_layernorm, final norm), from the
# model table (`cases/configs.py`).
HIDDEN_MODELS = ("smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b",
                 "llama-3.2-3b", "qwen3-8b", "qwen3-14b", "gemma-4-31b", "llama-3-70b")
HIDDEN = tuple((m.name, m.hidden, m.eps, m.weight_offset)
               for m in (config(name) for name in HIDDEN_MODELS))
HIDDEN_ROWS = 7

# (preset, batch, tokens, heads, head_dim, weight_offset): per-head q_norm / k_norm.
PER_HEAD = (
    ("qwen3-8b-q_norm", 4, 8, 32, 128, 0),   # the seed's per-head test: 1024 rows
    ("qwen3-8b-k_norm", 4, 8, 8, 128, 0),
    ("gpt-oss-20b-q", 1, 8, 64, 64, 0),
    ("head_dim-64-seed", 2, 8, 32, 64, 0),   # seed (64, 512)
    ("gemma-3-1b-q", 2, 16, 4, 256, 1),
    ("head_dim-256-seed", 1, 16, 16, 256, 0),  # seed (256, 256)
)

# (preset, rows, n): GDN output norm, rows = tokens · Hv, n = Dv.
GATED = (
    ("qwen3.5-gdn-dv128", 64, 128),  # 2 tokens × 32 value heads
    ("qwen3.5-gdn-dv256", 16, 256),
    ("mt-bench-512", 16, 512),       # metaltile bench row length
)

# Row lengths within ±2 of each multiple of 32/64/128 at the contracts' limits: 32 and 64
# (smallest TPG = 32 for n/2 and n/4 kernels), 128, 2048 (n/2 kernel: TPG 1024), 4096 (n/4
# kernel: TPG 1024), 4224 (first multiple of 128 past it); 4100 and odd n for the wide kernel.
EDGE_N = sorted({n + d for n in (32, 64, 128, 2048, 4096, 4224) for d in range(-2, 3)}
                | {4100, 961, 5377})
EDGE_HEAD_DIM = sorted({n + d for n in (64, 128, 256) for d in range(-2, 3)})
EDGE_ROWS = 5


def _sweep(op: str, dims_list, params_list, labels) -> list[Case]:
    return [Case.make(op, dims, dtype, dist, params=params, label=f"preset:{label}")
            for (dims, params, label), dtype, dist in
            product(zip(dims_list, params_list, labels), FLOAT_DTYPES, DISTRIBUTIONS)]


def _edges(op: str, dims_list) -> list[Case]:
    return [Case.make(op, dims, dtype, "normal", label="edge")
            for dims, dtype in product(dims_list, FLOAT_DTYPES)]


def _hidden_op(op: str) -> list[Case]:
    cases = _sweep(op, [{"rows": HIDDEN_ROWS, "n": h} for _, h, _, _ in HIDDEN],
                   [{"eps": e, "weight_offset": o} for _, _, e, o in HIDDEN],
                   [name for name, *_ in HIDDEN])
    return cases + _edges(op, [{"rows": EDGE_ROWS, "n": n} for n in EDGE_N])


def _both_roundings(cases: list[Case]) -> list[Case]:
    """Every case in the one-rounding contract, and again with the normed value rounded to T
    before the weight multiply (HF Llama / `mx.fast.rms_norm`; no weight offset in that
    convention); see `oracle.norms.rms_norm`."""
    return cases + [c.replace(rounding="normed") for c in cases
                    if not c.params["weight_offset"]]


# Past the f32 domain (`oracle/norms.py` "Domain"): rows whose squares leave f32's range, at two
# hidden sizes, in the dtypes that can hold |x| ~ 1e20.
DOMAIN_MODELS = ("qwen3-0.6b", "qwen3-8b")


def _domain_cases(op: str) -> list[Case]:
    return [Case.make(op, {"rows": HIDDEN_ROWS, "n": config(m).hidden}, dtype, "f32_overflow",
                      params={"eps": config(m).eps},
                      label=f"preset:f32-overflow-{config(m).hidden}")
            for m, dtype in product(DOMAIN_MODELS, ("f32", "bf16"))]


@gate_cases("rms_norm")
def rms_norm_cases():
    return _both_roundings(_hidden_op("rms_norm") + _domain_cases("rms_norm"))


@gate_cases("rms_norm_residual")
def rms_norm_residual_cases():
    return _hidden_op("rms_norm_residual")


@gate_cases("add_rms_norm")
def add_rms_norm_cases():
    return _hidden_op("add_rms_norm")


@gate_cases("rms_inv")
def rms_inv_cases():
    return _hidden_op("rms_inv")


@gate_cases("rms_norm_per_head")
def per_head_cases():
    dims = [{"batch": b, "tokens": t, "heads": h, "head_dim": d} for _, b, t, h, d, _ in PER_HEAD]
    cases = _sweep("rms_norm_per_head", dims, [{"weight_offset": o} for *_, o in PER_HEAD],
                   [p[0] for p in PER_HEAD])
    edges = _edges("rms_norm_per_head", [{"batch": 1, "tokens": 2, "heads": 4, "head_dim": d}
                                         for d in EDGE_HEAD_DIM])
    return _both_roundings(cases + edges)


@gate_cases("gated_mixer_norm")
def gated_mixer_norm_cases():
    cases = _sweep("gated_mixer_norm", [{"rows": r, "n": n} for _, r, n in GATED],
                   [{}] * len(GATED), [p[0] for p in GATED])
    return cases + _edges("gated_mixer_norm", [{"rows": EDGE_ROWS, "n": n} for n in EDGE_N])


# --- bench shapes: what the kernels see in a model, sized for timing ---------------------------
# Decode (1-64 rows: launch and tail effects decide), prefill, and HBM-sized (>= 4x a 60 MiB L2
# in one call, so bandwidth decides: 65536x4096 and 16384x8192 bf16 are 512 MiB and 256 MiB in).
BENCH_ROWS_N = (("decode", 1, 4096), ("decode", 16, 4096), ("decode", 64, 4096),
                ("decode", 64, 8192), ("prefill", 2048, 4096), ("hbm", 65536, 4096),
                ("hbm", 16384, 8192))
# Per-head q_norm/k_norm: 1024 rows (the seed's shape: 32 tokens x 32 heads) of each head_dim.
BENCH_PER_HEAD = (64, 128, 256)
BENCH_PARAMS = {"eps": 1e-6, "weight_offset": 0}


def _bench_rows(op: str, params: dict) -> list[Case]:
    return [Case.make(op, {"rows": rows, "n": n}, dtype, "normal", params=params,
                      label=f"bench:{kind}-{rows}x{n}")
            for (kind, rows, n), dtype in product(BENCH_ROWS_N, FLOAT_DTYPES)]


@bench_cases("rms_norm")
def rms_norm_bench():
    return _bench_rows("rms_norm", BENCH_PARAMS)


@bench_cases("rms_norm_residual")
def rms_norm_residual_bench():
    return _bench_rows("rms_norm_residual", BENCH_PARAMS)


@bench_cases("add_rms_norm")
def add_rms_norm_bench():
    return _bench_rows("add_rms_norm", BENCH_PARAMS)


@bench_cases("rms_norm_per_head")
def per_head_bench():
    return [Case.make("rms_norm_per_head", {"batch": 1, "tokens": 32, "heads": 32,
                                            "head_dim": d}, dtype, "normal",
                      params={"weight_offset": 0},
                      label=f"bench:per-head-1024x{d}")
            for d, dtype in product(BENCH_PER_HEAD, FLOAT_DTYPES)]
