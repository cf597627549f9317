"""Test-only CUDA faults (issue 6): cuda:kp_rms_norm, except on its targeted rms_norm cases, where
a real kernel misbehaves. Plugin only (`kparity --plugin tests/faults_cuda.py check --op rms_norm
--repeat 3`); the hang and the illegal address need `--isolate case` (the default on a GPU).

Targets are qwen3-0.6b cases (7 rows x 1024) unless the table says otherwise, so each fault
fires on one case (or one dtype) and the rest of its sweep passes.

| impl                       | fires on             | launches                    | status       |
|----------------------------|----------------------|-----------------------------|--------------|
| fault_cuda_hang            | bf16 tiny            | a loop whose stride is 0    | timeout      |
|                            | bf16 tiny qwen3-8b   | (the ledger: never-launch)  | quarantined  |
| fault_cuda_illegal_address | bf16 outlier_rows    | a store through a wild      | crash        |
|                            |                      | pointer: the context is lost|              |
| fault_cuda_oob_write       | bf16 constant_rows   | a store one element past    | fail,        |
|                            |                      | the output's end            | oob_write    |
| fault_cuda_unwritten_last  | bf16 zero_rows       | a copy whose grid misses    | fail,        |
|                            |                      | the last element            | unwritten    |
| fault_cuda_race            | f32 normal           | sum of squares by unordered | fail under   |
|                            |                      | atomicAdd (timer-jittered): | --repeat:    |
|                            |                      | bits differ between runs    | nondetermin. |
| fault_cuda_nan_f16         | every f16 case       | the output overwritten with | fail (NaN    |
|                            |                      | NaN                         | mismatch)    |
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gpu_impls import impls, known_issues, register

FAULTS = Path(__file__).with_suffix(".cu")  # compiled by NVRTC here, by nvcc in CPU CI
TARGET = "preset:qwen3-0.6b"
FIRES = {  # impl name -> (dtype, dist), on TARGET
    "fault_cuda_hang": ("bf16", "tiny"),
    "fault_cuda_illegal_address": ("bf16", "outlier_rows"),
    "fault_cuda_oob_write": ("bf16", "constant_rows"),
    "fault_cuda_unwritten_last": ("bf16", "zero_rows"),
    "fault_cuda_race": ("f32", "normal"),
}
QUARANTINED_HANG = "preset:qwen3-8b"  # the hang fires here too; the ledger keeps it unlaunched
F16_NAN = 0x7E00
_module = None


def _kernels():
    global _module
    import cupy

    if _module is None:
        _module = cupy.RawModule(code=FAULTS.read_text())
    return _module


def fires(name: str, case) -> bool:
    if name == "fault_cuda_nan_f16":
        return case.dtype == "f16"
    dtype, dist = FIRES[name]
    labels = (TARGET, QUARANTINED_HANG) if name == "fault_cuda_hang" else (TARGET,)
    return (case.dtype == dtype and case.dist == dist and case.label in labels
            and case.params.get("rounding") == "once")


def _faulty(name: str, base):
    def run(launch, inputs, outputs, case):
        if not fires(name, case):
            return base.run(launch, inputs, outputs, case)
        import cupy
        import numpy as np

        k, out = _kernels(), outputs["out"]
        n = out.size
        if name == "fault_cuda_hang":
            scratch = cupy.zeros(1, dtype=cupy.float32)
            k.get_function("hang")((1,), (32,), (scratch, np.int32(1 << 20), np.int32(0)))
        elif name == "fault_cuda_illegal_address":
            k.get_function("illegal_address")((1,), (32,), (out,))
        elif name == "fault_cuda_oob_write":
            base.run(launch, inputs, outputs, case)
            k.get_function("store_past_end")((1,), (1,), (out, np.int64(n)))
        elif name == "fault_cuda_unwritten_last":
            tmp = cupy.empty_like(out)
            base.run(launch, inputs, {"out": tmp}, case)
            out.ravel()[:-1] = tmp.ravel()[:-1]
        elif name == "fault_cuda_nan_f16":
            base.run(launch, inputs, outputs, case)
            k.get_function("fill_bits")(((n + 255) // 256,), (256,),
                                        (out, np.int64(n), np.uint16(F16_NAN)))
        elif name == "fault_cuda_race":
            rows, cols = case.dims["rows"], case.dims["n"]
            ss = cupy.zeros(rows, dtype=cupy.float32)
            grid = ((cols + 255) // 256, rows)
            k.get_function("racy_sum_squares")(grid, (256,), (inputs["x"], ss, np.int32(cols)))
            k.get_function("scale_rows")(grid, (256,), (inputs["x"], inputs["w"], ss, out,
                                                        np.int32(cols),
                                                        np.float32(case.params["eps"])))
        cupy.cuda.runtime.deviceSynchronize()
        return None
    where = "every f16 case" if name == "fault_cuda_nan_f16" else \
        f"{' '.join(FIRES[name])} {TARGET}"
    return dataclasses.replace(base, name=name, run=run,
                               doc=f"test-only fault: {name} on {where}")


_base = impls().get("cuda:kp_rms_norm")
if _base is not None:
    register(*(_faulty(n, _base) for n in (*FIRES, "fault_cuda_nan_f16")
               if f"cuda:{n}" not in impls()))
    known_issues.register(
        {"impl": "cuda:fault_cuda_hang",
         "case": {"op": "rms_norm", "dtype": "bf16", "dist": "tiny", "label": QUARANTINED_HANG},
         "issue": "kparity#6", "class": "never-launch",
         "why": "stride-0 loop, the 2026-05-19 freeze"}, source="tests/faults_cuda.py")
