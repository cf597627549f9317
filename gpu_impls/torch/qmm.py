"""torch baseline for the quantized matmul over M rows (`qmm`): the codes unpacked and
dequantized in f32 once (`gpu_impls/torch/gemv.py`), `F.linear` over the M rows in f32, one
rounding to T. What a user without a quantized kernel would run.

Not batch invariant, measured: on CPU (torch 2.13) row i of an M-row F.linear differs in its last
bits from the 1-row F.linear on 77 of 144 probed (shape, M, dtype, bits) cases, every row at f32:
one row goes through a GEMV, several through a blocked GEMM that sums K in another order. On GPU
cuBLAS picks its kernel (and split-K) by M as well, so nothing is declared."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract
from gpu_impls.impl import Impl
from gpu_impls.quant_layout import LAYOUT
# F.linear takes x [in] or [m, in]: dequant_gemv's torch computation is already the M-row one.
from gpu_impls.torch.gemv import dequant_linear_run, prepare_w_hat

register(Impl("qmm", "torch", "qmm_dequant_linear", dequant_linear_run,
              Contract(invariants=LAYOUT),
              doc="unpack + dequantize in f32, then F.linear over the M rows in f32, rounded "
                  "to T",
              prepare=prepare_w_hat))
