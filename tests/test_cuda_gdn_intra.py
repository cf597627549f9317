"""The CUDA intra-chunk GDN stages without a GPU (`gpu_impls/cuda/gdn_intra.py`): the four impls
are registered for their ops with an instance per chunk size; the launch geometry the wrappers
derive is the kernels' (block sizes = the kernels' launch bounds, shared memory = the kernels'
layout, grid.y capped at 65535); the contracts reject what the kernels cannot do with messages
that name the limit and the fix; each run passes the arguments its kernel declares, in order,
from a case's dims, params and dtype only (a `gdn_chunked` case drives them). The violating
cases of every invariant are also tests/test_contracts.py's; the GPU runs are
tests/test_gpu_gdn_intra.py."""

from __future__ import annotations

import functools
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

import gpu_impls
from cases.model import Case
from gpu_impls.contract import ContractError
from gpu_impls.cuda import gdn_intra
from gpu_impls.cuda._module import KERNEL_DIR, MAKERS
from oracle.gdn_chunked import CHUNKS
from oracle.spec import get_op
from tests import ptx

QWEN = {"batch": 1, "tokens": 4096, "heads_k": 16, "heads_v": 32, "dim_k": 128, "dim_v": 128}
STAGES = {"kp_gdn_chunk_cumsum": "gdn_chunk_cumsum", "kp_gdn_kkt": "gdn_kkt",
          "kp_gdn_solve_tril": "gdn_solve_tril", "kp_gdn_wy": "gdn_wy"}
CONTRACTS = {"kp_gdn_chunk_cumsum": gdn_intra.CUMSUM_CONTRACT, "kp_gdn_kkt": gdn_intra.KKT_CONTRACT,
             "kp_gdn_solve_tril": gdn_intra.SOLVE_CONTRACT, "kp_gdn_wy": gdn_intra.WY_CONTRACT}
RUNS = {"kp_gdn_chunk_cumsum": gdn_intra._cumsum, "kp_gdn_kkt": gdn_intra._kkt,
        "kp_gdn_solve_tril": gdn_intra._solve, "kp_gdn_wy": gdn_intra._wy}


def _launch(name: str, dims: dict, chunk: int = 64, dtype: str = "bf16"):
    impl = gpu_impls.impls()[f"cuda:{name}"]
    return impl.contract.check(impl.id, Case.make(STAGES[name], dims, dtype,
                                                  params={"chunk": chunk}))


def test_registered_per_op_with_an_instance_per_chunk():
    impls = gpu_impls.impls()
    for name, op in STAGES.items():
        impl = impls[f"cuda:{name}"]
        assert impl.op == op and impl.contract is CONTRACTS[name]
        assert impl.id in MAKERS  # rebuildable with defines (the mutants)
    listed = {(source, name): args for source, name, args in gdn_intra.KERNELS}
    assert set(listed) == {(gdn_intra.SOURCE, name) for name in STAGES}
    assert all(sorted(args) == [(c,) for c in sorted(CHUNKS)] for args in listed.values())
    from gpu_impls.cuda.nvcc_check import listed_kernels

    assert {name for name, _ in listed_kernels()[gdn_intra.SOURCE]} == set(STAGES)


def test_wrapper_constants_are_the_kernels():
    text = (KERNEL_DIR / gdn_intra.SOURCE).read_text()
    defines = {k: int(v) for k, v in re.findall(r"^#define (\w+) (\d+)", text, re.M)}
    assert (gdn_intra.CUMSUM_THREADS, gdn_intra.WY_BN, gdn_intra.WY_COLS) == (
        defines["GDN_CUMSUM_THREADS"], defines["GDN_WY_BN"], defines["GDN_WY_COLS"])


def test_qwen_geometry():
    """B = 1, T = 4096, Hk 16, Hv 32, K = V = 128, C = 64: kkt one block per (k head, chunk),
    solve per (value head, chunk), wy per (value head, 64 columns of w or u, chunk)."""
    nt = 4096 // 64
    cumsum = _launch("kp_gdn_chunk_cumsum", QWEN)
    assert cumsum.grid == (-(-nt * 32 // 128), 1, 1) and cumsum.block == (128, 1, 1)
    kkt = _launch("kp_gdn_kkt", QWEN)
    assert (kkt.grid, kkt.block) == ((16, nt, 1), (160, 1, 1))
    assert kkt.shared_bytes == (128 * 68 + 2 * 64) * 4 <= 48 * 1024  # no opt-in needed
    solve = _launch("kp_gdn_solve_tril", QWEN)
    assert (solve.grid, solve.block, solve.shared_bytes) == ((32, nt, 1), (160, 1, 1), 0)
    wy = _launch("kp_gdn_wy", QWEN)
    assert (wy.grid, wy.block) == ((32 * 4, nt, 1), (128, 1, 1))
    assert wy.extra["w_tiles"] == 2 and wy.extra["tiles"] == 4


@pytest.mark.parametrize("chunk", CHUNKS)
def test_threads_cover_the_lower_tiles(chunk):
    """kkt and solve hold one 4 x 4 tile of the lower triangle per thread (the tiles packed,
    whole warps); wy one 4 x 8 tile of the chunk x 64 outputs per thread."""
    tiles = (chunk // 4) * (chunk // 4 + 1) // 2
    assert tiles <= gdn_intra.tri_threads(chunk) < tiles + 32
    assert gdn_intra.tri_threads(chunk) % 32 == 0
    assert gdn_intra.wy_threads(chunk) * 4 * 8 == chunk * 64


def test_grid_y_capped_and_partial_tiles():
    """More chunks than grid.y takes: capped at 65535 (the kernels stride); K and V past a
    multiple of 64 take one more (partial) wy tile each."""
    dims = {**QWEN, "tokens": 16 * 65535 + 1, "heads_k": 1, "heads_v": 1}
    for name in ("kp_gdn_kkt", "kp_gdn_solve_tril", "kp_gdn_wy"):
        launch = _launch(name, dims, chunk=16)
        assert launch.grid[1] == 65535 and launch.extra["n_chunks"] == 65536
    wy = _launch("kp_gdn_wy", {**QWEN, "dim_k": 36, "dim_v": 132})
    assert (wy.extra["w_tiles"], wy.extra["tiles"]) == (1, 1 + 3)


def _rejects(name: str, dims: dict, chunk: int = 64) -> ContractError:
    with pytest.raises(ContractError) as info:
        _launch(name, dims, chunk)
    return info.value


def test_vector_widths_rejected_with_the_nearest_valid_dims():
    err = _rejects("kp_gdn_kkt", {**QWEN, "dim_k": 18})
    assert err.invariant == "dim_k % 4 == 0" and err.fix == "dim_k = 16 or 20"
    assert str(err).startswith("cuda:kp_gdn_kkt: contract invariant `dim_k % 4 == 0` broken "
                               "(dim_k=18)")
    assert _rejects("kp_gdn_wy", {**QWEN, "dim_k": 130}).fix == "dim_k = 128 or 132"
    err = _rejects("kp_gdn_wy", {**QWEN, "dim_v": 6})
    assert err.invariant == "dim_v % 4 == 0" and err.fix == "dim_v = 4 or 8"
    # solve and cumsum read only f32 rows of C (a multiple of 4): no limit on K or V
    for name in ("kp_gdn_chunk_cumsum", "kp_gdn_solve_tril"):
        assert _launch(name, {**QWEN, "dim_k": 18, "dim_v": 6}) is not None


@pytest.mark.parametrize("chunk", CHUNKS)
def test_kkt_shared_memory_limit(chunk):
    """The k tile (K x (C + 4) f32) must fit the opt-in limit: the largest K admitted fits it,
    the next multiple of 4 is rejected naming that K."""
    top = gdn_intra.kkt_max_k(chunk) // 4 * 4
    fits = _launch("kp_gdn_kkt", {**QWEN, "dim_k": top}, chunk)
    assert fits.shared_bytes == gdn_intra.kkt_shared_bytes(top, chunk) <= gdn_intra.SHARED_MAX
    err = _rejects("kp_gdn_kkt", {**QWEN, "dim_k": top + 4}, chunk)
    assert err.invariant.startswith("kkt shared memory <= 227 KiB")
    assert f"dim_k <= {gdn_intra.kkt_max_k(chunk)} at chunk={chunk}" in err.fix
    assert gdn_intra.kkt_shared_bytes(top + 4, chunk) > gdn_intra.SHARED_MAX


# --- the runs' arguments -------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _entries() -> dict[tuple[str, int], dict]:
    """{(kernel name, chunk): {"maxntid": int, "shared": static bytes, "params": [u64/u32/f32
    ...]}} of the F16 instances, from nvcc's PTX (tests/ptx.py: one small unit, then cached)."""
    names = [(name, c) for name in STAGES for c in CHUNKS]
    got = ptx.entries(gdn_intra.SOURCE, tuple((n, "f16", (c,)) for n, c in names))
    return {(n, c): got[(n, "f16", (c,))] for n, c in names}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_blocks_and_shared_memory_are_the_kernels():
    """Each launch's block is the kernel's launch bound (a larger block fails to launch, a
    smaller one would leave lower tiles unowned) and the static shared memory stays within 48
    KiB at every chunk (kkt's is dynamic: the wrapper's `kkt_shared_bytes`)."""
    entries = _entries()
    for (name, chunk), entry in entries.items():
        launch = _launch(name, QWEN, chunk)
        assert launch.block[0] == entry["maxntid"], (name, chunk)
        assert entry["shared"] <= 48 * 1024
    s = lambda c: (c + 4) * 4  # noqa: E731  bytes of one padded row of C floats
    for c in CHUNKS:
        assert entries[("kp_gdn_kkt", c)]["shared"] == 0
        assert entries[("kp_gdn_solve_tril", c)]["shared"] == 2 * c * s(c)
        assert entries[("kp_gdn_wy", c)]["shared"] == c * s(c) + (c * 64 + c) * 4


class _Array:
    """A stand-in device array that knows its tensor's name."""

    def __init__(self, name):
        self.name = name


def _recorded(name: str, case, monkeypatch) -> dict:
    """Run `name`'s run function on `case` with the launch recorded instead of made."""
    seen = {}
    monkeypatch.setattr(gdn_intra, "kernel", lambda *a: a)
    monkeypatch.setattr(gdn_intra, "cuda_launch",
                        lambda k, grid, block, args, shared_bytes=0: seen.update(
                            kernel=k, grid=grid, block=block, args=args, shared=shared_bytes))
    spec = get_op(STAGES[name])
    inputs = {t.name: _Array(t.name) for t in spec.inputs}
    outputs = {t.name: _Array(t.name) for t in spec.outputs}
    launch = CONTRACTS[name].geometry(case.dims, case.params)[1]
    RUNS[name]()(launch, inputs, outputs, case)
    assert (seen["grid"], seen["block"]) == (launch.grid, launch.block)
    return seen


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_runs_pass_each_kernel_its_declared_arguments_from_a_chunked_case(monkeypatch):
    """A `gdn_chunked` case (the composition's: same dims and params) reduced to dims, params
    and dtype drives every stage's run: the arguments match the kernel's PTX parameters in
    number and kind (pointers, then 32-bit ints), the tensors are the stage op's, in the
    kernel's order, and the instance is the case's dtype and chunk."""
    entries = _entries()
    chunked = Case.make("gdn_chunked", {**QWEN, "tokens": 130, "dim_k": 36, "dim_v": 72},
                        "bf16", params={"chunk": 32})
    case = SimpleNamespace(dims=chunked.dims, params=chunked.params, dtype=chunked.dtype)
    tensors = {"kp_gdn_chunk_cumsum": ["g", "gc"], "kp_gdn_kkt": ["k", "beta", "gc", "A"],
               "kp_gdn_solve_tril": ["A", "Ai"],
               "kp_gdn_wy": ["k", "v", "beta", "gc", "Ai", "w", "u"]}
    for name in STAGES:
        seen = _recorded(name, case, monkeypatch)
        assert seen["kernel"][:3] == (gdn_intra.SOURCE, name, "bf16")
        assert seen["kernel"][4] == (32,)
        args = seen["args"]
        kinds = ["u64" if isinstance(a, _Array) else {np.int32: "u32", np.float32: "f32"}[
            type(a)] for a in args]
        assert kinds == entries[(name, 32)]["params"], name
        assert [a.name for a in args if isinstance(a, _Array)] == tensors[name]
    kkt = _recorded("kp_gdn_kkt", case, monkeypatch)
    assert kkt["shared"] == gdn_intra.kkt_shared_bytes(36, 32)
    assert [int(a) for a in kkt["args"][4:]] == [130, 16, 32, 36, 5]  # T, Hk, Hv, K, NT
    wy = _recorded("kp_gdn_wy", case, monkeypatch)
    assert [int(a) for a in wy["args"][7:]] == [130, 16, 32, 36, 72, 1, 3, 5]
