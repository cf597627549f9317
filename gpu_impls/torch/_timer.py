"""Timers for torch: the CUDA timer over torch's events and `torch.cuda.CUDAGraph` on a GPU, the
host timer on CPU (torch CPU ops are synchronous)."""

from __future__ import annotations

from gpu_impls._cuda_timer import CudaTimer


class TorchCudaTimer(CudaTimer):
    def _new_stream(self):
        import torch

        return torch.cuda.Stream()

    def _stream_context(self, stream):
        import torch

        return torch.cuda.stream(stream)

    def _capture(self, stream, calls):
        import torch

        graph = torch.cuda.CUDAGraph()
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for call in calls:
                call()

        def replay():
            with torch.cuda.stream(stream):
                graph.replay()
        replay.graph = graph  # keep the graph (and its memory pool) alive with the callable
        return replay

    def _events(self):
        import torch

        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def _record(self, event, stream):
        event.record(stream)

    def _elapsed_ms(self, start, end):
        return start.elapsed_time(end)

    def _spin(self, cycles):
        import torch

        torch.cuda._sleep(cycles)

    def _nbytes(self, array):
        return array.numel() * array.element_size()

    def _rewrite(self, array, nbytes):
        import torch

        # torch's elementwise XOR (an ordinary launch) on the leading bytes; 0: same values
        array.view(-1).view(torch.uint8)[:nbytes].bitwise_xor_(0)

    def _alloc_bytes(self, nbytes):
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    def _memset(self, buf, value):
        buf.fill_(value)

    def _copy_pair(self, nbytes):
        import torch

        g = torch.Generator(device="cuda").manual_seed(0)
        src = torch.randn(nbytes // 4, device="cuda", generator=g)
        dst = torch.empty_like(src)
        return (lambda: dst.copy_(src)), 2 * src.numel() * 4

    def _copy_kernel_pair(self, nbytes):
        import torch

        g = torch.Generator(device="cuda").manual_seed(0)
        src = torch.randn(nbytes // 4, device="cuda", generator=g).view(torch.int32)
        dst = torch.empty_like(src)
        # torch's elementwise OR with 0 (an ordinary vectorised kernel): the values copied
        return (lambda: torch.bitwise_or(src, 0, out=dst)), src

    def _gemm(self, n):
        import torch

        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(n, n, device="cuda", generator=g).bfloat16()
        b = torch.randn(n, n, device="cuda", generator=g).bfloat16()
        c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        return (lambda: torch.matmul(a, b, out=c)), "bf16"

    def l2_bytes(self):
        import torch

        return int(torch.cuda.get_device_properties(0).L2_cache_size)

    def free_bytes(self):
        import torch

        return int(torch.cuda.mem_get_info()[0])
