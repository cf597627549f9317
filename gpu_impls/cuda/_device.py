"""The CUDA device this process runs on, as CuPy reports it (the backend's `device()` and the
timer's L2 size read it)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def device_properties() -> dict:
    """Device 0's properties, read once per process: cudaGetDeviceProperties queries every
    attribute and takes milliseconds a call on recent drivers, and each check's row names the
    device (`device()`), as the collection of `pytest -m gpu` did per test (4,800 of them). A
    process's device 0 is fixed once CUDA has started (CUDA_VISIBLE_DEVICES is read then)."""
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(0)
