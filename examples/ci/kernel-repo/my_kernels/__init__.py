"""my_kernels: this repository's kernels, as its users call them.

A real repository would call its CUDA / Triton kernels here; this example's RMSNorm is plain
torch, so the CI recipe (examples/ci/) runs on a CPU too. Nothing here imports kparity: the
adapter that registers the kernels with kparity is `my_kernels.kparity_plugin`.
"""

from __future__ import annotations


def rms_norm(x, w, eps: float, weight_offset: float = 0.0):
    """y = x * rsqrt(mean(x^2) + eps) * (w + weight_offset), in f32, rounded to x's dtype once.

    Built for f16 and bf16 rows whose length is a multiple of 8 (one 16-byte load per thread
    in a real kernel)."""
    import torch

    x32 = x.float()
    inv = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * inv * (w.float() + weight_offset)).to(x.dtype)
