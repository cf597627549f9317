"""MoE router and dispatch cases (`oracle/moe_route.py`): tiny gate shapes (E 8-16, k 2-4, T 1-7)
for every scoring and dtype, one group-limited sigmoid case, one model-shaped router per scoring
at T = 7, skewed routing (`hot_expert`) and exact ties in the logits (`exact_ties`); the models'
shapes at T = 1 and 2048 as bench presets only."""

from __future__ import annotations

from itertools import product

from cases.configs import config
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES

# scoring -> (norm_topk_prob, routed_scaling_factor) of its tiny cases
TINY = {"softmax_topk": (1, 1.0), "softmax": (0, 1.0), "sigmoid_bias": (1, 2.5)}
SHAPES = ((1, 8, 2), (7, 16, 4))  # (T, E, k)
# model -> (scoring, norm_topk_prob, routed_scaling_factor), shapes from cases/configs.py
MODELS = {"nemotron-3-nano-30b-a3b": ("sigmoid_bias", 1, 2.5),
          "qwen3-30b-a3b": ("softmax_topk", 1, 1.0),
          "qwen3-next-80b-a3b": ("softmax", 1, 1.0)}


def router(t: int, e: int, k: int, scoring: str, norm: int, scale: float, dtype: str,
           label: str, dist: str = "normal", groups: int = 1, topk_group: int = 1) -> Case:
    return Case.make("moe_router", {"tokens": t, "experts": e, "top_k": k, "groups": groups},
                     dtype, dist, params={"scoring": scoring, "norm_topk_prob": norm,
                                          "routed_scaling_factor": scale,
                                          "topk_group": topk_group}, label=label)


def _model(m: str, t: int, dtype: str, label: str) -> Case:
    scoring, norm, scale = MODELS[m]
    c = config(m)
    return router(t, c.experts, c.top_k, scoring, norm, scale, dtype, label)


@gate_cases("moe_router")
def moe_router_cases() -> list[Case]:
    tiny = [router(t, e, k, s, *TINY[s], dtype, f"preset:tiny-{s}")
            for (t, e, k), s, dtype in product(SHAPES, TINY, FLOAT_DTYPES)]
    dists = [router(7, 16, 4, s, *TINY[s], dtype, f"dist:{dist}-{s}", dist)
             for s, (dist, dtype) in product(TINY, (("hot_expert", "bf16"),
                                                    ("exact_ties", "bf16"),
                                                    ("nonfinite", "f32")))]
    grouped = [router(5, 16, 4, "sigmoid_bias", 1, 2.5, "bf16", "preset:grouped-4of2", "normal",
                      groups=4, topk_group=2)]
    models = [_model(m, 7, "bf16", f"preset:{m}") for m in MODELS]
    return tiny + dists + grouped + models


@bench_cases("moe_router")
def moe_router_bench() -> list[Case]:
    return [_model(m, t, "bf16", f"bench:{m}-t{t}") for m, t in product(MODELS, (1, 2048))]


def _dispatch(t: int, e: int, k: int, label: str, dist: str = "normal") -> Case:
    return Case.make("moe_dispatch", {"tokens": t, "experts": e, "top_k": k}, "f32", dist,
                     label=label)


@gate_cases("moe_dispatch")
def moe_dispatch_cases() -> list[Case]:
    shapes = [_dispatch(t, e, k, "preset:tiny") for t, e, k in SHAPES]
    skew = [_dispatch(7, 16, 4, "dist:hot_expert", "hot_expert")]
    models = [_dispatch(7, config(m).experts, config(m).top_k, f"preset:{m}") for m in MODELS]
    return shapes + skew + models


@bench_cases("moe_dispatch")
def moe_dispatch_bench() -> list[Case]:
    return [_dispatch(t, config(m).experts, config(m).top_k, f"bench:{m}-t{t}")
            for m, t in product(MODELS, (1, 2048))]


def _rows(op: str, t: int, k: int, h: int, dtype: str, label: str, dist: str = "normal") -> Case:
    return Case.make(op, {"tokens": t, "top_k": k, "hidden": h}, dtype, dist, label=label)


def _rows_cases(op: str) -> list[Case]:
    tiny = [_rows(op, t, k, 64, dtype, "preset:tiny")
            for (t, _, k), dtype in product(SHAPES, FLOAT_DTYPES)]
    return tiny + [_rows(op, 7, 4, 64, "bf16", f"dist:{d}", d)
                   for d in ("outlier_rows", "nonfinite")]


def _rows_bench(op: str) -> list[Case]:
    return [_rows(op, t, config(m).top_k, config(m).hidden, "bf16", f"bench:{m}-t{t}")
            for m, t in product(MODELS, (1, 2048))]


@gate_cases("moe_permute")
def moe_permute_cases() -> list[Case]:
    return _rows_cases("moe_permute")


@gate_cases("moe_unpermute")
def moe_unpermute_cases() -> list[Case]:
    return _rows_cases("moe_unpermute")


@gate_cases("moe_scatter_add")
def moe_scatter_add_cases() -> list[Case]:
    return _rows_cases("moe_scatter_add")


@bench_cases("moe_permute")
def moe_permute_bench() -> list[Case]:
    return _rows_bench("moe_permute")


@bench_cases("moe_unpermute")
def moe_unpermute_bench() -> list[Case]:
    return _rows_bench("moe_unpermute")


@bench_cases("moe_scatter_add")
def moe_scatter_add_bench() -> list[Case]:
    return _rows_bench("moe_scatter_add")
