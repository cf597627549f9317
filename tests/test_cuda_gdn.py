"""The CUDA GDN impls without a GPU (`gpu_impls/cuda/gdn.py`): the launch geometry the wrappers
derive is the kernels' (constants of the .cu files), chunk_o's is the seed's (grid (V / 32, NT,
B * Hv), 256 threads, 8 KiB of shared memory), and every K the step's contract admits has its
compiled instance. The contracts' violating cases are tests/test_contracts.py's; the GPU runs are
tests/test_gpu_gdn.py and the gate."""

from __future__ import annotations

import re
import shutil

import pytest

import gpu_impls
from cases.model import Case
from gpu_impls.cuda import gdn
from gpu_impls.cuda._module import KERNEL_DIR

QWEN = {"heads_k": 16, "heads_v": 32, "dim_k": 128, "dim_v": 128}


def _defines(source: str) -> dict[str, int]:
    text = (KERNEL_DIR / source).read_text()
    return {name: int(value) for name, value in re.findall(r"^#define (\w+) (\d+)", text, re.M)}


def _launch(impl_id: str, case: Case):
    impl = gpu_impls.impls()[impl_id]
    return impl.contract.check(impl.id, case)


def test_wrapper_constants_are_the_kernels():
    step, chunk_o = _defines(gdn.STEP_SOURCE), _defines(gdn.CHUNK_O_SOURCE)
    assert gdn.STEP_THREADS == 32 * step["KP_GDN_WARPS"]
    assert gdn.STEP_ROWS == step["KP_GDN_WARPS"] * step["KP_GDN_ROWS"]
    assert (gdn.CHUNK_O_THREADS, gdn.CHUNK_O_K, gdn.CHUNK_O_BT, gdn.CHUNK_O_BV) == (
        chunk_o["GDN_O_THREADS"], chunk_o["GDN_O_K"], chunk_o["GDN_O_BT"], chunk_o["GDN_O_BV"])


def test_chunk_o_grid_is_the_seeds_capped_at_cudas_limit():
    case = Case.make("gdn_chunk_o", {**QWEN, "batch": 1, "tokens": 4096}, "bf16")
    launch = _launch("cuda:gdn_chunk_o", case)
    assert (launch.grid, launch.block) == ((128 // 32, 4096 // 64, 32), (256, 1, 1))
    wide = case.replace(batch=2048 + 1, tokens=64)  # B * Hv = 65568: grid.z capped, blocks stride
    assert _launch("cuda:gdn_chunk_o", wide).grid == (4, 1, 65535)


@pytest.mark.parametrize("dim_k", range(32, 257, 32))
@pytest.mark.parametrize("dim_v", [1, 15, 16, 17, 128])
def test_step_blocks_cover_every_row_with_a_compiled_instance(dim_k, dim_v):
    dims = {"batch": 3, "heads_k": 2, "heads_v": 4, "dim_k": dim_k, "dim_v": dim_v}
    launch = _launch("cuda:kp_gdn_step", Case.make("gdn_step", dims, "bf16"))
    slices = launch.extra["slices"]
    assert launch.grid == (3 * 4 * slices, 1, 1)
    assert (slices - 1) * gdn.STEP_ROWS < dim_v <= slices * gdn.STEP_ROWS
    instances = {args for source, name, configs in gdn.KERNELS[:1] for args in configs}
    assert (launch.extra["kpl"],) in instances and launch.extra["kpl"] * 32 == dim_k


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_chunk_o_shared_memory_is_the_seeds_a_tile():
    """8 KiB: the 64 x 64 A tile in T (2 bytes), as the seed's threadgroup budget; nothing else
    in shared memory (the f32 instance is empty: the contract refuses f32)."""
    from tests.test_cuda_build import _ptx_entries

    for body in _ptx_entries(gdn.CHUNK_O_SOURCE):
        name = body.split("(", 1)[0]
        sizes = [int(n) for n in re.findall(r"^\s*\.shared \.align \d+ \.b8 \S+\[(\d+)\];",
                                            body, re.M)]
        assert sum(sizes) == (0 if "F32" in name else 8192), f"{name}: shared {sizes}"
