"""Backends: how arrays reach a device and come back, and whether the device is here.

Each backend package (`gpu_impls/cuda`, `torch`, `mlx`, `metal`) defines one `Backend` in its
`backend.py`. Importing a backend module never imports its framework: `available()` does, so
`kparity ops` can explain on any machine why a backend is missing.
"""

from __future__ import annotations

import numpy as np

from oracle.dtypes import storage_dtype

# NaN bit patterns used to poison outputs before a launch (a quiet NaN in each width).
POISON_BITS = {"f32": np.uint32(0x7FC00000), "f16": np.uint16(0x7E00),
               "bf16": np.uint16(0x7FC0), "u32": np.uint32(0xFFFFFFFF),
               "i32": np.uint32(0xFFFFFFFF)}


def poisoned_host(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    bits = POISON_BITS[dtype]
    return np.full(shape, bits, dtype=bits.dtype).view(storage_dtype(dtype))


class Backend:
    name: str = ""
    writes_in_place: bool = True  # False: impls return fresh arrays, nothing to poison
    # True where every kernel runs with f32 subnormals flushed to zero (FTZ); the runner then
    # asks the oracle for FTZ semantics (ops that model it take the `ftz` param).
    flushes_subnormals: bool = False

    def available(self) -> tuple[bool, str]:
        raise NotImplementedError

    def device(self) -> str:
        """The device impls of this backend run on here, e.g. 'cuda:0 NVIDIA H100', 'cpu'."""
        raise NotImplementedError

    @property
    def accelerator(self) -> bool:
        return self.device() != "cpu"

    def versions(self) -> dict[str, str]:
        return {}

    def to_device(self, array: np.ndarray):
        raise NotImplementedError

    def poisoned(self, shape: tuple[int, ...], dtype: str):
        return self.to_device(poisoned_host(shape, dtype))

    def to_host(self, array, dtype: str) -> np.ndarray:
        raise NotImplementedError

    def synchronize(self) -> None:
        pass

    def timer(self):
        """The backend's `gpu_impls.timer.Timer` (device clock, graphs, flush, ceilings)."""
        from gpu_impls.timer import HOST_TIMER

        return HOST_TIMER
