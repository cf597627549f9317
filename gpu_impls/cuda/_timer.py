"""The CUDA timer over CuPy: CuPy events, stream capture into a `cupy.cuda.Graph`."""

from __future__ import annotations

import functools

import numpy as np

from gpu_impls._cuda_timer import CudaTimer


@functools.lru_cache(maxsize=None)
def _spin_kernel():
    """One thread spinning `cycles` SM clock cycles; touches no memory."""
    import cupy

    return cupy.RawKernel(
        'extern "C" __global__ void kparity_spin(long long cycles) {'
        " long long t0 = clock64(); while (clock64() - t0 < cycles) {} }", "kparity_spin")


@functools.lru_cache(maxsize=None)
def _rewrite_kernel():
    """p[i] ^= key for i < n, one byte a thread: with key 0 (a run-time argument, so the
    compiler keeps the load and the store) each byte is rewritten with its own value."""
    import cupy

    return cupy.RawKernel(
        'extern "C" __global__ void kparity_rewrite(unsigned char* p, long long n,'
        " unsigned int key) { long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;"
        " if (i < n) p[i] ^= (unsigned char)key; }", "kparity_rewrite")


@functools.lru_cache(maxsize=None)
def _copy_kernel():
    """d[i] = s[i] over n 16-byte words, one word a thread (`--copy-same-bytes`)."""
    import cupy

    return cupy.RawKernel(
        'extern "C" __global__ void kparity_copy16(const int4* __restrict__ s,'
        " int4* __restrict__ d, long long n) { long long i = (long long)blockIdx.x *"
        " blockDim.x + threadIdx.x; if (i < n) d[i] = s[i]; }", "kparity_copy16")


REWRITE_BLOCK = 256
COPY_BLOCK = 256


class CupyTimer(CudaTimer):
    def _new_stream(self):
        import cupy

        return cupy.cuda.Stream(non_blocking=True)

    def _stream_context(self, stream):
        return stream  # a CuPy stream is its own context manager: `with stream:` makes it current

    def _capture(self, stream, calls):
        with stream:
            stream.begin_capture()
            try:
                for call in calls:
                    call()
            finally:
                graph = stream.end_capture()
        return lambda: graph.launch(stream)

    def _events(self):
        import cupy

        return cupy.cuda.Event(), cupy.cuda.Event()

    def _record(self, event, stream):
        event.record(stream)

    def _elapsed_ms(self, start, end):
        import cupy

        return cupy.cuda.get_elapsed_time(start, end)

    def _spin(self, cycles):
        _spin_kernel()((1,), (1,), (np.int64(cycles),))

    def _nbytes(self, array):
        return int(array.nbytes)

    def _rewrite(self, array, nbytes):
        blocks = (nbytes + REWRITE_BLOCK - 1) // REWRITE_BLOCK
        _rewrite_kernel()((blocks,), (REWRITE_BLOCK,), (array, np.int64(nbytes), np.uint32(0)))

    def _alloc_bytes(self, nbytes):
        import cupy

        return cupy.empty(nbytes, dtype=cupy.uint8)

    def _memset(self, buf, value):
        buf.fill(value)

    def _copy_pair(self, nbytes):
        import cupy

        src = cupy.random.default_rng(0).standard_normal(nbytes // 4, dtype=cupy.float32)
        dst = cupy.empty_like(src)
        return (lambda: cupy.copyto(dst, src)), 2 * src.nbytes

    def _copy_kernel_pair(self, nbytes):
        import cupy

        src = cupy.random.default_rng(0).standard_normal(nbytes // 4, dtype=cupy.float32)
        dst = cupy.empty_like(src)
        words = nbytes // 16
        grid = (words + COPY_BLOCK - 1) // COPY_BLOCK
        return (lambda: _copy_kernel()((grid,), (COPY_BLOCK,), (src, dst, np.int64(words)))), src

    def _gemm(self, n):
        import cupy

        rng = cupy.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
        b = rng.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
        c = cupy.empty((n, n), dtype=cupy.float16)
        return (lambda: cupy.matmul(a, b, out=c)), "f16"

    def l2_bytes(self):
        from gpu_impls.cuda._device import device_properties

        return int(device_properties()["l2CacheSize"])

    def free_bytes(self):
        import cupy

        return int(cupy.cuda.runtime.memGetInfo()[0])
