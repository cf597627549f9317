"""Test-only CUDA faults for process isolation (issue 6): cuda:kp_rms_norm, except on one bf16
case (picked by its distribution) where a real kernel misbehaves. Plugin only (`kparity --plugin
tests/faults_cuda.py check --impl cuda:fault_cuda_illegal_address --isolate case`); run them
isolated, never in the sweep's own process.

| impl                            | on the bf16 case of dist | launches                            |
|---------------------------------|--------------------------|-------------------------------------|
| cuda:fault_cuda_illegal_address | outlier_rows             | a store through a wild pointer: the |
|                                 |                          | context is lost (sticky error)      |
| cuda:fault_cuda_hang            | tiny                     | a loop whose stride is 0 (the       |
|                                 |                          | 2026-05-19 freeze): never returns   |
"""

from __future__ import annotations

import dataclasses

from gpu_impls import impls, register

FAULTS = r"""
extern "C" __global__ void illegal_address(float* out) {
    float* wild = (float*)(0x10ull + 4096ull * (unsigned long long)threadIdx.x);
    *wild = out[0];
}
extern "C" __global__ void hang(float* out, int n, int stride) {
    for (int i = threadIdx.x; i < n; i += stride) out[0] += 1.0f;  // stride 0: forever
}
"""
FAULTY_DIST = {"fault_cuda_illegal_address": "outlier_rows", "fault_cuda_hang": "tiny"}


def _faulty(name: str, base):
    def run(launch, inputs, outputs, case):
        if case.dtype == "bf16" and case.dist == FAULTY_DIST[name]:
            import cupy
            import numpy as np

            module = cupy.RawModule(code=FAULTS)
            scratch = cupy.zeros(1, dtype=cupy.float32)
            if name == "fault_cuda_hang":
                module.get_function("hang")((1,), (32,), (scratch, np.int32(1 << 20),
                                                          np.int32(0)))
            else:
                module.get_function("illegal_address")((1,), (32,), (scratch,))
            cupy.cuda.runtime.deviceSynchronize()
        return base.run(launch, inputs, outputs, case)
    return dataclasses.replace(base, name=name, run=run,
                               doc=f"test-only fault: {name} on bf16 {FAULTY_DIST[name]}")


_base = impls().get("cuda:kp_rms_norm")
if _base is not None:
    register(*(_faulty(n, _base) for n in FAULTY_DIST if f"cuda:{n}" not in impls()))
