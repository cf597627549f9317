"""Quantized matmul over M rows on CUDA: kparity's own `kp_qmm` (`kernels/kp_qmm.cu`).

    out[m, r] = sum_d (q[r,d] * s[r, d // G] + b[r, d // G]) * x[m, d]     f32 inside, one rounding

`cuda:kp_qmm`: 256-thread blocks of 32 rows x 8 lanes splitting K; x staged per K step in shared
memory for all M rows, each 16-byte weight chunk loaded once and dequantized once for all of
them. Batch invariant by construction (the argument is in the kernel's header): declared, and
checked on the GPU by tests/test_gpu_invariance.py.

Contract (checked before any launch; every rule has a violating case):
* the MLX layout (`quant_layout.LAYOUT`);
* bits in (4, 8): codes are read as bytes (int8) or low/high nibbles (int4) only;
* any `in` the layout admits: K is walked in steps of 8 chunks (256 int4 codes, 128 int8), the
  last one partial where in is not a multiple (SmolLM2's hidden 576); the kernel's alignment
  rules (16-byte rows of W and x, a chunk inside one group) follow from the layout: group_size
  in (32, 64, 128) is a multiple of 128 / bits, and in % group_size == 0; the buffers' own
  16-byte alignment is checked at launch;
* 1 <= m <= 32: at most 32 accumulators per thread (MT, M rounded up to a power of two).
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, Invariant, Launch
from gpu_impls.cuda._module import cuda_impl, kernel
from gpu_impls.quant_layout import LAYOUT
from oracle.numerics import Numerics, plan

SOURCE = "kp_qmm.cu"
BLOCK = 256          # threads per block (KPM_BLOCK)
ROWS = 32            # rows per block: BLOCK / 8 lanes per row (KPM_ROWS)
LANES_PER_ROW = 8    # KPM_TPR: the lanes of a row split K
BITS = (4, 8)
MAX_M = 32
MT_CHOICES = (1, 2, 4, 8, 16, 32)  # accumulators per thread: M rounded up to a power of two
VEC_BYTES = 16

KERNELS = [(SOURCE, "kp_qmm", [(b, mt) for b in BITS for mt in MT_CHOICES])]


def step_codes(bits: int) -> int:
    """Codes of K per step: 8 lanes x one 16-byte chunk of 128 / bits codes."""
    return LANES_PER_ROW * 128 // bits


def sum_order(bits: int, n: int) -> Numerics:
    """kp_qmm.cu: each code dequantized once, w = fma(q, s, b); lane l of a row's 8 takes chunks
    c = step * 8 + l (128 / bits codes each) and runs one FMA chain acc = fma(w, x, acc) from 0
    over (step, code); the 8 lanes meet by xor butterfly (offsets 4, 2, 1). Where n is not a
    whole number of steps, the last step's chunks past the row are absent (the plan's terms
    past n): those lanes' chains end a chunk earlier. No geometry enters: MT only sets how many
    rows of x a thread carries. Every f32 operation is an explicit fmaf or a butterfly add: one
    answer (`oracle/emulated.py`), which the kernel computes bit for bit on an H100 (f32, f16,
    bf16; int4 and int8; whole and partial last steps at in = 576 and 704:
    tests/test_gpu_one_answer.py, 2026-12-07)."""
    codes = 128 // bits
    return Numerics(form="dequantized_fma", sums=(("dot", plan(
        {"step": -(-n // step_codes(bits)), "lane": LANES_PER_ROW, "code": codes},
        ("step code", "fma"), ("lane", "butterfly"))),), one_answer=True)


def _declared(case) -> Numerics:
    return sum_order(case.dims["bits"], case.dims["in"])


def _geometry(dims, params):
    mt = 1 << max(dims["m"] - 1, 0).bit_length()
    return {"mt": mt}, Launch(grid=(-(-dims["out"] // ROWS), 1, 1), block=(BLOCK, 1, 1),
                              extra={"mt": mt})


CONTRACT = Contract(
    invariants=(
        *LAYOUT,
        Invariant("bits in (4, 8)", lambda ns: ns["bits"] in BITS,
                  "codes are read as bytes (int8) or low/high nibbles (int4) only",
                  lambda ns: "bits = 4 or 8, or use torch:qmm_dequant_linear", {"bits": 2},
                  ("bits",)),
        Invariant("1 <= m <= 32", lambda ns: 1 <= ns["m"] <= MAX_M,
                  "a thread carries one f32 accumulator per x row, at most 32 (kp_qmm<MT>)",
                  lambda ns: "m <= 32: split the rows into launches of 32", {"m": 33},
                  ("m",)),
    ),
    geometry=_geometry)


def _aligned(inputs) -> None:
    for key in ("w", "x"):
        if inputs[key].data.ptr % VEC_BYTES:
            raise ValueError(f"{key} is not {VEC_BYTES}-byte aligned: kp_qmm reads 16-byte "
                             "vectors")


def _kp_qmm(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        d = case.dims
        _aligned(inputs)
        k = kernel(SOURCE, "kp_qmm", case.dtype, defines, (d["bits"], launch.extra["mt"]))
        k(launch.grid, launch.block,
          (inputs["w"], inputs["scales"], inputs["biases"], inputs["x"], outputs["out"],
           np.int32(d["m"]), np.int32(d["out"]), np.int32(d["in"]), np.int32(d["group_size"])))
    return run


register(cuda_impl("kp_qmm", "qmm", CONTRACT, _kp_qmm,
                   "kparity qmm: 32 rows x 8 K-lanes per block, x staged in shared memory for "
                   "all M rows, each weight chunk read and dequantized once; int4/int8, M <= 32; "
                   "batch invariant",
                   batch_invariant=True, numerics=_declared))
