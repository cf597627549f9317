"""The CUDA backend asks the driver for device 0's properties once per process, not per call:
cudaGetDeviceProperties takes milliseconds on recent drivers, and every check's row and every
collected `pytest -m gpu` test asked for the device's name. Checked with a stand-in CuPy."""

from __future__ import annotations

import sys
import types

from gpu_impls.cuda import _device, backend as cuda_backend


def _fake_cupy(calls: list) -> types.ModuleType:
    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        getDeviceProperties=lambda i: calls.append(i) or {"name": b"Fake H100",
                                                           "l2CacheSize": 50 << 20})
    return types.SimpleNamespace(__version__="0.0", cuda=types.SimpleNamespace(runtime=runtime))


def test_device_properties_are_read_once(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(calls))
    _device.device_properties.cache_clear()
    try:
        be = cuda_backend.CupyBackend()
        for _ in range(100):
            assert be.available() == (True, "cupy 0.0 on cuda:0 Fake H100")
            assert be.device() == "cuda:0 Fake H100"
        assert be.accelerator
        from gpu_impls.cuda._timer import CupyTimer

        assert CupyTimer.l2_bytes(None) == 50 << 20
        assert calls == [0]
    finally:
        _device.device_properties.cache_clear()  # the next test's CuPy is not this one
