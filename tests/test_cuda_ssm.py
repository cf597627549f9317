"""The CUDA Mamba-2 impls without a GPU (`gpu_impls/cuda/ssm.py`): registered for their ops with
an instance per N / 32 (the step) and per width (the conv) and their mutant defines; the launch
geometry the wrappers derive is the kernels' (constants of the .cu files) and covers every
element; the contracts reject what the kernels cannot do, naming the limit and the fix; each
run passes the arguments its kernel declares, in order (from nvcc's PTX). The violating cases
of every invariant are also tests/test_contracts.py's; the GPU runs are tests/test_gpu_ssm.py and
the gate."""

from __future__ import annotations

import functools
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

import gpu_impls
from cases.model import Case, make_inputs
from gpu_impls.contract import ContractError
from gpu_impls.cuda import ssm
from gpu_impls.cuda._module import KERNEL_DIR, MAKERS
from oracle.spec import get_op
from tests import ptx

NEMOTRON = {"heads": 64, "dim_p": 64, "groups": 8, "dim_n": 128}
IMPLS = {"kp_ssm_step": ("ssm_step", ssm.SSM_CONTRACT, ssm._ssm_step),
         "kp_conv1d_causal_step": ("conv1d_causal_step", ssm.CONV_STEP_CONTRACT, ssm._conv_step),
         "kp_conv1d_causal": ("conv1d_causal", ssm.CONV_CONTRACT, ssm._conv)}
DEFINES = {"ssm_step.cu": {"KPARITY_MUTANT_SOFTPLUS_TWICE"},
           "conv1d.cu": {"KPARITY_MUTANT_CONV_DOUBLE_SHIFT",
                         "KPARITY_MUTANT_CONV_STATE_SKIPS_LAST"}}


def _defines(source: str) -> dict[str, int]:
    text = (KERNEL_DIR / source).read_text()
    return {name: int(value) for name, value in re.findall(r"^#define (\w+) (\d+)", text, re.M)}


def _launch(name: str, case: Case):
    impl = gpu_impls.impls()[f"cuda:{name}"]
    return impl.contract.check(impl.id, case)


def _step(batch=1, dtype="bf16", layout="hpn", **dims) -> Case:
    return Case.make("ssm_step", {**NEMOTRON, "batch": batch, **dims}, dtype,
                     params={"layout": layout})


def _conv(op: str, dtype="bf16", **dims) -> Case:
    return Case.make(op, {"batch": 1, "channels": 6144, "width": 4, **dims}, dtype)


# --- registration --------------------------------------------------------------------------------

def test_registered_with_their_kernels_and_mutant_defines():
    from gpu_impls.cuda.nvcc_check import MUTANT_DEFINES, defines_for, listed_kernels

    impls = gpu_impls.impls()
    for name, (op, contract, _) in IMPLS.items():
        impl = impls[f"cuda:{name}"]
        assert (impl.op, impl.backend, impl.contract) == (op, "cuda", contract)
        assert impl.id in MAKERS  # rebuildable with defines (the mutants)
    listed = listed_kernels()
    assert {n: a for n, a in listed[ssm.SSM_SOURCE]} == {
        n: tuple((k,) for k in range(1, 9)) for n in ("kp_ssm_step_hpn", "kp_ssm_step_hnp")}
    assert {n: a for n, a in listed[ssm.CONV_SOURCE]} == {
        n: ((2,), (3,), (4,)) for n in ("kp_conv1d_causal_step", "kp_conv1d_causal")}
    for source, defines in DEFINES.items():
        assert defines <= set(MUTANT_DEFINES) and defines <= set(defines_for(KERNEL_DIR / source))


def test_mutants_compile_the_real_kernels_with_their_defines():
    gpu_impls.load_plugin("tests/mutants.py")
    from tests.mutants import SSM_CUDA_MUTANTS

    impls = gpu_impls.impls()
    assert {define for _, _, define in SSM_CUDA_MUTANTS} == set().union(*DEFINES.values())
    for impl_id, name, define in SSM_CUDA_MUTANTS:
        mutant = impls[f"cuda:{name}"]
        assert (mutant.op, mutant.contract) == (impls[impl_id].op, impls[impl_id].contract)
        assert define in mutant.doc


def test_wrapper_constants_are_the_kernels():
    step, conv = _defines(ssm.SSM_SOURCE), _defines(ssm.CONV_SOURCE)
    assert ssm.SSM_THREADS == 32 * step["KP_SSM_WARPS"]
    assert ssm.SSM_SLICE == step["KP_SSM_WARPS"] * step["KP_SSM_ROWS"] == step["KP_SSM_COLS"]
    assert (ssm.CONV_THREADS, ssm.CONV_MAX_W) == (conv["KP_CONV_THREADS"], conv["KP_CONV_MAX_W"])
    assert max(ssm.CONV_STEP_THREADS) == conv["KP_CONV_STEP_MAX_THREADS"]


@pytest.mark.parametrize("batch, threads", [(1, 64), (42, 64), (43, 256), (64, 256)])
def test_the_conv_step_block_widens_once_the_work_fills_the_gpu(batch, threads):
    """64 threads a block while B x 768 channel vectors (Nemotron-3-Nano's 6144 bf16) is under
    32768 threads of work, 256 from there (the profile in gpu_impls/cuda/ssm.py)."""
    step = _launch("kp_conv1d_causal_step", _conv("conv1d_causal_step", "bf16", batch=batch,
                                                  channels=6144))
    assert step.block == (threads, 1, 1)
    assert (step.grid[0] - 1) * threads < batch * 768 <= step.grid[0] * threads


# --- geometry -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dim_n", range(32, 257, 32))
@pytest.mark.parametrize("dim_p", [4, 15, 16, 17, 64, 132])
@pytest.mark.parametrize("layout", ["hpn", "hnp"])
def test_step_blocks_cover_every_p_with_a_compiled_instance(dim_n, dim_p, layout):
    if layout == "hnp" and dim_p % 4:
        pytest.skip("hnp needs P % 4 == 0 (test_contract_limits)")
    launch = _launch("kp_ssm_step", _step(3, layout=layout, heads=4, groups=2, dim_p=dim_p,
                                          dim_n=dim_n))
    slices = launch.extra["slices"]
    assert launch.grid == (3 * 4 * slices, 1, 1) and launch.block == (ssm.SSM_THREADS, 1, 1)
    assert (slices - 1) * ssm.SSM_SLICE < dim_p <= slices * ssm.SSM_SLICE
    assert (launch.extra["npl"],) in dict(
        (n, a) for s, n, a in ssm.KERNELS)[ssm.SSM_KERNELS[layout]]
    assert launch.extra["npl"] * 32 == dim_n


def test_step_spreads_a_batch_of_one_over_the_sms():
    """Nemotron-3-Nano at batch 1: 64 heads x 4 blocks of 16 p (2 MiB of state over 256
    blocks); batch 64: 16384."""
    assert _launch("kp_ssm_step", _step(1)).grid == (256, 1, 1)
    assert _launch("kp_ssm_step", _step(64, layout="hnp")).grid == (16384, 1, 1)


@pytest.mark.parametrize("dtype, vec", [("f32", 4), ("f16", 8), ("bf16", 8)])
@pytest.mark.parametrize("channels", [1, 5, 37, 64, 6144, 6145])
def test_conv_threads_cover_every_channel_vector(dtype, vec, channels):
    """A thread per 16 bytes of channels (the last vector partial where D is no multiple);
    the step a thread per (batch row, vector), the prefill blocks of spans x vectors."""
    chunks = -(-channels // vec)
    step = _launch("kp_conv1d_causal_step", _conv("conv1d_causal_step", dtype, batch=3,
                                                  channels=channels))
    assert (step.extra["vec"], step.extra["chunks"]) == (vec, chunks)
    t = step.block[0]
    assert (step.grid[0] - 1) * t < 3 * chunks <= step.grid[0] * t
    for tokens, spans in ((1, 1), (8, 1), (9, 2), (33, 5), (2048, 256)):
        pre = _launch("kp_conv1d_causal", _conv("conv1d_causal", dtype, batch=3, tokens=tokens,
                                                channels=channels))
        blocks = -(-chunks // ssm.CONV_THREADS)
        assert (pre.extra["spans"], pre.extra["chunk_blocks"]) == (spans, blocks)
        assert pre.grid == (3 * spans * blocks, 1, 1) and pre.block == (ssm.CONV_THREADS, 1, 1)


# --- contracts ------------------------------------------------------------------------------------

def _rejects(name: str, case: Case) -> ContractError:
    with pytest.raises(ContractError) as info:
        _launch(name, case)
    return info.value


def test_contract_limits():
    err = _rejects("kp_ssm_step", _step(dim_n=80))
    assert err.invariant == "dim_n % 32 == 0" and err.fix == "dim_n = 64 or 96"
    assert str(err).startswith("cuda:kp_ssm_step: contract invariant `dim_n % 32 == 0` broken "
                               "(dim_n=80)")
    assert _rejects("kp_ssm_step", _step(dim_n=16)).fix == "dim_n = 32"
    assert _rejects("kp_ssm_step", _step(dim_n=288)).invariant == "dim_n <= 256"
    err = _rejects("kp_ssm_step", _step(layout="hnp", dim_p=6))
    assert err.invariant == "layout == 'hpn' or dim_p % 4 == 0"
    assert err.fix == "dim_p a multiple of 4 (e.g. 4), or layout='hpn'"
    assert _launch("kp_ssm_step", _step(layout="hpn", dim_p=6)) is not None  # rows: any P
    for name, op in (("kp_conv1d_causal_step", "conv1d_causal_step"),
                     ("kp_conv1d_causal", "conv1d_causal")):
        extra = {"tokens": 5} if op == "conv1d_causal" else {}
        err = _rejects(name, _conv(op, width=5, **extra))
        assert err.invariant == "width <= 4" and "torch:conv1d_causal" in err.fix
        for width in (2, 3, 4):
            assert _launch(name, _conv(op, width=width, **extra)) is not None


# --- the runs' arguments -----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _entries() -> dict[str, dict]:
    """{kernel name: {"maxntid": int, "params": [u64/u32/f32 ...]}} of one BF16 instance each,
    from nvcc's PTX (tests/ptx.py: one small unit per source, cached by content)."""
    out = {}
    for source, names in ((ssm.SSM_SOURCE, tuple(ssm.SSM_KERNELS.values())),
                          (ssm.CONV_SOURCE, ("kp_conv1d_causal_step", "kp_conv1d_causal"))):
        got = ptx.entries(source, tuple((n, "bf16", (4,)) for n in names))
        out.update({n: got[(n, "bf16", (4,))] for n in names})
    return out


class _Array:
    """A stand-in device array that knows its tensor's name (and a device address)."""

    def __init__(self, name, ptr=256):
        self.name, self.data = name, SimpleNamespace(ptr=ptr)


def _recorded(name: str, case, monkeypatch, ptr=256) -> dict:
    """Run `name`'s run function on `case` with the launch recorded instead of made."""
    seen = {}
    monkeypatch.setattr(ssm, "kernel", lambda *a: a)
    monkeypatch.setattr(ssm, "cuda_launch", lambda k, grid, block, args: seen.update(
        kernel=k, grid=grid, block=block, args=args))
    op, contract, make = IMPLS[name]
    spec = get_op(op)
    inputs = {t.name: _Array(t.name, ptr) for t in spec.inputs}
    outputs = {t.name: _Array(t.name, ptr) for t in spec.outputs}
    launch = contract.check(name, case)
    make()(launch, inputs, outputs, case)
    assert (seen["grid"], seen["block"]) == (launch.grid, launch.block)
    return seen


def _kinds(args) -> list[str]:
    return ["u64" if isinstance(a, _Array) else {np.int32: "u32", np.float32: "f32"}[type(a)]
            for a in args]


SSM_TENSORS = ["x", "dt_raw", "A_log", "dt_bias", "Bm", "Cm", "D", "z", "state_in", "state_out",
               "y"]
CONV_TENSORS = {"kp_conv1d_causal_step": ["x", "weight", "bias", "conv_state_in",
                                          "conv_state_out", "y"],
                "kp_conv1d_causal": ["x", "weight", "bias", "conv_state_in", "conv_state", "y"]}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_runs_pass_each_kernel_its_declared_arguments(monkeypatch):
    """Each run's arguments match its kernel's PTX parameters in number and kind (pointers,
    32-bit ints, f32), the tensors are the op's in the kernel's order, the ints the case's dims,
    params and derived geometry, the instance the case's dtype and N / 32 or width; the block
    is the kernel's launch bound (the conv step's: the larger of its two blocks)."""
    entries = _entries()
    for layout in ("hpn", "hnp"):
        case = _step(2, layout=layout, dim_p=20, dim_n=128).replace(
            gate=True, dt_min=0.01, dt_max=0.5)
        seen = _recorded("kp_ssm_step", case, monkeypatch)
        kernel = ssm.SSM_KERNELS[layout]
        assert seen["kernel"] == (ssm.SSM_SOURCE, kernel, "bf16", (), (4,))
        assert _kinds(seen["args"]) == entries[kernel]["params"]
        assert [a.name for a in seen["args"] if isinstance(a, _Array)] == SSM_TENSORS
        assert [float(a) for a in seen["args"][11:]] == [64, 20, 8, 2, 1,
                                                         np.float32(0.01), np.float32(0.5)]
        assert seen["block"][0] == entries[kernel]["maxntid"]
    unclamped = _recorded("kp_ssm_step", _step(), monkeypatch)["args"]
    assert (float(unclamped[-2]), float(unclamped[-1]), int(unclamped[-3])) == (0.0, np.inf, 0)
    step = _conv("conv1d_causal_step", batch=3, channels=6144, width=3).replace(silu=False)
    pre = _conv("conv1d_causal", batch=2, tokens=70, channels=37).replace(bias=False)
    for name, case, ints in (("kp_conv1d_causal_step", step, [3, 6144, 768, 1, 0, 1]),
                             ("kp_conv1d_causal", pre, [70, 37, 5, 1, 9, 8, 0, 1, 0])):
        seen = _recorded(name, case, monkeypatch)
        assert seen["kernel"] == (ssm.CONV_SOURCE, name, "bf16", (), (case.dims["width"],))
        assert _kinds(seen["args"]) == entries[name]["params"]
        assert [a.name for a in seen["args"] if isinstance(a, _Array)] == CONV_TENSORS[name]
        assert [int(a) for a in seen["args"][6:]] == ints
        if name == "kp_conv1d_causal_step":  # a block of 64 under a launch bound of 256
            assert seen["block"][0] in ssm.CONV_STEP_THREADS
            assert max(ssm.CONV_STEP_THREADS) == entries[name]["maxntid"]
        else:
            assert seen["block"][0] == entries[name]["maxntid"]


def test_conv_vectors_only_where_whole_and_aligned(monkeypatch):
    """The kernels' 16-byte path only where D is a multiple of the vector and every pointer is
    16-byte aligned (else the guarded element path): the run's last argument."""
    case = _conv("conv1d_causal_step", "f32", channels=64)
    assert int(_recorded("kp_conv1d_causal_step", case, monkeypatch)["args"][-1]) == 1
    assert int(_recorded("kp_conv1d_causal_step", case, monkeypatch, ptr=8)["args"][-1]) == 0
    odd = _conv("conv1d_causal_step", "bf16", channels=68)  # a multiple of 4, not of 8
    assert int(_recorded("kp_conv1d_causal_step", odd, monkeypatch)["args"][-1]) == 0


def test_step_refuses_an_unaligned_state(monkeypatch):
    with pytest.raises(ValueError, match="16-byte boundary"):
        _recorded("kp_ssm_step", _step(), monkeypatch, ptr=8)


# --- the conv state under FTZ (the CUDA backend's oracle semantics) -----------------------------

@pytest.mark.parametrize("op", ["conv1d_causal", "conv1d_causal_step"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_conv_state_under_ftz_is_the_stored_bits(op, dtype):
    """On a flushing backend (CuPy: -ftz) the runner asks the oracle for `ftz=1`, where the
    kernel reads f32 subnormals as 0 in arithmetic. The state out is a copy, not arithmetic: its
    expected value is the stored bits, subnormals and signs included (the kernels copy raw
    bits), as without FTZ. `tiny` draws subnormals in f32 and bf16."""
    dims = {"batch": 2, "channels": 37, "width": 4, **({"tokens": 5} if op == "conv1d_causal"
                                                      else {})}
    case = Case.make(op, dims, dtype, "tiny", params={"initial_state": "given", "ftz": 1})
    inputs = make_inputs(case)
    x = inputs["x"] if op == "conv1d_causal" else inputs["x"][:, None]
    stored = np.concatenate([inputs["conv_state_in"], x], axis=1)[:, x.shape[1]:]
    name = "conv_state" if op == "conv1d_causal" else "conv_state_out"
    assert (np.abs(stored.astype(np.float64)) < 2.0 ** -126).any()  # subnormals to keep
    exact = case.spec.oracle(inputs, case)[name]
    got = np.asarray(exact).astype(stored.dtype)
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), stored.view(f"u{got.itemsize}"))
