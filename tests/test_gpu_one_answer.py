"""On the GPU: the kernels that declare one answer (`Numerics.one_answer`, oracle/emulated.py)
compute it bit for bit. `cuda:kp_qgemv` at 1, 2 and 4 warps (in 256 .. 14336), int4 and int8,
each dtype; the gate (tests/test_gpu.py) then holds it to that answer on every case.

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run.
"""

from __future__ import annotations

import numpy as np
import pytest

from cases.model import Case, make_inputs
from oracle.dtypes import round_to
from oracle.emulated import Emulated
from oracle.numerics import model_for
from runners.correctness import run_impl
from tests.gpu_helpers import cuda_backend, impl

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n, dist, dtype", [(256, "normal", "f32"), (4096, "normal", "f32"),
                                            (4096, "outlier_rows", "bf16"),
                                            (14336, "normal", "f32"), (8192, "tiny", "f16")])
def test_kp_qgemv_computes_its_one_answer_bit_for_bit(bits, n, dist, dtype):
    kp = impl("cuda:kp_qgemv")
    case = Case.make("dequant_gemv", {"out": 64, "in": n, "bits": bits, "group_size": 64},
                     dtype, dist)
    inputs = make_inputs(case)
    numerics = kp.numerics_for(case)
    assert numerics.one_answer
    answer = case.spec.kernel(Emulated(model_for(case, numerics)), inputs, case)["out"].x
    got = run_impl(kp, cuda_backend(), case, inputs)["out"].astype(np.float64)
    want = round_to(answer, dtype).astype(np.float64)
    differ = np.flatnonzero(got != want)
    assert differ.size == 0, (f"{case.short()}: {differ.size} of {got.size} outputs differ, "
                              f"first row {differ[0]}: {got[differ[0]]!r} vs {want[differ[0]]!r}")
