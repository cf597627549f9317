"""Fused RMSNorm + quantized GEMV cases (the seed: metaltile-std `src/ffai/rms_norm_qgemv.rs`,
`docs/seed_kernels.md`; model shapes: `docs/model_shapes.md`).

Gate shapes (out, in) are small: correctness depends on the layout and the kernels' tiles, not
on the matrix size. (8, 512) and (16, 1024) meet the fast kernels' contract (in % 512 == 0,
out % 8 == 0: one and two 512-code warp steps, one and two 8-row blocks); (12, 768) breaks both
rules and (8, 640) only the `in` one, so they run on the scalar kernel and the baselines alone.
Every shape at bits 4 and 8 and group sizes 32, 64, 128, all dtypes, x normal; at group size 64
(the fast kernels' one) x also takes the adversarial distributions: outlier (one element 1000x:
the norm is dominated by it), zero (x all zero: out must be exactly 0, and a kernel without eps
gives NaN), constant, and f16_overflow (x^2 overflows f16: squares must be f32).

`tiny` runs in f16 only: there it is what makes eps decide inv (mean(x^2) ~ 6e-8 << eps). In f32
and bf16 its normalised values (~5e-35) times the fast kernels' mask-without-shift pre-scale
(1/4096) fall below the smallest f32 normal, where FTZ (every CuPy kernel) flushes them: the
seed's trick assumes no subnormals (MLX `quantized.h`'s `load_vector` / `qdot`: (q·16^j)·(x/16^j)
= q·x exactly only while x/16^j stays normal), a value range that no dims contract can state.

Bench: the seed's bench shape (in = out = 4096, Qwen3-8B class) and Llama-3-8B's MLP up
projection after post_attention_layernorm (out 14336, in 4096), at int4 and int8, g64.
"""

from __future__ import annotations

from itertools import product

from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES
from oracle.quant import GROUP_SIZES

OP = "rms_norm_qgemv"
GATE_SHAPES = ((8, 512), (16, 1024), (12, 768), (8, 640))
GATE_BITS = (4, 8)
FAST_GROUP = 64
ADVERSARIAL = ("outlier_rows", "zero_rows", "constant_rows", "f16_overflow")
BENCH_SHAPES = (("square-4096", 4096, 4096), ("llama3-8b-up", 14336, 4096))


def _dists(group: int, dtype: str) -> tuple[str, ...]:
    if group != FAST_GROUP:
        return ("normal",)
    return ("normal", *ADVERSARIAL, *(("tiny",) if dtype == "f16" else ()))


@gate_cases(OP)
def rms_norm_qgemv_cases():
    return [Case.make(OP, {"out": out, "in": n, "bits": bits, "group_size": group}, dtype, dist,
                      label=f"preset:int{bits}-g{group}")
            for (out, n), bits, group, dtype in product(GATE_SHAPES, GATE_BITS, GROUP_SIZES,
                                                        FLOAT_DTYPES)
            for dist in _dists(group, dtype)]


@bench_cases(OP)
def rms_norm_qgemv_bench():
    return [Case.make(OP, {"out": out, "in": n, "bits": bits, "group_size": FAST_GROUP}, dtype,
                      label=f"bench:{name}-int{bits}")
            for (name, out, n), bits, dtype in product(BENCH_SHAPES, GATE_BITS, FLOAT_DTYPES)]
