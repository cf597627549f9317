"""kp_sdpa_decode's launch on the CPU (`gpu_impls/cuda/kp_attention.py`): the split counts its
docstring promises, the tile ring its kernel's `Shape` sizes, the warps knob's block and
residency, and the knobs reaching the compile as defines."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_impls
from cases.model import Case
from gpu_impls.cuda import kp_attention as ka

LLAMA = {"heads": 32, "kv_heads": 8, "head_dim": 128}  # Llama-3.1-8B: GQA groups of 4


def _case(batch: int, length: int, dtype: str = "bf16") -> Case:
    return Case.make("sdpa_decode", {**LLAMA, "batch": batch, "max_len": length}, dtype,
                     params={"ragged": 0})


def _split(impl, case):
    return impl.contract.check(impl.id, case)["split"]


@pytest.fixture(autouse=True)
def h100(monkeypatch):
    monkeypatch.setattr(ka, "sm_count", lambda: ka.DEFAULT_SMS)  # 132, with or without a GPU


@pytest.mark.parametrize("batch, splits", [(1, 30), (32, 1)])
def test_llama_split_counts_are_the_docstrings(batch, splits):
    """B=1: 8 blocks a split, 30 splits fill 240 of the 264 slots (2 an SM); B=32: 256 blocks
    already fill one wave, no second pass."""
    launch = _split(gpu_impls.impls()["cuda:kp_sdpa_decode"], _case(batch, 4096))
    assert launch.extra["splits"] == splits
    assert launch.grid == (1, splits, batch * 8) and launch.block == (128, 1, 1)


@pytest.mark.parametrize("head_dim, dtype, warps, ring", [
    (128, "bf16", 4, 4 * 16384),  # 32 keys a tile (16 groups of 8 lanes, 2 keys), 4 stages
    (128, "bf16", 8, 2 * 32768),  # 64 keys a tile: 2 stages fit the 64 KiB budget
    (64, "f32", 4, 2 * 32768),    # 4 lanes a key: 64 keys, 4-byte rows
    (96, "bf16", 4, 4 * 12288),   # 96 / 16 = 6 lanes, rounded up to 8
])
def test_the_ring_is_the_kernels_shape(head_dim, dtype, warps, ring):
    assert ka.ring_bytes(head_dim, dtype, warps=warps) == ring


def test_more_warps_make_a_wider_block_and_halve_the_blocks_an_sm():
    """8 warps of 232 registers fill the register file alone: one block an SM, so B=1 takes
    15 splits (120 of 132 slots) where 4 warps took 30."""
    impl = ka.decode_impl("sdpa_decode", "kp_w8_test", warps=8)
    launch = _split(impl, _case(1, 4096))
    assert launch.block == (256, 1, 1) and launch.extra["warps"] == 8
    assert launch.extra["splits"] == 15
    assert launch.shared_bytes == ka.ring_bytes(128, "bf16", warps=8)


def _compiled_with(impl, case, monkeypatch) -> list[tuple]:
    """The (kernel name, defines) of each kernel the run asks for, nothing launched."""
    asked = []
    monkeypatch.setattr(ka, "kernel", lambda src, name, dtype, defines, *a: asked.append(
        (name, tuple(defines))) or name)
    monkeypatch.setattr(ka, "cuda_launch", lambda *a, **k: None)
    monkeypatch.setattr(ka, "_workspace", lambda rows, splits, dim: ("o", "m", "l"))
    monkeypatch.setattr(ka, "_aligned", lambda inputs, names: None)
    spec = case.spec
    arrays = {t.name: np.zeros(1) for t in spec.inputs + spec.outputs}
    impl.run(impl.contract.check(impl.id, case), arrays, arrays, case)
    return asked


def test_the_knobs_reach_the_compile_of_pass_1_only(monkeypatch):
    case = _case(1, 4096)
    assert _compiled_with(gpu_impls.impls()["cuda:kp_sdpa_decode"], case, monkeypatch) == [
        ("kp_sdpa_decode_split", ()), ("kp_attn_combine", ())]
    knobs = ka.decode_impl("sdpa_decode", "kp_knobs_test", epl=8, warps=8)
    assert _compiled_with(knobs, case, monkeypatch)[0] == (
        "kp_sdpa_decode_split", ("KP_EPL=8", "KP_WARPS=8"))
