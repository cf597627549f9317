"""`cuda:kp_gdn_chunk_h` and the l2norm launcher without a GPU (`gpu_impls/cuda/gdn_chunk_h.py`):
the wrapper's constants are the kernel's, the geometry at the target shape, every K the contract
admits has an instance whose shared memory fits, violating cases are rejected naming their
invariant, and the run functions pass the kernels their arguments in the order of the kernels'
signatures (launches stubbed). The GPU runs are tests/test_gpu_gdn_chunk_h.py and the gate."""

from __future__ import annotations

import re

import numpy as np
import pytest

import gpu_impls
from cases.model import Case
from gpu_impls.contract import ContractError
from gpu_impls.cuda import gdn_chunk_h as mod
from gpu_impls.cuda._module import KERNEL_DIR
from tests.ptx import source_params

IMPL = "cuda:kp_gdn_chunk_h"
QWEN = {"heads_k": 16, "heads_v": 32, "dim_k": 128, "dim_v": 128}
TINY = {"heads_k": 2, "heads_v": 4, "dim_k": 16, "dim_v": 8}


def _source() -> str:
    return (KERNEL_DIR / mod.SOURCE).read_text()


def _case(dtype="bf16", params=None, **dims) -> Case:
    return Case.make("gdn_chunk_h", {"batch": 1, "tokens": 130, **QWEN, **dims}, dtype,
                     params=params or {})


def _launch(case: Case):
    return gpu_impls.impls()[IMPL].contract.check(IMPL, case)


def test_wrapper_constants_are_the_kernels():
    defines = {n: int(v) for n, v in re.findall(r"^#define (\w+) (\d+)", _source(), re.M)}
    assert (mod.THREADS, mod.BV, mod.CMAX, mod.PAD, mod.VLD, mod.L2_WARPS) == (
        defines["KP_GDN_H_THREADS"], defines["KP_GDN_H_BV"], defines["KP_GDN_H_CMAX"],
        defines["KP_GDN_H_PAD"], defines["KP_GDN_H_VLD"], defines["KP_GDN_L2_WARPS"])
    assert mod.VLD == mod.BV + mod.PAD


def test_geometry_at_the_target_shape():
    """B = 1, Hv = 32, V = 128: 4 V tiles x 32 heads = 128 blocks of 256 threads, the K = 128
    instance, 91.5 KiB of shared memory at chunk 64; one block per head of T's chunks."""
    for tokens, n_chunks in ((4096, 64), (16384, 256)):
        launch = _launch(_case(tokens=tokens))
        assert (launch.grid, launch.block) == ((4, 32, 1), (256, 1, 1))
        assert launch.shared_bytes == 93696 == launch.extra["shared_bytes"]
        assert (launch.extra["kp"], launch.extra["n_chunks"]) == (128, n_chunks)


def test_grid_y_capped_at_cudas_limit():
    """B * Hv = 65568 heads: grid.y capped at 65535, the blocks stride over the rest."""
    assert _launch(_case(batch=2049, tokens=1)).grid == (4, 65535, 1)


@pytest.mark.parametrize("chunk", [16, 32, 64])
def test_every_admitted_k_has_the_smallest_instance_and_fits_shared_memory(chunk):
    """Each K the contract admits (multiples of 8 up to 256) runs on the smallest listed
    instance KP >= K, and the instance's shared memory (f32 tiles: any dtype) fits the 227 KiB
    a block may opt in to: no invariant is needed for it."""
    listed = {args[0] for source, name, *rest in mod.KERNELS if name == "kp_gdn_chunk_h"
              for args in rest[0]}
    assert listed == set(mod.INSTANCES)
    for dim_k in range(8, mod.INSTANCES[-1] + 1, 8):
        launch = _launch(_case("f32", {"chunk": chunk}, dim_k=dim_k))
        kp = launch.extra["kp"]
        assert kp in listed and kp >= dim_k and not any(dim_k <= p < kp for p in listed)
        assert launch.shared_bytes == mod.shared_bytes(kp, chunk) <= mod.SHARED_OPT_IN_MAX
    assert mod.shared_bytes(256, 64) == 175616  # 171.5 KiB, the largest


def test_partial_tiles_and_chunks_are_admitted():
    """V not a multiple of 32 (rows past V held at 0), T not a multiple of the chunk, tiny heads:
    the gate's cases run on the kernel."""
    launch = _launch(Case.make("gdn_chunk_h", {"batch": 1, "tokens": 65, **TINY}, "f16",
                               params={"chunk": 16}))
    assert launch.grid == (1, 4, 1) and launch.extra["n_chunks"] == 5
    assert launch.extra["kp"] == 32
    assert _launch(_case(dim_v=48)).grid == (2, 32, 1)


@pytest.mark.parametrize("dim_k, invariant, fix", [(20, "dim_k % 8 == 0", "16 or 24"),
                                                   (264, "dim_k <= 256", "dim_k <= 256")])
def test_violating_k_rejected_naming_the_invariant(dim_k, invariant, fix):
    with pytest.raises(ContractError) as err:
        _launch(_case(dim_k=dim_k))
    assert err.value.invariant == invariant and fix in err.value.fix


def test_registered_with_its_kernels_and_mutant_define():
    from gpu_impls.cuda.nvcc_check import MUTANT_DEFINES, defines_for, listed_kernels

    impl = gpu_impls.impls()[IMPL]
    assert (impl.op, impl.backend, impl.contract) == ("gdn_chunk_h", "cuda",
                                                       mod.CHUNK_H_CONTRACT)
    assert {name for name, _ in listed_kernels()[mod.SOURCE]} == {"kp_gdn_chunk_h",
                                                                  "kp_gdn_l2norm"}
    assert "KPARITY_MUTANT_UNSCALED_STATE" in MUTANT_DEFINES
    assert "KPARITY_MUTANT_UNSCALED_STATE" in defines_for(KERNEL_DIR / mod.SOURCE)


class _Launches:
    """Stands in for `kernel` and `launch` of `_module`: records what a run would launch."""

    def __init__(self, monkeypatch):
        self.kernels, self.calls = [], []
        monkeypatch.setattr(mod, "kernel", lambda *a: self.kernels.append(a) or a)
        monkeypatch.setattr(mod, "cuda_launch", lambda k, grid, block, args, **kw:
                            self.calls.append((k, grid, block, args, kw)))


@pytest.mark.parametrize("defines", [(), ("KPARITY_MUTANT_UNSCALED_STATE",)])
def test_run_passes_the_kernel_its_signature(monkeypatch, defines):
    """The run function (the composition's too) passes the op's tensors and the ints in the
    order of `kp_gdn_chunk_h`'s parameters, each by its name: a tensor of the op, a dim, the
    chunk, or a name the geometry derived; the instance and the shared bytes of the launch."""
    stub = _Launches(monkeypatch)
    case = _case(tokens=100, params={"chunk": 32}, dim_k=64, dim_v=48, heads_k=2, heads_v=4)
    launch = _launch(case)
    tensors = {name: object() for name in ("k", "w", "u", "gc", "h0", "h", "v_new", "state")}
    inputs = {n: tensors[n] for n in ("k", "w", "u", "gc", "h0")}
    outputs = {n: tensors[n] for n in ("h", "v_new", "state")}
    assert mod._chunk_h(defines)(launch, inputs, outputs, case) is None
    (k, grid, block, args, kw), = stub.calls
    assert k == (mod.SOURCE, "kp_gdn_chunk_h", "bf16", defines, (64,))
    assert (grid, block, kw) == (launch.grid, launch.block, {"shared_bytes": launch.shared_bytes})
    names = source_params(mod.SOURCE, "kp_gdn_chunk_h")
    assert len(args) == len(names)
    for name, arg in zip(names, args):
        if name in tensors:
            assert arg is tensors[name], name
        else:
            want = {**case.dims, **case.params, **launch.extra}[name]
            assert isinstance(arg, np.int32) and arg == want, (name, arg, want)


def test_l2norm_launch_rows_and_signature(monkeypatch):
    """A warp per row of the last axis: rows = the product of the other axes (int64), 8 rows
    per block; the arguments in `kp_gdn_l2norm`'s order; x_out may be x_in; shapes must agree."""
    stub = _Launches(monkeypatch)
    x = np.zeros((2, 5, 3, 128), dtype=np.uint16)
    mod.l2norm(x, x, 1e-6, "f16")
    (k, grid, block, args, kw), = stub.calls
    assert k == (mod.SOURCE, "kp_gdn_l2norm", "f16")
    assert grid == (4, 1, 1) and block == (256, 1, 1)  # 30 rows / 8
    assert source_params(mod.SOURCE, "kp_gdn_l2norm") == ["x", "y", "rows", "dim", "eps"]
    assert args[0] is x and args[1] is x
    assert (type(args[2]), args[2], type(args[3]), args[3]) == (np.int64, 30, np.int32, 128)
    assert isinstance(args[4], np.float32) and args[4] == np.float32(1e-6)
    with pytest.raises(ValueError, match="one shape"):
        mod.l2norm(x, np.zeros((2, 5, 3, 64), dtype=np.uint16), 1e-6, "f16")
