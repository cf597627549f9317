"""Quantized GEMV cases: every bit width and group size at small shapes (correctness), and the
issue's model shapes at int4 g64 (timing). `docs/model_shapes.md` for the model shapes.

Gate shapes are small (out 8 and 24, in 512 and 1536): correctness depends on the layout (bits,
group size, where groups and words fall), not on the matrix size. Distributions apply to x:
normal, outlier (one x element 1000x), zero (x all zero: out must be exactly 0), constant;
`quantized` draws W (outlier columns) and quantizes it as MLX does, for the level-2 report.

Expert-indexed: a stack of E = 4 experts at the gate shapes, the first, a middle and the last
expert selected (an impl reading the wrong slab, or slab 0 always, fails); bench at the MoE slabs
of Qwen3-30B-A3B (E = 128, gate/up 768 x 2048 and down 2048 x 768, `docs/model_shapes.md`).
"""

from __future__ import annotations

from itertools import product

from cases.configs import config
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES
from oracle.quant import BITS, GROUP_SIZES

GATE_SHAPES = ((8, 512), (24, 1536))
GATE_DISTS = ("normal", "outlier_rows", "zero_rows", "constant_rows", "quantized")
# (preset, out, in): Llama-3-8B MLP up/down, Qwen2.5-32B MLP up, a 4096 square, Qwen3-0.6B's
# lm_head (`cases/configs.py`).
_LLAMA, _QWEN32, _QWEN06 = config("llama-3.1-8b"), config("qwen2.5-32b"), config("qwen3-0.6b")
BENCH_SHAPES = (("llama3-8b-up", _LLAMA.intermediate, _LLAMA.hidden),
                ("llama3-8b-down", _LLAMA.hidden, _LLAMA.intermediate),
                ("qwen2.5-32b-up", _QWEN32.intermediate, _QWEN32.hidden),
                ("square-4096", 4096, 4096),
                ("qwen3-0.6b-lm_head", _QWEN06.vocab, _QWEN06.hidden))


@gate_cases("dequant_gemv")
def dequant_gemv_cases():
    cases = []
    for (out, n), bits, group, dtype in product(GATE_SHAPES, BITS, GROUP_SIZES, FLOAT_DTYPES):
        dists = GATE_DISTS if bits == 4 else ("normal", "quantized")
        for dist in dists:
            cases.append(Case.make("dequant_gemv", {"out": out, "in": n, "bits": bits,
                                                    "group_size": group}, dtype, dist,
                                   label=f"preset:int{bits}-g{group}"))
    return cases + lm_head_cases()


# An lm_head (out = vocab) for the logit gate: Llama-2's 32000-token vocabulary over a 1024
# hidden size (Qwen3-0.6B's; its 151936 vocabulary is the bench case: 10 GB of float64 oracle
# intermediates is no gate). Normal logits, a planted near-tie, a planted clear margin. The
# plants (`oracle.gemv.plant_logits`) need no vocabulary's size: the same three at 4096 x 512
# carry them into the commit tier (a second of float64 oracle each, where the 32k ones take
# five: those are nightly's).
LM_HEAD_GATE = (32000, 1024)
LM_HEAD_SMALL = (4096, 512)
LM_HEAD_DISTS = ("normal", "near_tie", "clear_margin")


def lm_head_cases():
    return [Case.make("dequant_gemv", {"out": out, "in": n, "bits": 4, "group_size": 64}, dtype,
                      dist, label=label)
            for (out, n), label in ((LM_HEAD_SMALL, "logits:4k"),
                                    (LM_HEAD_GATE, "preset:lm_head-32k"))
            for dtype, dist in product(FLOAT_DTYPES, LM_HEAD_DISTS)]


@bench_cases("dequant_gemv")
def dequant_gemv_bench():
    return [Case.make("dequant_gemv", {"out": out, "in": n, "bits": 4, "group_size": 64}, dtype,
                      label=f"bench:{name}")
            for (name, out, n), dtype in product(BENCH_SHAPES, FLOAT_DTYPES)]


GATE_EXPERTS = 4


@gate_cases("dequant_gemv_expert_indexed")
def dequant_gemv_expert_indexed_cases():
    cases = []
    for (out, n), bits, group, dtype in product(GATE_SHAPES, BITS, GROUP_SIZES, FLOAT_DTYPES):
        experts = (0, 2, GATE_EXPERTS - 1) if bits == 4 else (GATE_EXPERTS - 1,)
        dims = {"experts": GATE_EXPERTS, "out": out, "in": n, "bits": bits, "group_size": group}
        cases += [Case.make("dequant_gemv_expert_indexed", dims, dtype, "normal",
                            params={"expert": e}, label=f"preset:int{bits}-g{group}")
                  for e in experts]
    return cases


@bench_cases("dequant_gemv_expert_indexed")
def dequant_gemv_expert_indexed_bench():
    shapes = (("qwen3-30b-a3b-up", 768, 2048), ("qwen3-30b-a3b-down", 2048, 768))
    return [Case.make("dequant_gemv_expert_indexed",
                      {"experts": 128, "out": out, "in": n, "bits": 4, "group_size": 64},
                      dtype, params={"expert": 77}, label=f"bench:{name}")
            for (name, out, n), dtype in product(shapes, FLOAT_DTYPES)]
