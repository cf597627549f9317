"""RoPE cases: the models' attention shapes and RoPE configs (`cases/configs.py`), decode
batches at positions up to 128k, packed prefill rows with their own positions, both pairings,
partial rotary, both compute contracts (f32 throughout, or HF's T), and the adversarial
distributions on one small model."""

from __future__ import annotations

from itertools import product

import numpy as np

from cases.configs import config
from cases.distributions import DISTRIBUTIONS
from cases.inits import init
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES

# Llama-3.1-8B (llama3 scaling), Llama-3.2-1B (d64, llama3 factor 32), Qwen3-8B (plain theta
# 1e6), Gemma-3-1B (d256, one KV head; its global layers' theta), GPT-OSS-20B (64/8 x 64, YaRN),
# Qwen3-Next-80B-A3B (a quarter of d256 rotated, theta 1e7)
MODELS = ("llama-3.1-8b", "llama-3.2-1b", "qwen3-8b", "gemma-3-1b", "gpt-oss-20b",
          "qwen3-next-80b-a3b")
PREFILL_MODELS = ("llama-3.1-8b", "gpt-oss-20b", "qwen3-next-80b-a3b")
GPTJ_MODELS = ("llama-3.1-8b", "qwen3-next-80b-a3b")
DIST_MODEL = "llama-3.2-1b"
COMPUTES = ("f32", "T")

# one token per sequence at the first position, a short prompt's, 4k, 32k and 128k - 1
DECODE = (0, 17, 4095, 32767, 131071)
# three packed sequences: a prompt's start, a chunk across llama3's original 8192, 128k's end
PREFILL = tuple(range(0, 5)) + tuple(range(8189, 8195)) + tuple(range(131068, 131072))


@init("positions")
def positions(shape, dtype, rng, case, drawn):
    """The case's own positions (param `positions`), one per token."""
    return np.asarray(case.params["positions"], dtype=np.int32)


def model_params(name: str) -> dict:
    """The rope params of model `name` (its config's theta, scaling and partial rotary)."""
    c = config(name)
    params = {"theta": float(c.rope_theta or 10000.0), "scaling": c.rope_type}
    if c.partial_rotary != 1.0:
        params["rotary_dim"] = int(c.head_dim * c.partial_rotary)
    s = c.rope_scaling
    if c.rope_type != "none":
        params.update(factor=float(s["factor"]),
                      original_max_position=int(s["original_max_position_embeddings"]))
    if c.rope_type == "llama3":
        params.update(low_freq_factor=float(s["low_freq_factor"]),
                      high_freq_factor=float(s["high_freq_factor"]))
    if c.rope_type == "yarn":
        params.update(beta_fast=float(s["beta_fast"]), beta_slow=float(s["beta_slow"]),
                      truncate=int(s["truncate"]))
    return params


def model_dims(name: str) -> dict:
    c = config(name)
    return {"heads_q": c.heads, "heads_kv": c.kv_heads, "head_dim": c.head_dim}


def _case(model: str, dtype: str, compute: str, pos: tuple, dist: str = "normal",
          label: str = "", **params) -> Case:
    return Case.make("rope", model_dims(model), dtype, dist,
                     params={**model_params(model), "compute": compute, "positions": pos,
                             **params},
                     label=label or f"preset:{model}")


@gate_cases("rope")
def rope_cases() -> list[Case]:
    grid = list(product(FLOAT_DTYPES, COMPUTES))
    decode = [_case(m, dt, cp, DECODE) for m, (dt, cp) in product(MODELS, grid)]
    prefill = [_case(m, dt, cp, PREFILL) for m, (dt, cp) in product(PREFILL_MODELS, grid)]
    gptj = [_case(m, dt, cp, DECODE, pairing="gptj") for m, (dt, cp) in product(GPTJ_MODELS,
                                                                                  grid)]
    dists = [_case(DIST_MODEL, dt, cp, DECODE, dist)
             for dist, (dt, cp) in product(DISTRIBUTIONS[1:], grid)]
    # the smallest heads: one pair; three pairs with a 2-element tail (odd pair count)
    edges = [Case.make("rope", {"heads_q": 1, "heads_kv": 1, "head_dim": d}, dt, "normal",
                       params={"compute": cp, "rotary_dim": r}, label="edge")
             for (d, r), (dt, cp) in product(((2, 0), (8, 6)), grid)]
    return decode + prefill + gptj + dists + edges


# decode steps of one and of 32 sequences (positions spread over 128k), labelled by batch (not
# "decode": that substring is the CPU bench's default preset, the norms' small rows)
BENCH_POSITIONS = {"b1": (4095,), "b32": tuple(range(0, 131072, 4096))}


@bench_cases("rope")
def rope_bench() -> list[Case]:
    return [_case(m, "bf16", cp, pos, label=f"bench:{m}-{kind}")
            for m, (kind, pos), cp in product(MODELS, BENCH_POSITIONS.items(), COMPUTES)]
