"""PyTorch: CUDA when a GPU is visible, else CPU.

NumPy has no bf16 or fp8: those arrays (ml_dtypes) cross as their bits, a same-width unsigned
integer tensor viewed as torch's dtype of the same format. e2m1, which torch has only packed
(`float4_e2m1fn_x2`), crosses as uint8 codes, one per byte (`oracle.dtypes.pack_e2m1` packs them).
"""

from __future__ import annotations

import numpy as np

from gpu_impls.backend import Backend
from oracle.dtypes import FLOAT_FORMATS, dtype_name, storage_dtype

# kparity dtype -> torch dtype attribute (absent attributes: that torch lacks the format)
_TORCH_FORMATS = {"bf16": "bfloat16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2",
                  "ue8m0": "float8_e8m0fnu"}


class TorchBackend(Backend):
    name = "torch"

    def available(self):
        try:
            import torch  # noqa: F401
        except ImportError as e:
            return False, f"torch not installed ({e}); pip install 'kparity[torch]'"
        return True, f"torch {torch.__version__} on {self.device()}"

    def _torch(self):
        import torch

        return torch

    def torch_device(self) -> str:
        return "cuda" if self._torch().cuda.is_available() else "cpu"

    def device(self) -> str:
        torch = self._torch()
        if torch.cuda.is_available():
            return f"cuda:0 {torch.cuda.get_device_name(0)}"
        return "cpu"

    def versions(self):
        torch = self._torch()
        return {"torch": torch.__version__, "torch_cuda": str(torch.version.cuda),
                "torch_cudnn": str(torch.backends.cudnn.version())}

    def _format(self, name: str | None):
        """torch's dtype for kparity dtype `name` where it crosses as bits, else None."""
        attr = _TORCH_FORMATS.get(name)
        if attr is None:
            return None
        torch = self._torch()
        if not hasattr(torch, attr):
            raise TypeError(f"torch {torch.__version__} has no {attr} for {name} tensors")
        return getattr(torch, attr)

    def _uint(self, name: str):
        return getattr(self._torch(), f"uint{FLOAT_FORMATS[name].dtype.itemsize * 8}")

    def to_device(self, array: np.ndarray):
        torch = self._torch()
        array = np.ascontiguousarray(array)
        name = dtype_name(array.dtype)
        fmt = self._format(name)
        if fmt is not None:
            t = torch.from_numpy(array.view(FLOAT_FORMATS[name].uint)).view(fmt)
        elif name == "e2m1":
            t = torch.from_numpy(array.view(np.uint8))
        else:
            t = torch.from_numpy(array)
        return t.to(self.torch_device())

    def to_host(self, tensor, dtype: str) -> np.ndarray:
        torch = self._torch()
        t = tensor.detach().contiguous().cpu()
        name = next((n for n in _TORCH_FORMATS if getattr(torch, _TORCH_FORMATS[n], None)
                     == t.dtype), None)
        if name is not None:  # bits back, viewed as the same format in NumPy
            host = t.view(self._uint(name)).numpy().view(storage_dtype(name))
            return host.astype(storage_dtype(dtype), copy=False).copy()
        if dtype == "e2m1" and t.dtype == torch.uint8:  # codes, one per byte
            return t.numpy().view(storage_dtype("e2m1")).copy()
        return t.numpy().astype(storage_dtype(dtype), copy=False).copy()

    def same_memory(self, a, b) -> bool:
        return a is b or (hasattr(a, "data_ptr") and a.data_ptr() == b.data_ptr())

    def synchronize(self):
        torch = self._torch()
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def timer(self):
        global _TIMER
        if not self._torch().cuda.is_available():
            return super().timer()
        if _TIMER is None:
            from gpu_impls.torch._timer import TorchCudaTimer

            _TIMER = TorchCudaTimer()
        return _TIMER


_TIMER = None


BACKEND = TorchBackend()
