"""On the GPU: the kernels that declare one answer (`Numerics.one_answer`, oracle/emulated.py)
compute it bit for bit. `cuda:kp_qgemv` at 1, 2 and 4 warps (in 256 .. 14336), int4 and int8,
each dtype; the gate (tests/test_gpu.py) then holds it to that answer on every case. kp_qmm and
kp_fp4_gemv: their declarations read as one answer equal their CPU transcriptions bit for bit;
these tests measure the kernels against them, before they declare it.

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
    assert kp.numerics_for(case).one_answer
    got = run_impl(kp, cuda_backend(), case, inputs)["out"].astype(np.float64)
    want = _declared_answer(kp, case, inputs, "out")
    differ = np.flatnonzero(got != want)
    assert differ.size == 0, (f"{case.short()}: {differ.size} of {got.size} outputs differ, "
                              f"first row {differ[0]}: {got[differ[0]]!r} vs {want[differ[0]]!r}")


def _declared_answer(impl, case, inputs, output: str):
    """The emulated result of the impl's declaration taken as one answer (whether or not it
    declares one_answer yet), stored as T."""
    import dataclasses

    numerics = dataclasses.replace(impl.numerics_for(case), one_answer=True)
    y = case.spec.kernel(Emulated(model_for(case, numerics)), inputs, case)[output].x
    return round_to(y, case.dtype).astype(np.float64)


@pytest.mark.parametrize("bits, n, m, dtype", [(4, 1024, 1, "f32"), (4, 4096, 3, "bf16"),
                                               (8, 4096, 5, "f32"), (8, 512, 32, "f16"),
                                               (4, 576, 8, "bf16"), (8, 704, 3, "f32")])
def test_kp_qmm_computes_its_declared_order_bit_for_bit(bits, n, m, dtype):
    """kp_qmm's declaration (w = fma(q, s, b), one FMA chain a lane, the butterflies) read as one
    answer equals its transcription on the CPU (tests/emulate_kp.py); here, the kernel itself.
    Equal on an H100 on all six (2026-12-07), kp_qmm declares `one_answer`."""
    kp = impl("cuda:kp_qmm")
    case = Case.make("qmm", {"m": m, "out": 64, "in": n, "bits": bits, "group_size": 64}, dtype)
    inputs = make_inputs(case)
    got = run_impl(kp, cuda_backend(), case, inputs)["out"].astype(np.float64)
    want = _declared_answer(kp, case, inputs, "out")
    assert np.array_equal(got, want), f"{case.short()}: {int((got != want).sum())} differ"


@pytest.mark.parametrize("fmt, n, m", [("nvfp4", 1024, 1), ("nvfp4", 8192, 3),
                                       ("mxfp4", 4096, 1), ("mxfp4", 16384, 4)])
def test_kp_fp4_gemv_computes_its_declared_order_bit_for_bit(fmt, n, m):
    """The same for kp_fp4_gemv's declaration (the form block_split, its chains' orders)."""
    kp = impl("cuda:kp_fp4_gemv")
    case = Case.make("fp4_gemv", {"m": m, "out": 32, "in": n}, "f32", "normal",
                     params={"format": fmt, "scale_rule": "ocp" if fmt == "mxfp4" else "exact"})
    inputs = make_inputs(case)
    got = run_impl(kp, cuda_backend(), case, inputs)["y"].astype(np.float64)
    want = _declared_answer(kp, case, inputs, "y")
    assert np.array_equal(got, want), f"{case.short()}: {int((got != want).sum())} differ"
