"""MoE grouped GEMM (`moe_grouped_gemm`) and expert MLP (`moe_experts`) cases.

Gate (correctness), tiny: E 4-8 experts, K 64-128, N 32-64, M up to 70 sorted rows, so that the
`hot` routing puts 68 rows on one expert (more than one 64-row tile) while others stay empty;
every routing layout (`oracle.moe_gemm.expert_counts`: balanced, hot, sparse, random), both
weight forms (dense, affine4 int4 g64) and both activations (relu2, silu_mul), every dtype; M = 1
and 7 (a decode step's k rows); the adversarial x distributions on the hot layout.

Bench (timing), `docs/model_shapes.md`: the experts' up projections and whole MLPs of
Nemotron-3-Nano (E 128, k 6, hidden 2688, expert FFN 1856, relu2), Qwen3-30B-A3B (E 128, k 8,
hidden 2048, moe_inter 768, silu_mul) and GPT-OSS-20B (E 32, k 4, hidden 2880, inter 2880; its
clipped SwiGLU is not an `act` here, so its up projection only) at T = 1 (T·k rows on k distinct
experts: `balanced`) and T = 2048 (`random` routing).
"""

from __future__ import annotations

from itertools import product

from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES
from oracle.moe_gemm import ROUTINGS

WEIGHTS = ("dense", "affine4")
ACTS = ("relu2", "silu_mul")
ADVERSARIAL = ("outlier_rows", "zero_rows")
GEMM_MAIN = {"rows": 70, "experts": 8, "in": 128, "out": 64}
GEMM_SMALL = {"experts": 4, "in": 64, "out": 32}
EXPERTS_MAIN = {"rows": 70, "experts": 4, "hidden": 64, "inter": 32}


def _gemm(dims, dtype, weights, routing, dist="normal"):
    return Case.make("moe_grouped_gemm", dims, dtype, dist,
                     params={"weights": weights, "routing": routing},
                     label=f"preset:{weights}-{routing}-m{dims['rows']}")


def _experts(dims, dtype, act, routing, dist="normal"):
    return Case.make("moe_experts", dims, dtype, dist, params={"act": act, "routing": routing},
                     label=f"preset:{act}-{routing}-m{dims['rows']}")


@gate_cases("moe_grouped_gemm")
def grouped_gemm_cases():
    main = [_gemm(GEMM_MAIN, dtype, w, r)
            for w, r, dtype in product(WEIGHTS, ROUTINGS, FLOAT_DTYPES)]
    small = [_gemm({**GEMM_SMALL, "rows": m}, dtype, w, r)
             for (m, r), w, dtype in product(((1, "balanced"), (7, "random")), WEIGHTS,
                                             FLOAT_DTYPES)]
    adversarial = [_gemm(GEMM_MAIN, dtype, w, "hot", dist)
                   for w, dist, dtype in product(WEIGHTS, ADVERSARIAL, FLOAT_DTYPES)]
    return main + small + adversarial


@gate_cases("moe_experts")
def experts_cases():
    main = [_experts(EXPERTS_MAIN, dtype, a, r)
            for a, r, dtype in product(ACTS, ROUTINGS, FLOAT_DTYPES)]
    small = [_experts({**EXPERTS_MAIN, "rows": 7}, dtype, a, "random")
             for a, dtype in product(ACTS, FLOAT_DTYPES)]
    adversarial = [_experts(EXPERTS_MAIN, dtype, a, "hot", dist)
                   for a, dist, dtype in product(ACTS, ADVERSARIAL, FLOAT_DTYPES)]
    return main + small + adversarial


# (model, experts, top_k, hidden, inter, act): `docs/model_shapes.md`
MODELS = (("nemotron3-nano", 128, 6, 2688, 1856, "relu2"),
          ("qwen3-30b-a3b", 128, 8, 2048, 768, "silu_mul"),
          ("gpt-oss-20b", 32, 4, 2880, 2880, "silu_mul"))
BENCH_T = ((1, "balanced"), (2048, "random"))


@bench_cases("moe_grouped_gemm")
def grouped_gemm_bench():
    out = []
    for (model, e, k, hidden, inter, act), (t, routing), w, dtype in product(
            MODELS, BENCH_T, WEIGHTS, ("bf16",)):
        up = inter * (2 if act == "silu_mul" else 1)
        out.append(Case.make("moe_grouped_gemm",
                             {"rows": t * k, "experts": e, "in": hidden, "out": up}, dtype,
                             params={"weights": w, "routing": routing},
                             label=f"bench:{model}-up-{w}-t{t}"))
    return out


@bench_cases("moe_experts")
def experts_bench():
    return [Case.make("moe_experts", {"rows": t * k, "experts": e, "hidden": hidden,
                                      "inter": inter}, "bf16",
                      params={"act": act, "routing": routing}, label=f"bench:{model}-t{t}")
            for (model, e, k, hidden, inter, act), (t, routing) in product(MODELS[:2], BENCH_T)]
