"""The FP4 CUDA impls without a GPU (issue 31, `gpu_impls/cuda/fp4.py`): registered with their
kernels' instances and the quantizer's mutant defines; the wrapper constants are the kernels';
the launch geometry covers every word, chunk and block; the contracts reject what the kernels
cannot do, naming the limit and the fix; each run passes the arguments its kernel declares, in
order (from nvcc's PTX), and refuses misaligned arrays. The GPU runs are tests/test_gpu_fp4.py
and the gate."""

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
from gpu_impls.cuda import fp4
from gpu_impls.cuda._module import KERNEL_DIR, MAKERS
from oracle.spec import get_op

IMPLS = {"kp_fp4_dequantize": ("fp4_dequantize", fp4.DEQUANTIZE_CONTRACT, fp4._dequantize),
         "kp_fp4_gemv": ("fp4_gemv", fp4.GEMV_CONTRACT, fp4._gemv),
         "kp_fp4_quantize": ("fp4_quantize", fp4.QUANTIZE_CONTRACT, fp4._quantize)}
RULES = {"nvfp4": "exact", "mxfp4": "ocp"}
MUTANT_DEFINES = {"KPARITY_MUTANT_FP4_TIES_AWAY", "KPARITY_MUTANT_FP4_UNSCALED_BLOCK_MAX"}


def _defines(source: str) -> dict[str, int]:
    text = (KERNEL_DIR / source).read_text()
    return {name: int(value) for name, value in re.findall(r"^#define (\w+) (\d+)", text, re.M)}


def _case(op: str, dims: dict, dtype="bf16", fmt="nvfp4", rule=None) -> Case:
    return Case.make(op, dims, dtype, params={"format": fmt, "scale_rule": rule or RULES[fmt]})


def _launch(name: str, case: Case):
    impl = gpu_impls.impls()[f"cuda:{name}"]
    return impl.contract.check(impl.id, case)


def _rejects(name: str, case: Case) -> ContractError:
    with pytest.raises(ContractError) as info:
        _launch(name, case)
    return info.value


# --- registration --------------------------------------------------------------------------------

def test_registered_with_their_kernels_and_mutant_defines():
    from gpu_impls.cuda.nvcc_check import MUTANT_DEFINES as ALL_DEFINES, defines_for, \
        listed_kernels

    impls = gpu_impls.impls()
    for name, (op, contract, _) in IMPLS.items():
        impl = impls[f"cuda:{name}"]
        assert (impl.op, impl.backend, impl.contract) == (op, "cuda", contract)
        assert impl.id in MAKERS  # rebuildable with defines (the mutants)
    listed = listed_kernels()
    assert dict(listed[fp4.SOURCE]) == {"kp_fp4_dequantize": ((16,), (32,)),
                                        "kp_fp4_gemv": ((16, 1), (16, 4), (32, 1), (32, 4))}
    assert dict(listed[fp4.QUANTIZE_SOURCE]) == {"kp_fp4_amax": ((),),
                                                 "kp_fp4_quantize": ((0,), (1,), (2,))}
    assert MUTANT_DEFINES <= set(ALL_DEFINES)
    assert set(defines_for(KERNEL_DIR / fp4.QUANTIZE_SOURCE)) == MUTANT_DEFINES
    assert not set(defines_for(KERNEL_DIR / fp4.SOURCE))  # the mutants recompile the quantizer only


def test_mutants_compile_the_quantizer_with_their_defines():
    gpu_impls.load_plugin("tests/mutants.py")
    from tests.mutants import FP4_CUDA_MUTANTS

    impls = gpu_impls.impls()
    assert {define for _, _, define in FP4_CUDA_MUTANTS} == MUTANT_DEFINES
    for impl_id, name, define in FP4_CUDA_MUTANTS:
        mutant = impls[f"cuda:{name}"]
        assert impl_id == "cuda:kp_fp4_quantize"
        assert (mutant.op, mutant.contract) == (impls[impl_id].op, impls[impl_id].contract)
        assert define in mutant.doc


def test_wrapper_constants_are_the_kernels():
    main, quantize = _defines(fp4.SOURCE), _defines(fp4.QUANTIZE_SOURCE)
    assert (fp4.DQ_THREADS, fp4.GEMV_BLOCK, fp4.GEMV_ROWS) == (
        main["KPF_DQ_THREADS"], main["KPF_BLOCK"], main["KPF_ROWS"])
    assert (fp4.AMAX_THREADS, fp4.Q_THREADS) == (quantize["KPF_AMAX_THREADS"],
                                                 quantize["KPF_Q_THREADS"])


# --- geometry -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("rows, cols", [(1, 32), (3, 64), (7, 96), (2048, 2048)])
def test_dequantize_and_quantize_threads_cover_every_word_and_block(fmt, rows, cols):
    """A dequantize thread per word of 8 codes, a quantize thread per block; the amax kernel's
    grid-stride threads over the 16-byte vectors of x."""
    block = fp4.BLOCK[fmt]
    dq = _launch("kp_fp4_dequantize", _case("fp4_dequantize", {"rows": rows, "cols": cols},
                                            fmt=fmt))
    words = rows * cols // 8
    assert dq.extra["words"] == words and dq.block == (fp4.DQ_THREADS, 1, 1)
    assert (dq.grid[0] - 1) * fp4.DQ_THREADS < words <= dq.grid[0] * fp4.DQ_THREADS
    for dtype, size in (("f32", 4), ("bf16", 2)):
        q = _launch("kp_fp4_quantize", _case("fp4_quantize", {"rows": rows, "cols": cols},
                                             dtype, fmt))
        blocks = rows * cols // block
        assert q.extra["blocks"] == blocks and q.block == (fp4.Q_THREADS, 1, 1)
        assert (q.grid[0] - 1) * fp4.Q_THREADS < blocks <= q.grid[0] * fp4.Q_THREADS
        assert q.extra["vectors"] * 16 == rows * cols * size
        assert 1 <= q.extra["amax_blocks"] <= fp4.AMAX_MAX_BLOCKS


@pytest.mark.parametrize("m, out, k, warps, maxm", [(1, 8, 64, 1, 1), (3, 32, 256, 1, 4),
                                                    (4, 2048, 2048, 1, 4),
                                                    (1, 2880, 2880 * 4 // 32 * 32, 2, 1),
                                                    (2, 5, 32 * 32 * 8 * 4 + 32, 4, 4)])
def test_gemv_blocks_cover_every_row_and_chunk(m, out, k, warps, maxm):
    """4 rows a block, enough warps (1..4) that a lane has at most 8 chunks a row, the MAXM 1
    instance for one row of x and the MAXM 4 one for 2..4."""
    for fmt in ("nvfp4", "mxfp4"):
        launch = _launch("kp_fp4_gemv", _case("fp4_gemv", {"m": m, "out": out, "in": k},
                                              fmt=fmt))
        assert launch.extra == {"warps": warps, "maxm": maxm}
        assert launch.block == (32 * warps, 1, 1)
        assert (launch.grid[0] - 1) * fp4.GEMV_ROWS < out <= launch.grid[0] * fp4.GEMV_ROWS
        chunks = k // fp4.CHUNK_CODES
        assert -(-chunks // (32 * warps)) <= fp4.GEMV_STEPS or warps == 4


# --- contracts ------------------------------------------------------------------------------------

def test_gemv_contract_limits():
    err = _rejects("kp_fp4_gemv", _case("fp4_gemv", {"m": 1, "out": 8, "in": 48}))
    assert err.invariant == "in % 32 == 0"
    assert err.fix == "in = 32 or 64, or use torch:fp4_dequant_linear"
    assert str(err).startswith("cuda:kp_fp4_gemv: contract invariant `in % 32 == 0` broken "
                               "(in=48)")
    err = _rejects("kp_fp4_gemv", _case("fp4_gemv", {"m": 5, "out": 8, "in": 64}, fmt="mxfp4"))
    assert err.invariant == "m <= 4" and "torch:fp4_dequant_linear" in err.fix
    for fmt in ("nvfp4", "mxfp4"):
        for m in (1, 2, 4):
            assert _launch("kp_fp4_gemv", _case("fp4_gemv", {"m": m, "out": 3, "in": 32},
                                                fmt=fmt)) is not None


def test_dequantize_and_quantize_contract_limits():
    err = _rejects("kp_fp4_dequantize", _case("fp4_dequantize", {"rows": 2, "cols": 40}))
    assert err.invariant == "cols % block == 0" and err.fix == "cols = 32 or 48"
    assert _rejects("kp_fp4_dequantize", _case("fp4_dequantize", {"rows": 2, "cols": 48},
                                               fmt="mxfp4")).fix == "cols = 32 or 64"
    assert _launch("kp_fp4_dequantize", _case("fp4_dequantize", {"rows": 2, "cols": 48}))
    err = _rejects("kp_fp4_quantize", _case("fp4_quantize", {"rows": 2, "cols": 64},
                                            rule="mlx"))
    assert err.invariant == "scale_rule in ('exact', 'ocp', 'ceil')"
    assert err.fix == "scale_rule = exact, or mlx:quantize_nvfp4 for the mlx rule"
    err = _rejects("kp_fp4_quantize", _case("fp4_quantize", {"rows": 2, "cols": 64},
                                            fmt="mxfp4", rule="mlx"))
    assert err.fix == "scale_rule = ocp or ceil, or mlx:quantize_mxfp4 for the mlx rule"
    for fmt, rule in (("nvfp4", "exact"), ("mxfp4", "ocp"), ("mxfp4", "ceil")):
        assert _launch("kp_fp4_quantize", _case("fp4_quantize", {"rows": 2, "cols": 64}, "f16",
                                                fmt, rule)) is not None


# --- the runs' arguments -----------------------------------------------------------------------

INSTANCES = {fp4.SOURCE: (("kp_fp4_dequantize", (16,)), ("kp_fp4_gemv", (32, 4))),
             fp4.QUANTIZE_SOURCE: (("kp_fp4_amax", ()), ("kp_fp4_quantize", (1,)))}


def _entries() -> dict[str, dict]:
    """{kernel name: {"maxntid": int, "params": [u64/u32/f32 ...]}} of one BF16 instance each,
    from nvcc's PTX (`tests/ptx.py`)."""
    out = {}
    for source, instances in INSTANCES.items():
        found = ptx.entries(source, tuple((n, "bf16", a) for n, a in instances))
        out.update({n: found[(n, "bf16", a)] for n, a in instances})
    return out


class _Array:
    """A stand-in device array that knows its tensor's name (and a device address)."""

    def __init__(self, name, ptr=256):
        self.name, self.data = name, SimpleNamespace(ptr=ptr)


def _recorded(name: str, case, monkeypatch, ptrs: dict | None = None) -> list[dict]:
    """Run `name`'s run function on `case` with the launches recorded instead of made;
    `ptrs`: device addresses by tensor name (default 256)."""
    seen = []
    monkeypatch.setattr(fp4, "kernel", lambda *a: a)
    monkeypatch.setattr(fp4, "cuda_launch", lambda k, grid, block, args: seen.append(
        {"kernel": k, "grid": grid, "block": block, "args": args}))
    monkeypatch.setattr(fp4, "_amax_buffer", lambda: _Array("amax"))
    op, contract, make = IMPLS[name]
    spec = get_op(op)
    ptrs = ptrs or {}
    inputs = {t.name: _Array(t.name, ptrs.get(t.name, 256)) for t in spec.inputs}
    outputs = {t.name: _Array(t.name, ptrs.get(t.name, 256)) for t in spec.outputs}
    launch = contract.check(name, case)
    make()(launch, inputs, outputs, case)
    assert (seen[-1]["grid"], seen[-1]["block"]) == (launch.grid, launch.block)
    return seen


def _kinds(args) -> list[str]:
    return ["u64" if isinstance(a, _Array) else {np.int32: "u32", np.int64: "u64",
                                                 np.float32: "f32"}[type(a)] for a in args]


def _check(launch: dict, kernel: str, tensors: list[str], entries: dict):
    assert _kinds(launch["args"]) == entries[kernel]["params"]
    assert [a.name for a in launch["args"] if isinstance(a, _Array)] == tensors
    assert launch["block"][0] <= entries[kernel]["maxntid"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_runs_pass_each_kernel_its_declared_arguments(monkeypatch):
    """Each run's arguments match its kernel's PTX parameters in number and kind, the tensors
    are the op's in the kernel's order, the ints the case's dims and derived sizes, the instance
    the case's dtype and format (and MAXM, rule); the block within the kernel's launch bound."""
    entries = _entries()
    dq = _recorded("kp_fp4_dequantize", _case("fp4_dequantize", {"rows": 3, "cols": 64}),
                   monkeypatch)
    assert len(dq) == 1 and dq[0]["kernel"] == (fp4.SOURCE, "kp_fp4_dequantize", "bf16", (),
                                                (16,))
    _check(dq[0], "kp_fp4_dequantize", ["codes", "scales", "tensor_scale", "x_hat"], entries)
    assert int(dq[0]["args"][-1]) == 3 * 64 // 8

    gemv = _recorded("kp_fp4_gemv", _case("fp4_gemv", {"m": 3, "out": 10, "in": 96},
                                          fmt="mxfp4"), monkeypatch)
    assert gemv[0]["kernel"] == (fp4.SOURCE, "kp_fp4_gemv", "bf16", (), (32, 4))
    _check(gemv[0], "kp_fp4_gemv", ["codes", "scales", "tensor_scale", "x", "y"], entries)
    assert [int(a) for a in gemv[0]["args"][5:]] == [3, 10, 96]
    one = _recorded("kp_fp4_gemv", _case("fp4_gemv", {"m": 1, "out": 10, "in": 96}),
                    monkeypatch)
    assert one[0]["kernel"][-1] == (16, 1)

    nv = _recorded("kp_fp4_quantize", _case("fp4_quantize", {"rows": 3, "cols": 64}),
                   monkeypatch)
    assert [launch["kernel"] for launch in nv] == [
        (fp4.QUANTIZE_SOURCE, "kp_fp4_amax", "bf16", ()),
        (fp4.QUANTIZE_SOURCE, "kp_fp4_quantize", "bf16", (), (0,))]
    _check(nv[0], "kp_fp4_amax", ["x", "amax"], entries)
    assert int(nv[0]["args"][-1]) == 3 * 64 * 2 // 16
    _check(nv[1], "kp_fp4_quantize", ["x", "amax", "codes", "scales", "tensor_scale"], entries)
    assert int(nv[1]["args"][-1]) == 3 * 64 // 16
    for rule, rule_id in (("ocp", 1), ("ceil", 2)):  # MXFP4: no tensor amax
        mx = _recorded("kp_fp4_quantize", _case("fp4_quantize", {"rows": 3, "cols": 64},
                                                fmt="mxfp4", rule=rule), monkeypatch)
        assert [launch["kernel"][-1] for launch in mx] == [(rule_id,)]
        assert int(mx[0]["args"][-1]) == 3 * 64 // 32


@pytest.mark.parametrize("name, op_dims, tensor, ptr", [
    ("kp_fp4_gemv", {"m": 1, "out": 8, "in": 64}, "codes", 8),
    ("kp_fp4_gemv", {"m": 1, "out": 8, "in": 64}, "x", 264),
    ("kp_fp4_gemv", {"m": 1, "out": 8, "in": 64}, "scales", 257),
    ("kp_fp4_dequantize", {"rows": 2, "cols": 64}, "codes", 258),
    ("kp_fp4_dequantize", {"rows": 2, "cols": 64}, "x_hat", 264),
    ("kp_fp4_quantize", {"rows": 2, "cols": 64}, "x", 8),
    ("kp_fp4_quantize", {"rows": 2, "cols": 64}, "codes", 260)])
def test_runs_refuse_misaligned_arrays(monkeypatch, name, op_dims, tensor, ptr):
    """The kernels' vector loads and stores need aligned arrays: a misaligned one is refused
    before any launch, naming the array and the fix."""
    case = _case(IMPLS[name][0], op_dims)
    with pytest.raises(ValueError, match=rf"{tensor} must start on a \d+-byte boundary"):
        _recorded(name, case, monkeypatch, ptrs={tensor: ptr})
