"""Where the decode loop's values live, and how they cross: NumPy arrays in storage dtypes as
the reference plan's "device" (`NUMPY`), the backend an array belongs to (`home`), and torch <->
CuPy zero copy (`dlpack`, `cupy_on`: `models/decode.py`'s docstring).
"""

from __future__ import annotations

import numpy as np

from gpu_impls.backend import Backend
from oracle.dtypes import storage_dtype


class NumpyBackend(Backend):
    """Host arrays as they are: the reference plan's oracles read and return them."""

    name = "numpy"
    writes_in_place = False

    def available(self):
        return True, "NumPy float64 oracles"

    def device(self) -> str:
        return "cpu"

    def to_device(self, array: np.ndarray):
        return np.ascontiguousarray(array)

    def to_host(self, array, dtype: str) -> np.ndarray:
        return np.asarray(array).astype(storage_dtype(dtype), copy=False)


NUMPY = NumpyBackend()


def backend_named(name: str) -> Backend:
    import gpu_impls

    return NUMPY if name == "numpy" else gpu_impls.backend(name)


def home(array) -> str:
    """The backend a device array belongs to, from its type."""
    module = type(array).__module__
    for prefix, name in (("torch", "torch"), ("mlx", "mlx"), ("cupy", "cuda")):
        if module.startswith(prefix):
            return name
    return "numpy"


class cupy_on:
    """CuPy's current stream set to torch stream `stream` (where CuPy is installed), so that
    kparity's kernels launch on the stream torch captures."""

    def __init__(self, stream):
        self.stream, self.ctx = stream, None

    def __enter__(self):
        try:
            import cupy
        except ImportError:
            return self
        self.ctx = cupy.cuda.ExternalStream(self.stream.cuda_stream)
        self.ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


def dlpack(value, src: str, dst: str, dtype: str):
    """A torch tensor as a CuPy array or back, zero copy (CuPy holds f16/bf16 as uint16 bits,
    and exchanges 16-bit floats through DLPack as int16). Both libraries launch on the legacy
    default stream unless told otherwise (kparity's CUDA impls use CuPy's current stream,
    torch's impls torch's): the kernels on either side run in order."""
    import cupy
    import torch

    half = {"bf16": torch.bfloat16, "f16": torch.float16}.get(dtype)
    if src == "torch":
        t = value.contiguous()
        if half is not None:
            return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
        return cupy.from_dlpack(t)
    if half is not None:
        return torch.from_dlpack(value.view(cupy.int16)).view(half)
    return torch.from_dlpack(value)
