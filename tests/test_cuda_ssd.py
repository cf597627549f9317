"""`cuda:kp_ssd_chunked` without a GPU (`gpu_impls/cuda/ssd.py`): the wrapper's constants are
the kernel's, the shared memory it declares is the kernels' layouts and fits, the geometry at
Nemotron-3-Nano's heads and its grid cap, violating cases rejected naming their invariant, the
edge shapes admitted, the registration with its kernels and mutant defines, and the run function
passing each kernel its arguments in the order of its parameters (launches stubbed). The GPU
runs are tests/test_gpu_ssd.py and the gate."""

from __future__ import annotations

import re

import numpy as np
import pytest

import gpu_impls
from cases.model import Case
from gpu_impls.contract import ContractError
from gpu_impls.cuda import ssd as mod
from gpu_impls.cuda._module import KERNEL_DIR
from tests.ptx import source_params

IMPL = "cuda:kp_ssd_chunked"
NEMOTRON = {"heads": 64, "dim_p": 64, "groups": 8, "dim_n": 128}
TINY = {"heads": 4, "dim_p": 8, "groups": 2, "dim_n": 16}


def _source() -> str:
    return (KERNEL_DIR / mod.SOURCE).read_text()


def _case(dtype="bf16", params=None, **dims) -> Case:
    return Case.make("ssd_chunked", {"batch": 1, "tokens": 2048, **NEMOTRON, **dims}, dtype,
                     params=params or {})


def _launches(case: Case) -> dict:
    return gpu_impls.impls()[IMPL].contract.check(IMPL, case)


def test_wrapper_constants_are_the_kernels():
    defines = {n: int(v) for n, v in re.findall(r"^#define (\w+) (\d+)", _source(), re.M)}
    assert (mod.THREADS, mod.SB, mod.NP, mod.PT, mod.PO, mod.QMAX, mod.PAD) == (
        defines["KP_SSD_THREADS"], defines["KP_SSD_SB"], defines["KP_SSD_NP"],
        defines["KP_SSD_PT"], defines["KP_SSD_PO"], defines["KP_SSD_QMAX"],
        defines["KP_SSD_PAD"])
    # one thread per token of the largest chunk; chunks in whole sub-blocks
    assert mod.THREADS >= mod.QMAX and all(c % mod.SB == 0 and c <= mod.QMAX
                                           for c in mod.CHUNKS)


def test_shared_memory_is_the_layouts_and_fits():
    """cb: C and B rows [64][132]; state (static, under 48 KiB): x [64][36], B·w [64][132], dt,
    cs, w [256], the scan's 8 partials; out: C [64][132], Sᵀ [128][68], x and the tile [64][68],
    dt, cs [256], 8 partials. Two `out` blocks fit an SM's 228 KiB (the launch bound's 2)."""
    assert mod.CB_SHARED == 4 * 2 * 64 * 132 == 67584
    assert mod.STATE_STATIC_SHARED == 4 * (64 * 36 + 64 * 132 + 3 * 256 + 8) == 46112
    assert mod.STATE_STATIC_SHARED <= 48 * 1024
    assert mod.OUT_SHARED == 4 * (64 * 132 + 128 * 68 + 2 * 64 * 68 + 2 * 256 + 8) == 105504
    assert 2 * (mod.OUT_SHARED + 1024) <= 228 * 1024
    assert max(mod.CB_SHARED, mod.OUT_SHARED) <= mod.SHARED_OPT_IN_MAX
    text = _source()
    assert "__shared__ __align__(16) float x_s[SB * LDT]" in text
    assert "__shared__ float tdt[QMAX], tcs[QMAX], tw[QMAX], scratch[WARPS]" in text


@pytest.mark.parametrize("tokens, chunks", [(2048, 32), (16384, 256)])
def test_geometry_at_nemotron_heads(tokens, chunks):
    """Batch 1: cb over (T / 64 row blocks, 8 groups); state over (2 P tiles of 32, 64 heads) =
    128 blocks, one an SM; out over (T / 64 row blocks, 64 heads x 1 P tile). 256 threads each,
    the shared memory of the layouts."""
    launch = _launches(_case(tokens=tokens))
    assert list(launch) == ["cb", "state", "out"]
    rows = tokens // 64
    assert (launch["cb"].grid, launch["cb"].shared_bytes) == ((rows, 8, 1), mod.CB_SHARED)
    assert (launch["state"].grid, launch["state"].shared_bytes) == ((2, 64, 1), 0)
    assert (launch["out"].grid, launch["out"].shared_bytes) == ((rows, 64, 1), mod.OUT_SHARED)
    assert all(v.block == (256, 1, 1) for v in launch.values())
    assert launch["out"].extra == {"n_chunks": chunks, "row_blocks": rows, "p_pad": 64}


def test_partial_tiles_and_chunks_are_admitted():
    """P not a multiple of 32 or 64 (columns past P held at 0, never stored), N below 128 and
    odd, T not a multiple of the chunk or of 64, one token: every gate shape runs."""
    launch = _launches(Case.make("ssd_chunked", {"batch": 1, "tokens": 70, "heads": 6,
                                                 "dim_p": 3, "groups": 3, "dim_n": 5}, "f32"))
    assert launch["state"].grid == (1, 6, 1) and launch["out"].grid == (2, 6, 1)
    assert launch["out"].extra == {"n_chunks": 2, "row_blocks": 2, "p_pad": 4}
    launch = _launches(_case(tokens=259, params={"chunk": 256}, dim_p=130))
    assert launch["state"].grid == (5, 64, 1) and launch["out"].grid == (5, 64 * 3, 1)
    assert launch["out"].extra["n_chunks"] == 2 and launch["out"].extra["p_pad"] == 132
    assert _launches(_case(tokens=1, dim_n=128))["cb"].grid == (1, 8, 1)


def test_grid_y_capped_at_cudas_limit():
    """B·H = 65600 heads: grid.y capped at 65535 in every launch, the blocks stride over the
    rest."""
    launch = _launches(_case(tokens=64, batch=1025))
    assert launch["state"].grid == (2, 65535, 1)
    assert launch["out"].grid == (1, 65535, 1)
    assert launch["cb"].grid == (1, 8200, 1)


@pytest.mark.parametrize("values, invariant, fix", [
    ({"params": {"chunk": 32}}, "cb: chunk in (64, 128, 256)", "chunk = 64, 128, 256"),
    ({"dim_n": 136}, "cb: dim_n <= 128", "dim_n <= 128"),
])
def test_violating_cases_rejected_naming_the_invariant(values, invariant, fix):
    with pytest.raises(ContractError) as err:
        _launches(_case(**values))
    assert err.value.invariant == invariant and fix in err.value.fix
    assert err.value.launch == "cb"
    assert str(err.value).startswith(f"{IMPL}: contract invariant `{invariant}`")


def test_registered_with_its_kernels_and_mutant_defines():
    from gpu_impls.cuda.nvcc_check import MUTANT_DEFINES, defines_for, listed_kernels

    impl = gpu_impls.impls()[IMPL]
    assert (impl.op, impl.backend) == ("ssd_chunked", "cuda")
    assert dict(impl.launches) == mod.LAUNCHES
    assert {name for name, _ in listed_kernels()[mod.SOURCE]} == set(mod.KERNEL_OF.values())
    for define in ("KPARITY_MUTANT_GROUP_MODULO", "KPARITY_MUTANT_DROP_D_SKIP"):
        assert define in MUTANT_DEFINES
        assert define in defines_for(KERNEL_DIR / mod.SOURCE)
    gpu_impls.load_plugin("tests/mutants.py")
    for name in ("mutant_kp_ssd_chunked_group_modulo", "mutant_kp_ssd_chunked_drop_d_skip"):
        mutant = gpu_impls.impls()[f"cuda:{name}"]
        assert mutant.op == "ssd_chunked" and mutant.contract.contracts == mod.LAUNCHES


class _Device:
    """A stand-in device array: its size and a 256-byte aligned pointer."""

    def __init__(self, name: str, ptr: int = 256):
        self.name, self.size = name, 1
        self.data = type("Data", (), {"ptr": ptr})()


class _Launches:
    """Stands in for `kernel`, `launch` and the workspace: records what a run would launch."""

    def __init__(self, monkeypatch):
        self.kernels, self.calls = [], []
        self.ws = {"states": _Device("states"), "cb": _Device("cb")}
        monkeypatch.setattr(mod, "kernel", lambda *a: self.kernels.append(a) or a)
        monkeypatch.setattr(mod, "cuda_launch", lambda k, grid, block, args, **kw:
                            self.calls.append((k, grid, block, args, kw)))
        monkeypatch.setattr(mod, "workspace", lambda case: self.ws)


@pytest.mark.parametrize("defines", [(), ("KPARITY_MUTANT_DROP_D_SKIP",)])
@pytest.mark.parametrize("params", [{"gate": True, "dt_min": 0.01, "dt_max": 0.1},
                                    {"chunk": 128}])
def test_run_passes_each_kernel_its_signature(monkeypatch, defines, params):
    """cb, state, out in that order, each with the geometry its contract derived and the
    arguments in the order of its kernel's parameters, each by its name: an input, an output or
    a workspace array of that name; a dim, the chunk, n_chunks or the gate flag as int32; the dt
    clamp as float32 (no dt_max: +inf)."""
    stub = _Launches(monkeypatch)
    case = _case("f16", params, tokens=300, **TINY)
    launch = _launches(case)
    names = ("x", "dt_raw", "A_log", "dt_bias", "Bm", "Cm", "D", "z", "h0")
    inputs = {n: _Device(n) for n in names}
    outputs = {n: _Device(n) for n in ("y", "state")}
    assert mod._chunked(defines)(launch, inputs, outputs, case) is None
    assert [c[0][1] for c in stub.calls] == ["kp_ssd_cb", "kp_ssd_state", "kp_ssd_out"]
    tensors = {**inputs, **outputs, **stub.ws}
    numbers = {**case.dims, "chunk": case.params["chunk"], "n_chunks": -(-300 // case.params[
        "chunk"]), "gate": int(bool(case.params["gate"])),
        "dt_min": np.float32(case.params["dt_min"]),
        "dt_max": np.float32(case.params["dt_max"] or np.inf)}
    for (k, grid, block, args, kw), name in zip(stub.calls, ("cb", "state", "out")):
        assert k == (mod.SOURCE, mod.KERNEL_OF[name], "f16", defines)
        assert (grid, block, kw) == (launch[name].grid, launch[name].block,
                                     {"shared_bytes": launch[name].shared_bytes})
        params = source_params(mod.SOURCE, mod.KERNEL_OF[name])
        assert len(args) == len(params), name
        for param, arg in zip(params, args):
            if param in tensors:
                assert arg is tensors[param], (name, param)
            else:
                want = numbers[param]
                kind = np.float32 if param.startswith("dt_") else np.int32
                assert isinstance(arg, kind) and arg == want, (name, param, arg, want)


def test_run_refuses_a_misaligned_input(monkeypatch):
    """The 16-byte vector loads need 16-byte aligned x, B and C: a view off the boundary is
    refused by name before any launch."""
    stub = _Launches(monkeypatch)
    case = _case(tokens=64, **TINY)
    inputs = {n: _Device(n) for n in ("x", "dt_raw", "A_log", "dt_bias", "Bm", "Cm", "D", "z",
                                      "h0")}
    inputs["Cm"] = _Device("Cm", ptr=256 + 2)
    with pytest.raises(ValueError, match="Cm is not 16-byte aligned"):
        mod._chunked()(_launches(case), inputs, {"y": _Device("y"), "state": _Device("s")}, case)
    assert stub.calls == []
