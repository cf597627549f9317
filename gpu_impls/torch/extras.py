"""The requires-check of impls that wrap a peer library's CUDA-only kernels (an optional extra:
fla, mamba_ssm / causal_conv1d, Liger-Kernel)."""

from __future__ import annotations

import importlib.util


def needs(what: str, modules: tuple[str, ...], install: str):
    """A requires-check: a CUDA device, then each of `modules` installed (found, not imported:
    importing mamba_ssm would run its failing __init__, `gpu_impls/torch/mamba_peers.py`)."""

    def check() -> tuple[bool, str]:
        import torch

        if not torch.cuda.is_available():
            return False, f"{what} runs on CUDA only (no GPU here)"
        for module in modules:
            if importlib.util.find_spec(module) is None:
                return False, f"{module} not installed: {install}"
        return True, ""

    return check
