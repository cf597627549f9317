"""CUDA through CuPy: raw kernels from `.cu` sources, compiled with NVRTC at first use.

f16 and bf16 cross as uint16 bits (CuPy has no bf16 dtype); kernels convert with PTX `cvt`.
"""

from __future__ import annotations

import numpy as np

from gpu_impls.backend import Backend
from gpu_impls.cuda._device import device_properties
from oracle.dtypes import storage_dtype

_BITS = {"f16": np.uint16, "bf16": np.uint16, "f32": np.float32, "u32": np.uint32,
         "i32": np.int32}


class CupyBackend(Backend):
    name = "cuda"
    # CuPy appends `-ftz=true` to every NVRTC/nvcc compile and offers no way to undo it
    # (cupy/cupy#9576, open; seen here: f32 subnormal inputs read as 0 on an H200).
    flushes_subnormals = True

    def available(self):
        try:
            import cupy
        except ImportError as e:
            return False, f"cupy not installed ({e}); pip install 'kparity[cuda]'"
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # no driver, no device
            return False, f"no CUDA device ({type(e).__name__}: {e})"
        if n == 0:
            return False, "no CUDA device"
        return True, f"cupy {cupy.__version__} on {self.device()}"

    def device(self) -> str:
        return f"cuda:0 {device_properties()['name'].decode()}"

    def versions(self):
        import cupy

        # NVRTC compiles every kernel here: its version is the compiler of record.
        return {"cupy": cupy.__version__,
                "cuda_driver": str(cupy.cuda.runtime.driverGetVersion()),
                "cuda_runtime": str(cupy.cuda.runtime.runtimeGetVersion()),
                "nvrtc": ".".join(map(str, cupy.cuda.nvrtc.getVersion()))}

    def to_device(self, array: np.ndarray):
        import cupy

        array = np.ascontiguousarray(array)
        if array.dtype in (storage_dtype("bf16"), storage_dtype("f16")):
            array = array.view(np.uint16)
        return cupy.asarray(array)

    def to_host(self, array, dtype: str) -> np.ndarray:
        return array.get().view(storage_dtype(dtype))

    def same_memory(self, a, b) -> bool:
        return a is b or (hasattr(a, "data") and a.data.ptr == b.data.ptr)

    def synchronize(self):
        import cupy

        cupy.cuda.runtime.deviceSynchronize()

    def timer(self):
        global _TIMER
        if _TIMER is None:
            from gpu_impls.cuda._timer import CupyTimer

            _TIMER = CupyTimer()
        return _TIMER


_TIMER = None


BACKEND = CupyBackend()
