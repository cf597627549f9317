"""PyTorch: CUDA when a GPU is visible, else CPU. bf16 crosses as uint16 bits (numpy has no bf16)."""

from __future__ import annotations

import numpy as np

from gpu_impls.backend import Backend
from oracle.dtypes import storage_dtype

_UINT_VIEW = {"bf16": np.uint16}


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

    def to_device(self, array: np.ndarray):
        torch = self._torch()
        if array.dtype == storage_dtype("bf16"):
            t = torch.from_numpy(np.ascontiguousarray(array).view(np.uint16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(np.ascontiguousarray(array))
        return t.to(self.torch_device())

    def to_host(self, tensor, dtype: str) -> np.ndarray:
        torch = self._torch()
        t = tensor.detach().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.uint16).numpy().view(storage_dtype("bf16")).copy()
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
