"""The CUDA MoE routing impls without a GPU (`gpu_impls/cuda/moe_route.py`): registered for their
ops with their kernels and the atomic scatter-add mutant's define; the launch geometry the
wrappers derive is the kernels' (constants of moe_route.cu) and covers every token, expert and
row; the contracts reject what the kernels cannot do (k > 32, E > 1024, groups > 32), naming the
limit and the fix, and admit the models' shapes; each run passes the arguments its kernel
declares, in order (from nvcc's PTX). The violating cases of every invariant are also
tests/test_contracts.py's; the GPU runs are tests/test_gpu_moe_route.py and the gate."""

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
from gpu_impls.cuda import moe_route
from gpu_impls.cuda._module import KERNEL_DIR, MAKERS
from oracle.spec import get_op

IMPLS = {"kp_moe_router": ("moe_router", moe_route._router),
         "kp_moe_dispatch": ("moe_dispatch", moe_route._dispatch),
         "kp_moe_permute": ("moe_permute", moe_route._permute),
         "kp_moe_unpermute": ("moe_unpermute", moe_route._unpermute),
         "kp_moe_scatter_add": ("moe_scatter_add", moe_route._scatter_add)}
KERNEL_NAMES = ("kp_moe_router", "kp_moe_dispatch", "kp_moe_permute", "kp_moe_unpermute",
                "kp_moe_scatter_inverse", "kp_moe_scatter_add")


def _impl(name: str):
    return gpu_impls.impls()[f"cuda:{name}"]


def _launch(name: str, case: Case):
    impl = _impl(name)
    return impl.contract.check(impl.id, case)


def _router(t=7, e=128, k=8, groups=1, dtype="bf16", scoring="sigmoid_bias", **params) -> Case:
    return Case.make("moe_router", {"tokens": t, "experts": e, "top_k": k, "groups": groups},
                     dtype, params={"scoring": scoring, **params})


def _dispatch(t=7, e=128, k=8) -> Case:
    return Case.make("moe_dispatch", {"tokens": t, "experts": e, "top_k": k}, "f32")


def _rows(op: str, t=7, k=8, h=2048, dtype="bf16") -> Case:
    return Case.make(op, {"tokens": t, "top_k": k, "hidden": h}, dtype)


# --- registration --------------------------------------------------------------------------------

def test_registered_with_their_kernels_and_mutant_define():
    from gpu_impls.cuda.nvcc_check import MUTANT_DEFINES, defines_for, listed_kernels

    for name, (op, _) in IMPLS.items():
        impl = _impl(name)
        assert (impl.op, impl.backend, impl.deterministic) == (op, "cuda", True)
        assert impl.id in MAKERS  # rebuildable with defines (the mutant)
    assert dict(listed_kernels()[moe_route.SOURCE]) == {n: ((),) for n in KERNEL_NAMES}
    define = moe_route.ATOMIC_MUTANT
    assert define in MUTANT_DEFINES and define in defines_for(KERNEL_DIR / moe_route.SOURCE)


def test_mutant_compiles_the_real_kernels_with_its_define():
    gpu_impls.load_plugin("tests/mutants.py")
    from tests.mutants import MOE_ROUTE_CUDA_MUTANTS

    impls = gpu_impls.impls()
    assert MOE_ROUTE_CUDA_MUTANTS == (("cuda:kp_moe_scatter_add",
                                       "mutant_kp_moe_scatter_add_atomic",
                                       moe_route.ATOMIC_MUTANT),)
    mutant, real = impls["cuda:mutant_kp_moe_scatter_add_atomic"], impls["cuda:kp_moe_scatter_add"]
    assert (mutant.op, mutant.contract.contracts) == (real.op, real.contract.contracts)
    assert mutant.deterministic and moe_route.ATOMIC_MUTANT in mutant.doc


def _defines() -> dict[str, int]:
    text = (KERNEL_DIR / moe_route.SOURCE).read_text()
    return {name: int(value) for name, value in re.findall(r"^#define (\w+) (\d+)", text, re.M)}


def test_wrapper_constants_are_the_kernels():
    d = _defines()
    assert moe_route.ROUTER_WARPS == d["KP_ROUTER_WARPS"]
    assert moe_route.ROUTER_THREADS == 32 * d["KP_ROUTER_WARPS"]
    assert (moe_route.MAX_K, moe_route.MAX_E) == (d["KP_ROUTER_MAX_K"], d["KP_ROUTER_MAX_E"])
    assert moe_route.DISPATCH_THREADS == 32 * d["KP_DISPATCH_WARPS"]
    assert moe_route.ROW_THREADS == d["KP_ROW_THREADS"] >= moe_route.MAX_K
    assert moe_route.INVERSE_THREADS == d["KP_INVERSE_THREADS"]
    assert moe_route.MAX_GROUPS == 32  # a lane per group: the warp


# --- geometry -------------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens", [1, 3, 4, 5, 7, 2048, 2049])
@pytest.mark.parametrize("experts", [8, 128, 512, 1024])
def test_router_warps_cover_every_token_with_its_keys(tokens, experts):
    """A warp per token, 4 a block; the dynamic shared memory holds each warp's E keys."""
    launch = _launch("kp_moe_router", _router(tokens, experts, 4))
    blocks = launch.grid[0]
    assert launch.block == (moe_route.ROUTER_THREADS, 1, 1) and launch.grid[1:] == (1, 1)
    assert (blocks - 1) * moe_route.ROUTER_WARPS < tokens <= blocks * moe_route.ROUTER_WARPS
    assert launch.shared_bytes == 4 * moe_route.ROUTER_WARPS * experts <= 16 * 1024


def test_dispatch_has_a_block_per_expert():
    for t, e, k in ((1, 128, 8), (2048, 128, 8), (2048, 512, 10), (1, 8, 2)):
        launch = _launch("kp_moe_dispatch", _dispatch(t, e, k))
        assert launch.grid == (e, 1, 1) and launch.block == (moe_route.DISPATCH_THREADS, 1, 1)


@pytest.mark.parametrize("dtype, vec", [("f32", 4), ("f16", 8), ("bf16", 8)])
@pytest.mark.parametrize("hidden", [1, 7, 64, 100, 2048, 2688])
def test_row_kernels_have_a_block_per_row_and_chunks_over_hidden(dtype, vec, hidden):
    """permute: a block per sorted slot (T k); unpermute and the scatter-add's combine: a block
    per token; the chunks of 16 bytes cover H (the last one partial where H is no multiple);
    the scatter-add's inverse a thread per slot."""
    for t, k in ((1, 8), (2048, 8), (7, 4)):
        rows = {"kp_moe_permute": t * k, "kp_moe_unpermute": t}
        for name, n in rows.items():
            launch = _launch(name, _rows(name[3:], t, k, hidden, dtype))
            assert launch.grid == (n, 1, 1) and launch.block == (moe_route.ROW_THREADS, 1, 1)
            assert launch.extra == {"vec": vec, "chunks": -(-hidden // vec)}
        both = _launch("kp_moe_scatter_add", _rows("moe_scatter_add", t, k, hidden, dtype))
        assert both["combine"].grid == (t, 1, 1)
        assert both["combine"].extra == {"vec": vec, "chunks": -(-hidden // vec)}
        blocks = both["inverse"].grid[0]
        assert both["inverse"].block == (moe_route.INVERSE_THREADS, 1, 1)
        assert (blocks - 1) * moe_route.INVERSE_THREADS < t * k <= blocks * 256


# --- contracts ------------------------------------------------------------------------------------

def _rejects(name: str, case: Case) -> ContractError:
    with pytest.raises(ContractError) as info:
        _launch(name, case)
    return info.value


def test_contract_limits():
    err = _rejects("kp_moe_router", _router(k=33))
    assert err.invariant == "top_k <= 32" and err.fix == "top_k <= 32, or torch:moe_router"
    assert str(err).startswith("cuda:kp_moe_router: contract invariant `top_k <= 32` broken "
                               "(top_k=33)")
    err = _rejects("kp_moe_router", _router(e=1056, k=8))
    assert err.invariant == "experts <= 1024" and "16 KiB" in str(err)
    err = _rejects("kp_moe_router", _router(e=128, groups=64, topk_group=4))
    assert err.invariant == "groups <= 32" and "DeepSeek-V3: 8" in err.fix
    err = _rejects("kp_moe_scatter_add", _rows("moe_scatter_add", k=33))
    assert (err.invariant, err.launch) == ("combine: top_k <= 32", "combine")
    assert err.fix == "top_k <= 32, or torch:moe_scatter_add"


def test_contracts_admit_the_models_and_the_limits():
    """Nemotron-3-Nano (E 128, k 6), Qwen3-30B-A3B (128, 8), Qwen3-Next (512, 10), DeepSeek-V3's
    group-limited routing (256, 8, 8 groups, 4 kept) and the limits themselves; the dispatch and
    row kernels at any size the i32 positions hold."""
    for e, k, groups, topk_group in ((128, 6, 1, 1), (128, 8, 1, 1), (512, 10, 1, 1),
                                     (256, 8, 8, 4), (1024, 32, 32, 32), (32, 32, 32, 1)):
        assert _launch("kp_moe_router", _router(2048, e, k, groups, topk_group=topk_group))
    assert _launch("kp_moe_dispatch", _dispatch(2 ** 27, 128, 8))
    for op in ("moe_permute", "moe_unpermute", "moe_scatter_add"):
        assert _launch(f"kp_{op}", _rows(op, 2 ** 27, 8, 8192))
    assert _launch("kp_moe_scatter_add", _rows("moe_scatter_add", k=32))


# --- the runs' arguments -----------------------------------------------------------------------

def _entries() -> dict[str, list[str]]:
    """{kernel name: its PTX parameter kinds (u64/u32/f32 ...)} of one BF16 instance each, from
    nvcc's PTX (`tests/ptx.py`)."""
    found = ptx.entries(moe_route.SOURCE, tuple((n, "bf16", ()) for n in KERNEL_NAMES))
    return {n: found[(n, "bf16", ())]["params"] for n in KERNEL_NAMES}


class _Array:
    """A stand-in device array that knows its tensor's name (and a device address)."""

    def __init__(self, name, ptr=256):
        self.name, self.data, self.filled = name, SimpleNamespace(ptr=ptr), None

    def fill(self, value):
        self.filled = value


def _recorded(name: str, case, monkeypatch, ptr=256, defines=()) -> list[dict]:
    """Run `name`'s run function on `case` with its launches recorded instead of made."""
    seen = []
    monkeypatch.setattr(moe_route, "kernel", lambda *a: a)
    monkeypatch.setattr(moe_route, "cuda_launch",
                        lambda k, grid, block, args, shared_bytes=0: seen.append(
                            dict(kernel=k, grid=grid, block=block, args=args,
                                 shared_bytes=shared_bytes)))
    workspaces = {}
    monkeypatch.setattr(moe_route, "_workspace", lambda label, count, dtype: workspaces.setdefault(
        label, _Array(f"workspace:{label}:{count}:{np.dtype(dtype).name}")))
    op, make = IMPLS[name]
    spec = get_op(op)
    inputs = {t.name: _Array(t.name, ptr) for t in spec.inputs}
    outputs = {t.name: _Array(t.name, ptr) for t in spec.outputs}
    launch = _impl(name).contract.check(name, case)
    make(defines)(launch, inputs, outputs, case)
    for s, lau in zip(seen, launch.values() if isinstance(launch, dict) else [launch]):
        assert (s["grid"], s["block"], s["shared_bytes"]) == (lau.grid, lau.block,
                                                              lau.shared_bytes)
    return seen


def _kinds(args) -> list[str]:
    return ["u64" if isinstance(a, _Array) else
            {np.int32: "u32", np.float32: "f32", np.int64: "u64"}[type(a)] for a in args]


def _names(args) -> list[str]:
    return [a.name if isinstance(a, _Array) else "NULL" for a in args
            if isinstance(a, (_Array, np.int64))]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_runs_pass_each_kernel_its_declared_arguments(monkeypatch):
    """Each run's arguments match its kernel's PTX parameters in number and kind (pointers,
    32-bit ints, f32), the tensors are the op's in the kernel's order, the scalars the case's
    dims, params and derived geometry, the instance the case's dtype."""
    entries = _entries()
    router = _router(5, 16, 4, groups=4, topk_group=2, norm_topk_prob=1,
                     routed_scaling_factor=2.5)
    (seen,) = _recorded("kp_moe_router", router, monkeypatch)
    assert seen["kernel"] == (moe_route.SOURCE, "kp_moe_router", "bf16", ())
    assert _kinds(seen["args"]) == entries["kp_moe_router"]
    assert _names(seen["args"]) == ["logits", "correction_bias", "ids", "weights"]
    assert [float(a) for a in seen["args"][4:]] == [5, 16, 4, 4, 2, 1, 1, 2.5,
                                                    np.float32(1e-20)]
    softmax = _router(3, 8, 2, scoring="softmax", norm_topk_prob=0)
    (seen,) = _recorded("kp_moe_router", softmax, monkeypatch)
    assert [float(a) for a in seen["args"][4:]] == [3, 8, 2, 1, 1, 0, 0, 1.0, 0.0]

    (seen,) = _recorded("kp_moe_dispatch", _dispatch(7, 16, 4), monkeypatch)
    assert seen["kernel"] == (moe_route.SOURCE, "kp_moe_dispatch", "f32", ())
    assert _kinds(seen["args"]) == entries["kp_moe_dispatch"]
    assert _names(seen["args"]) == ["ids", "counts", "offsets", "perm", "inv_perm"]
    assert [int(a) for a in seen["args"][5:]] == [28, 16]

    rows = {"kp_moe_permute": ["x", "perm", "x_sorted"],
            "kp_moe_unpermute": ["y_sorted", "weights", "inv_perm", "out"]}
    for name, tensors in rows.items():
        (seen,) = _recorded(name, _rows(name[3:], 7, 4, 100), monkeypatch)
        assert seen["kernel"] == (moe_route.SOURCE, name, "bf16", ())
        assert _kinds(seen["args"]) == entries[name]
        assert _names(seen["args"]) == tensors
        assert [int(a) for a in seen["args"][len(tensors):]] == [7, 4, 100, 13, 0]

    inverse, combine = _recorded("kp_moe_scatter_add", _rows("moe_scatter_add", 7, 4, 64),
                                 monkeypatch)
    assert inverse["kernel"] == (moe_route.SOURCE, "kp_moe_scatter_inverse", "bf16", ())
    assert _kinds(inverse["args"]) == entries["kp_moe_scatter_inverse"]
    assert _names(inverse["args"]) == ["perm", "y_sorted", "weights",
                                       "workspace:inv:28:int32", "NULL"]
    assert [int(a) for a in inverse["args"][5:]] == [28, 4, 64]
    assert combine["kernel"] == (moe_route.SOURCE, "kp_moe_scatter_add", "bf16", ())
    assert _kinds(combine["args"]) == entries["kp_moe_scatter_add"]
    assert _names(combine["args"]) == ["y_sorted", "weights", "workspace:inv:28:int32", "NULL",
                                       "out"]
    assert [int(a) for a in combine["args"][5:]] == [7, 4, 64, 8, 1]


def test_the_atomic_mutant_gets_a_zeroed_f32_accumulator(monkeypatch):
    """Only the mutant's define allocates the [T, H] f32 accumulator, zeroes it on every call
    (before its atomics) and passes it to both kernels, compiled with the define."""
    define = moe_route.ATOMIC_MUTANT
    case = _rows("moe_scatter_add", 7, 4, 64)
    inverse, combine = _recorded("kp_moe_scatter_add", case, monkeypatch, defines=(define,))
    acc = inverse["args"][4]
    assert acc.name == "workspace:acc:448:float32" and acc.filled == 0
    assert combine["args"][3] is acc
    assert inverse["kernel"][3] == combine["kernel"][3] == (define,)


def test_vectors_only_where_whole_and_aligned(monkeypatch):
    """The row kernels' 16-byte path only where H is a multiple of the vector and every row
    pointer is 16-byte aligned (else the guarded element path): the run's last argument."""
    def flag(case, ptr=256):
        return int(_recorded("kp_moe_unpermute", case, monkeypatch, ptr=ptr)[0]["args"][-1])

    assert flag(_rows("moe_unpermute", h=64, dtype="f32")) == 1
    assert flag(_rows("moe_unpermute", h=64, dtype="f32"), ptr=8) == 0
    assert flag(_rows("moe_unpermute", h=68, dtype="bf16")) == 0  # a multiple of 4, not of 8
    assert flag(_rows("moe_unpermute", h=68, dtype="f32")) == 1
