"""NVML through ctypes (no Python package needed): the run context and clocks during a run.

Read-only queries only: kparity never changes clocks, power limits or modes. Every function
returns None when NVML or the query is unavailable (no driver, a virtualised GPU), so timing
still works and the row says what it could not record.
"""

from __future__ import annotations

import ctypes
import functools

NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2


@functools.lru_cache(maxsize=None)
def _lib():
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if lib.nvmlInit_v2() != 0:
        return None
    return lib


@functools.lru_cache(maxsize=None)
def _handle(index: int = 0):
    lib = _lib()
    if lib is None:
        return None
    handle = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
        return None
    return handle


def _uint_query(fn_name: str, *args) -> int | None:
    lib, handle = _lib(), _handle()
    if lib is None or handle is None:
        return None
    value = ctypes.c_uint()
    try:
        rc = getattr(lib, fn_name)(handle, *args, ctypes.byref(value))
    except AttributeError:
        return None
    return int(value.value) if rc == 0 else None


def clock_mhz(which: int) -> int | None:
    """The current clock (NVML_CLOCK_SM or NVML_CLOCK_MEM), MHz."""
    return _uint_query("nvmlDeviceGetClockInfo", ctypes.c_int(which))


@functools.lru_cache(maxsize=None)
def default_sm_clock_mhz() -> int | None:
    """The SM clock the board runs at by default (the throttle reference, as nvbench's)."""
    return (_uint_query("nvmlDeviceGetDefaultApplicationsClock", ctypes.c_int(NVML_CLOCK_SM))
            or _uint_query("nvmlDeviceGetMaxClockInfo", ctypes.c_int(NVML_CLOCK_SM)))


def peak_bandwidth_gbps() -> float | None:
    """Spec DRAM bandwidth: 2 * max memory clock * bus width / 8 (nvbench's and Triton's formula)."""
    mem = _uint_query("nvmlDeviceGetMaxClockInfo", ctypes.c_int(NVML_CLOCK_MEM))
    bus = _uint_query("nvmlDeviceGetMemoryBusWidth")
    if not mem or not bus:
        return None
    return 2 * mem * 1e6 * bus / 8 / 1e9


def ecc_enabled() -> bool | None:
    lib, handle = _lib(), _handle()
    if lib is None or handle is None:
        return None
    current, pending = ctypes.c_int(), ctypes.c_int()
    if lib.nvmlDeviceGetEccMode(handle, ctypes.byref(current), ctypes.byref(pending)) != 0:
        return None
    return bool(current.value)


def driver_version() -> str | None:
    lib = _lib()
    if lib is None:
        return None
    buf = ctypes.create_string_buffer(96)
    if lib.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(96)) != 0:
        return None
    return buf.value.decode()


def context() -> dict:
    return {"driver": driver_version(), "ecc": ecc_enabled(),
            "sm_clock_default_mhz": default_sm_clock_mhz(),
            "peak_bw_spec_gbps": peak_bandwidth_gbps(),
            "sm_clock_now_mhz": clock_mhz(NVML_CLOCK_SM),
            "mem_clock_now_mhz": clock_mhz(NVML_CLOCK_MEM)}
