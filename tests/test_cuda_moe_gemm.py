"""`cuda:kp_moe_grouped_gemm` without a GPU (`gpu_impls/cuda/moe_gemm.py`): registered with its
kernel instances and mutant define; the wrapper's constants are the kernel's; the host picks the
kernel by dims (tensor cores at prefill, the GEMV at decode and in f32); the grid's tile bound
covers every routing; the kernel's tile lookup (`find_tile`, transcribed here as the warp
computes it) gives every row exactly one tile of its own expert; the contract rejects what the
kernels cannot do, naming the limit and the fix; the run passes the arguments its kernels
declare (nvcc's PTX), in order. The GPU runs are tests/test_gpu_moe_gemm.py and the gate."""

from __future__ import annotations

import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

import gpu_impls
from tests import ptx
from cases.model import Case
from gpu_impls.contract import ContractError
from gpu_impls.cuda import moe_gemm
from gpu_impls.cuda._module import KERNEL_DIR, MAKERS
from oracle.moe_gemm import ROUTINGS, expert_counts

IMPL = "cuda:kp_moe_grouped_gemm"
DEFINE = "KPARITY_MUTANT_TILE_FIRST_ROW"


def _case(dtype="bf16", weights="affine4", routing="random", **dims) -> Case:
    dims = {"rows": 6, "experts": 128, "in": 2048, "out": 768, **dims}
    return Case.make("moe_grouped_gemm", dims, dtype,
                     params={"weights": weights, "routing": routing})


def _launch(case: Case):
    impl = gpu_impls.impls()[IMPL]
    return impl.contract.check(impl.id, case)


# --- registration ---------------------------------------------------------------------------------

def test_registered_with_its_kernels_and_mutant_define():
    from gpu_impls.cuda.nvcc_check import MUTANT_DEFINES, defines_for, listed_kernels

    impl = gpu_impls.impls()[IMPL]
    assert (impl.op, impl.contract, impl.deterministic) == ("moe_grouped_gemm",
                                                            moe_gemm.CONTRACT, True)
    assert impl.id in MAKERS
    assert dict(listed_kernels()[moe_gemm.SOURCE]) == {
        "kp_moe_gemv": tuple((a, mt) for a in (0, 1) for mt in (1, 2, 4, 8)),
        "kp_moe_gemm_mma": ((0,), (1,))}
    assert ("kp_moe_qgemv_mma", ((2, 64), (3, 64))) in listed_kernels()[moe_gemm.MMA]
    assert DEFINE in MUTANT_DEFINES and DEFINE in defines_for(KERNEL_DIR / moe_gemm.SOURCE)
    gpu_impls.load_plugin("tests/mutants.py")
    from tests.mutants import MOE_CUDA_MUTANTS

    assert MOE_CUDA_MUTANTS == ((IMPL, "mutant_kp_moe_tile_first_row", DEFINE),)
    mutant = gpu_impls.impls()["cuda:mutant_kp_moe_tile_first_row"]
    assert (mutant.op, mutant.contract) == (impl.op, impl.contract) and DEFINE in mutant.doc


def test_wrapper_constants_are_the_kernels():
    text = (KERNEL_DIR / moe_gemm.SOURCE).read_text()
    d = {k: int(v) for k, v in re.findall(r"^#define (\w+) (\d+)", text, re.M)}
    assert (moe_gemm.MAX_EXPERTS, moe_gemm.GEMV_ROWS, moe_gemm.GEMV_MAX_WARPS) == (
        d["KPMOE_MAX_EXPERTS"], d["KPMOE_ROWS"], d["KPMOE_GEMV_MAX_WARPS"])
    assert (moe_gemm.MMA_TM, moe_gemm.MMA_TN, moe_gemm.MMA_TK, moe_gemm.MMA_THREADS) == (
        d["KPMOE_TM"], d["KPMOE_TN"], d["KPMOE_TK"], d["KPMOE_MMA_THREADS"])
    assert d["KPMOE_GROUP"] == 64 and moe_gemm.MMA_TK == d["KPMOE_GROUP"]


# --- geometry -------------------------------------------------------------------------------------

def test_affine4_decode_is_kp_qgemv_mma_per_row():
    """Nemotron-3-Nano's decode (k = 6 rows on 6 of 128 experts, K 2688, up 1856), affine4:
    kp_qgemv_mma's GEMV with one x row per grid row, its geometry chosen for the 6 x 1856 rows
    together (K parts), 2 stages and 2 tiles of 16 columns a block (the measured best,
    benchmarks/data/moe-h100/qgemv-variants.txt): 1856 / 16 = 116 column tiles, 58 blocks a
    row."""
    launch = _launch(_case(rows=6, **{"in": 2688, "out": 1856}))
    x = launch.extra
    assert (x["mma"], x["qgemv"], x["tiles"], x["stages"]) == (0, 1, 6, 2)
    assert launch.block == (64, 2, 1) and launch.grid == (58, 6, 1) and x["slabs"] == 58
    from gpu_impls.cuda.gemv import mma_geometry

    alone, same = mma_geometry({"out": 6 * 1856, "in": 2688, "group_size": 64}, {}, 2, None, 2)
    assert (alone["tiles"], alone["parts"]) == (2, 2)
    assert launch.shared_bytes == same.shared_bytes


@pytest.mark.parametrize("dtype, dims, why", [
    ("f32", {}, "f32 activations: no exact tensor-core path"),
    ("bf16", {"in": 2880}, "K % 128 != 0 (GPT-OSS-20B)"),
    ("bf16", {"rows": 129, "experts": 128}, "more rows than experts"),
    ("bf16", {"in": 2176, "out": 3}, "N K / 64 % 8 != 0: an expert's scales off 16 bytes"),
])
def test_affine4_decode_elsewhere_is_the_gemv(dtype, dims, why):
    launch = _launch(_case(dtype, **dims))
    assert launch.extra["qgemv"] == 0 and launch.extra["mma"] == 0, why


def test_dense_decode_is_a_gemv_tile_per_row():
    """Dense decode: one row a tile, slabs of 4 columns, one warp (256 chunks of 8 bf16: 8 a
    lane)."""
    dense = _launch(_case(weights="dense", rows=8, **{"in": 2048, "out": 768}))
    assert dict(dense.extra) == {"mma": 0, "qgemv": 0, "mt": 1, "tiles": 8, "slabs": 192}
    assert dense.grid == (8 * 192, 1, 1) and dense.block == (32, 1, 1)


def test_prefill_is_tensor_core_tiles():
    """Qwen3-30B-A3B at T = 2048 (k 8: M 16384, E 128): 64-row tiles, at most 256 + 128 of them,
    x 24 slabs of 64 columns at N 1536."""
    for weights in ("dense", "affine4"):
        launch = _launch(_case(weights=weights, rows=16384, out=1536))
        assert dict(launch.extra) == {"mma": 1, "qgemv": 0, "mt": 0, "tiles": 384,
                                      "slabs": 24}
        assert launch.grid == (384 * 24, 1, 1) and launch.block == (128, 1, 1)


@pytest.mark.parametrize("dtype, weights, dims, mt", [
    ("f32", "dense", {"rows": 16384}, 8),               # f32: no exact tensor-core path
    ("f16", "dense", {"rows": 16384, "in": 1032}, 8),   # K % 64 != 0
    ("bf16", "affine4", {"rows": 1023, "experts": 128}, 8),  # 7.99 rows an expert
    ("bf16", "dense", {"rows": 14, "experts": 4}, 4),
    ("bf16", "dense", {"rows": 7, "experts": 4}, 2),
])
def test_gemv_elsewhere_with_rows_a_tile_from_m_over_e(dtype, weights, dims, mt):
    launch = _launch(_case(dtype, weights, **dims))
    assert launch.extra["mma"] == 0 and launch.extra["mt"] == mt
    assert _launch(_case("bf16", weights, rows=1024, experts=128)).extra["mma"] == 1


def test_gemv_warps_split_long_rows():
    """At most 8 chunks a lane, 1..4 warps: dense f32 K 2048 is 512 chunks (2 warps), K 8192
    2048 (4, capped: 16 a lane)."""
    blocks = {k: _launch(_case("f32", "dense", **{"in": k})).block[0] for k in (256, 2048, 8192)}
    assert blocks == {256: 32, 2048: 64, 8192: 128}


SMALL = ((1, 1), (1, 128), (6, 128), (6, 1024), (70, 8), (64, 1), (65, 1), (129, 2),
         (200, 40))
LARGE = ((1000, 1024), (16384, 128), (4096, 512))


def _layouts(shapes=SMALL + LARGE):
    """Counts per expert of every routing the gate knows, and skewed ones, over (rows,
    experts)."""
    rng = np.random.default_rng(31)
    for rows, experts in shapes:
        for routing in ROUTINGS:
            yield rows, expert_counts(rows, experts, routing)
        yield rows, np.bincount(rng.integers(0, experts, rows), minlength=experts)
        one = np.zeros(experts, np.int64)
        one[-1] = rows
        yield rows, one  # every row on the last expert


def test_tile_bound_covers_every_routing():
    """The grid's tiles are never fewer than the tiles the experts own (else rows would go
    unwritten), for every tile height the kernels use."""
    for rows, counts in _layouts():
        assert counts.sum() == rows
        for tm in (*moe_gemm.GEMV_MT, moe_gemm.MMA_TM):
            need = int(sum(-(-c // tm) for c in counts))
            assert need <= moe_gemm.tile_bound(rows, len(counts), tm) <= rows, (rows, tm)


def find_tile(s_off: np.ndarray, tile: int, tm: int):
    """`kpmoe::find_tile` as one warp computes it: 32 experts at a time, each lane's tile
    count, the inclusive scan, the first lane whose running total passes `tile`: (expert, row0,
    rows), or None past the last tile."""
    experts, base = len(s_off) - 1, 0
    for e0 in range(0, experts, 32):
        e = np.arange(e0, e0 + 32)
        count = np.where(e < experts, np.maximum(
            s_off[np.minimum(e + 1, experts)] - s_off[np.minimum(e, experts)], 0), 0)
        n = np.where(count > 0, (count - 1) // tm + 1, 0)
        incl = np.cumsum(n)
        if tile < base + incl[31]:
            src = int(np.flatnonzero(base + incl > tile)[0])
            first = base + incl[src] - n[src]
            expert = e0 + src
            row0 = int(s_off[expert] + (tile - first) * tm)
            return expert, row0, int(min(tm, s_off[expert + 1] - row0))
        base += incl[31]
    return None


def test_tile_lookup_gives_every_row_one_tile_of_its_expert():
    """Over the grid's tiles, the lookup covers every row exactly once with its own expert's
    segment, tiles past the last one are idle, no tile is empty or longer than TM."""
    for rows, counts in _layouts(SMALL):
        off = np.concatenate([[0], np.cumsum(counts)])
        expert_of = np.repeat(np.arange(len(counts)), counts)
        for tm in (1, 8, moe_gemm.MMA_TM):
            seen = np.zeros(rows, np.int64)
            for tile in range(moe_gemm.tile_bound(rows, len(counts), tm)):
                found = find_tile(off, tile, tm)
                if found is None:
                    continue
                expert, row0, n = found
                assert 1 <= n <= tm and (expert_of[row0:row0 + n] == expert).all()
                seen[row0:row0 + n] += 1
            assert (seen == 1).all(), (rows, tm)


# --- contract -------------------------------------------------------------------------------------

def _rejects(case: Case) -> ContractError:
    with pytest.raises(ContractError) as info:
        _launch(case)
    return info.value


def test_contract_limits():
    err = _rejects(_case(experts=1025))
    assert err.invariant == "experts <= 1024" and "torch:grouped_linear" in err.fix
    assert str(err).startswith(f"{IMPL}: contract invariant `experts <= 1024` broken "
                               "(experts=1025)")
    assert _launch(_case(experts=1024)) is not None
    err = _rejects(_case(**{"in": 96}))
    assert err.invariant == "weights == 'dense' or in % 64 == 0" and err.fix == "in = 64 or 128"
    assert _launch(_case(weights="dense", **{"in": 96})) is not None  # 12 vectors of 8 bf16
    err = _rejects(_case("f32", "dense", **{"in": 66}))
    assert err.invariant == "weights == 'affine4' or in % (16 / element bytes) == 0"
    assert err.fix == "in = 64 or 68, or torch:grouped_linear"
    assert _rejects(_case("bf16", "dense", **{"in": 68})).fix.startswith("in = 64 or 72")
    assert _launch(_case("f32", "dense", **{"in": 68})) is not None


# --- the run's arguments --------------------------------------------------------------------------

def _params() -> dict[str, list[str]]:
    """{kernel name: PTX parameter kinds} of one BF16 instance each (`tests/ptx.py`)."""
    names = {"kp_moe_gemv": (1, 1), "kp_moe_gemm_mma": (1,)}
    found = ptx.entries(moe_gemm.SOURCE, tuple((n, "bf16", a) for n, a in names.items()))
    return {n: found[(n, "bf16", a)]["params"] for n, a in names.items()}


class _Array:
    def __init__(self, name, ptr=256):
        self.name, self.data = name, SimpleNamespace(ptr=ptr)


def _recorded(case: Case, monkeypatch, ptr=256) -> dict:
    seen = {}
    monkeypatch.setattr(moe_gemm, "kernel", lambda *a: a)
    monkeypatch.setattr(moe_gemm, "cuda_launch", lambda k, grid, block, args, pdl=False,
                        shared_bytes=0: seen.update(kernel=k, grid=grid, block=block, args=args,
                                                    pdl=pdl, shared_bytes=shared_bytes))
    spec = case.spec
    inputs = {t.name: _Array(t.name, ptr) for t in spec.inputs}
    outputs = {t.name: _Array(t.name, ptr) for t in spec.outputs}
    launch = moe_gemm.CONTRACT.check(IMPL, case)
    moe_gemm._kp_moe()(launch, inputs, outputs, case)
    assert (seen["grid"], seen["block"], seen["pdl"], seen["shared_bytes"]) == (
        launch.grid, launch.block, True, launch.shared_bytes)
    return {**seen, "slabs": launch.extra["slabs"]}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_runs_pass_each_kernel_its_declared_arguments(monkeypatch):
    """Pointers then 32-bit ints, as the kernels' PTX declares them; the weights are w (dense)
    or w_q (affine4); the ints are M, E, N, K and the slabs; the instance is the dtype, the
    weight form and, for the GEMV, the rows a tile."""
    params = _params()
    for case, name, targs in (
            (_case(weights="dense", rows=6, out=30), "kp_moe_gemv", (0, 1)),
            (_case(rows=14, experts=4), "kp_moe_gemv", (1, 4)),
            (_case(rows=16384, out=1536), "kp_moe_gemm_mma", (1,)),
            (_case(weights="dense", rows=1024, experts=8), "kp_moe_gemm_mma", (0,))):
        seen = _recorded(case, monkeypatch)
        assert seen["kernel"] == (moe_gemm.SOURCE, name, "bf16", (), targs)
        kinds = ["u64" if isinstance(a, _Array) else {np.int32: "u32"}[type(a)]
                 for a in seen["args"]]
        assert kinds == params[name]
        weights = "w_q" if case.params["weights"] == "affine4" else "w"
        assert [a.name for a in seen["args"][:6]] == ["x", weights, "scales", "biases",
                                                       "offsets", "y"]
        d = case.dims
        assert [int(a) for a in seen["args"][6:]] == [d["rows"], d["experts"], d["out"],
                                                      d["in"], seen["slabs"]]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_decode_run_passes_kp_moe_qgemv_mma_its_declared_arguments(monkeypatch):
    """kp_qgemv_mma's arguments (w_q, scales, biases, x, y, N, K, group size), then the
    offsets, E and M; the instance is (stages, 64)."""
    case = _case(rows=6, **{"in": 2688, "out": 1856})
    seen = _recorded(case, monkeypatch)
    stages = _launch(case).extra["stages"]
    assert seen["kernel"] == (moe_gemm.MMA, "kp_moe_qgemv_mma", "bf16", (), (stages, 64))
    kinds = ["u64" if isinstance(a, _Array) else {np.int32: "u32"}[type(a)]
             for a in seen["args"]]
    assert kinds == _qgemv_params()
    names = [a.name for a in seen["args"] if isinstance(a, _Array)]
    assert names == ["w_q", "scales", "biases", "x", "y", "offsets"]
    assert [int(a) for a in seen["args"] if not isinstance(a, _Array)] == [1856, 2688, 64, 128, 6]


def _qgemv_params() -> list[str]:
    instance = ("kp_moe_qgemv_mma", "bf16", (2, 64))
    return ptx.entries(moe_gemm.MMA, (instance,))[instance]["params"]


def test_run_refuses_unaligned_vectors(monkeypatch):
    with pytest.raises(ValueError, match="16-byte aligned"):
        _recorded(_case(), monkeypatch, ptr=8)
