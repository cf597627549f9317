"""Every .cu source compiles for sm_90 with nvcc, for every dtype and mutant define, before a GPU
machine ever sees it (skips where nvcc is absent). Compiles go through `nvcc_check.compile_unit`,
whose successes are cached by content (unchanged sources compile once, then take seconds), and
no verdict here depends on how long nvcc takes: only a per-process hang guard does
(KPARITY_NVCC_TIMEOUT)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_all_kernels_compile_for_sm90():
    proc = subprocess.run([sys.executable, "-m", "gpu_impls.cuda.nvcc_check", "--arch", "sm_90"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") >= 6, proc.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_planted_fault_kernels_compile_for_sm90():
    from gpu_impls.cuda.nvcc_check import compile_unit

    source = Path(__file__).with_name("faults_cuda.cu")
    compiled = compile_unit(source.read_text(), "sm_90", ptx=True, include_dir=source.parent)
    assert compiled.ok, compiled.log
    ptx = compiled.ptx
    for kernel in ("illegal_address", "hang", "store_past_end", "fill_bits", "racy_sum_squares",
                   "scale_rows"):
        assert f".entry {kernel}(" in ptx


def _ptx_entries(source: str) -> list[str]:
    """The PTX of every listed instance of `source` (nvcc --ptx, sm_90), one body per entry."""
    from gpu_impls.cuda.nvcc_check import compile_unit, instantiation_unit, listed_kernels

    compiled = compile_unit(instantiation_unit(source, listed_kernels()[source]), "sm_90",
                            ptx=True)
    assert compiled.ok, compiled.log
    entries = re.split(r"\.entry ", compiled.ptx)[1:]
    assert entries
    return entries


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_kp_qgemv_mma_static_shared_memory_is_1024_bytes():
    """kp_qgemv_mma's dynamic stages follow its static shared memory, `partial` (1024 bytes),
    so they start on a 1024-byte boundary. A 2-word `__shared__` array beside it moved them 16
    bytes and cost 3.3-4.7 us at the bench shapes on an H100
    (benchmarks/HISTORY.md, h100-2026-11-24-subnormal): new shared state goes inside `partial`
    or the dynamic region."""
    import re

    for body in _ptx_entries("kp_qgemv_mma.cu"):
        name = body.split("(", 1)[0]
        if "F32" in name:
            continue  # f32 instances only trap: the contract refuses f32
        sizes = [int(n) for n in re.findall(r"^\s*\.shared \.align \d+ \.b8 \S+\[(\d+)\];",
                                            body, re.M)]
        assert sum(sizes) == 1024, f"{name}: static shared memory {sizes} bytes, not [1024]"


# Sources whose kernels the wrappers launch as programmatic dependent launches (kp_norms.py,
# gemv.py `_kp`, `_mma`, moe_gemm.py), each with the parameters it may read before
# `griddepcontrol.wait`:
# kp_qgemv_mma copies its scales and biases (parameters 1 and 2: weights, which no kernel
# before it writes) while the kernel before finishes. Nothing else, and no store, comes first.
# kp_rope.py's kernel computes its table from scalar parameters only before it.
PDL_SOURCES = {"kp_rms_norm.cu": set(), "kp_qgemv.cu": set(), "kp_qgemv_mma.cu": {1, 2},
               "kp_rope.cu": set(), "kp_moe_gemm.cu": set()}

_GLOBAL_ACCESS = re.compile(r"^(?:ld|st|atom|red)\.global|^cp\.async[\w.:]*\.global")


def accesses_before_wait(body: str) -> list[tuple[str, set[int]]]:
    """Every global access of a PTX entry body before its `griddepcontrol.wait` (all of them if
    it has none), as (instruction, the kernel parameters its global address derives from).
    A register derives from the parameters of every instruction that writes it (a dataflow
    over-approximation, iterated to a fixpoint for loops): `ld.param.u64` of parameter i (a
    pointer) gives {i}; integer parameters (sizes) taint nothing."""
    wait = body.find("griddepcontrol.wait")
    code = body[body.find("{") + 1:wait if wait >= 0 else len(body)]  # past the parameter list
    code = re.sub(r"//[^\n]*", "", code)  # comments (inline asm is wrapped in them)
    statements = [s.strip() for s in code.split(";")]
    parsed = []
    for s in statements:
        s = re.sub(r"^(\$\w+:\s*)+", "", s)           # labels
        s = re.sub(r"^@!?%\w+\s+", "", s)              # guard predicate
        if not s or s.startswith((".", "{", "}")):
            continue
        op, _, args = s.partition(" ")
        parsed.append((op, args))
    taint: dict[str, set[int]] = {}
    changed = True
    while changed:  # loops carry a register back to earlier statements: iterate to a fixpoint
        changed = False
        for op, args in parsed:
            if _GLOBAL_ACCESS.match(op) or op.startswith(("st.", "cp.", "bra", "bar", "ret")):
                continue
            regs = re.findall(r"%[\w.]+", args)
            if op.startswith("ld.param"):
                m = re.search(r"_param_(\d+)", args)
                taint.setdefault(regs[0], set()).update(
                    {int(m.group(1))} if op == "ld.param.u64" else set())
                continue  # a parameter load's taint never grows
            dests = re.findall(r"%[\w.]+", args.split("}")[0]) if args.startswith("{") \
                else regs[:1]
            sources = regs[len(dests):]
            for d in dests:
                new = set().union(*(taint.get(r, set()) for r in sources))
                if not new <= taint.setdefault(d, set()):
                    taint[d] |= new
                    changed = True
    found = []
    for op, args in parsed:
        if _GLOBAL_ACCESS.match(op):
            addresses = re.findall(r"\[([^\]]+)\]", args)
            address = addresses[1] if op.startswith("cp.async") else addresses[0]
            found.append((f"{op} {args}", set().union(
                *(taint.get(r, set()) for r in re.findall(r"%[\w.]+", address)))))
    return found


def test_accesses_before_wait_names_each_address_s_parameters():
    """The PTX analysis on a hand-written body: a copy from parameter 3 before the wait, through
    cvta and address arithmetic in a loop, is named with parameter 3 (so moving x's copy above
    the wait fails the test below); what follows the wait is not reported."""
    body = """(
        .param .u64 k_param_1, .param .u64 k_param_3 ) {
        ld.param.u64 %rd1, [k_param_3];
        ld.param.u64 %rd2, [k_param_1];
        cvta.to.global.u64 %rd3, %rd1;
        mov.u32 %r1, %tid.x;
    $L__BB0_1:
        mul.wide.s32 %rd4, %r1, 16;
        add.s64 %rd5, %rd3, %rd4;
        cp.async.cg.shared.global.L2::128B [%r2], [%rd5], 16;
        add.s32 %r1, %r1, 32;
        @%p1 bra $L__BB0_1;
        ld.global.nc.v4.u32 {%r3, %r4, %r5, %r6}, [%rd2];
        griddepcontrol.wait;
        st.global.u32 [%rd3], %r3;
    }"""
    found = accesses_before_wait(body)
    assert [params for _, params in found] == [{3}, {1}], found


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("source", sorted(PDL_SOURCES))
def test_pdl_kernels_wait_before_any_global_access(source):
    """In the PTX of every instance, `griddepcontrol.wait` comes before every global store and
    every global load or copy, except loads of the parameters PDL_SOURCES allows: a PDL-launched
    kernel may start while its predecessor still writes."""
    allowed = PDL_SOURCES[source]
    for body in _ptx_entries(source):
        name = body.split("(", 1)[0]
        for access, params in accesses_before_wait(body):
            assert access.startswith(("ld.", "cp.async")) and params and params <= allowed, (
                f"{source} {name}: `{access}` (from parameters {sorted(params)}) before "
                f"griddepcontrol.wait; allowed: reads of parameters {sorted(allowed)}")


@pytest.mark.skipif(shutil.which("gcc") is None or not Path("/usr/local/cuda/include/cuda.h")
                    .exists(), reason="gcc or cuda.h absent")
def test_launch_structs_match_cuda_h(tmp_path):
    """The ctypes mirrors of CUlaunchConfig / CUlaunchAttribute (`_module.launch`) have cuda.h's
    sizes and offsets, and the attribute id is cuda.h's."""
    import ctypes

    from gpu_impls.cuda import _module as m
    from gpu_impls.cuda.nvcc_check import hang_guard_s

    (tmp_path / "s.c").write_text(
        "#include <cuda.h>\n#include <stddef.h>\n#include <stdio.h>\n"
        "int main(void) { printf(\"%zu %zu %zu %zu %zu %zu %d\\n\", sizeof(CUlaunchAttribute),"
        " offsetof(CUlaunchAttribute, value), sizeof(CUlaunchConfig),"
        " offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs),"
        " offsetof(CUlaunchConfig, numAttrs),"
        " (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION); return 0; }\n")
    subprocess.run(["gcc", "-I/usr/local/cuda/include", str(tmp_path / "s.c"), "-o",
                    str(tmp_path / "s")], check=True, timeout=hang_guard_s())  # a hang only
    got = subprocess.run([str(tmp_path / "s")], capture_output=True, text=True,
                         check=True).stdout.split()
    mine = [ctypes.sizeof(m._LaunchAttribute), m._LaunchAttribute.value.offset,
            ctypes.sizeof(m._LaunchConfig), m._LaunchConfig.stream.offset,
            m._LaunchConfig.attrs.offset, m._LaunchConfig.num_attrs.offset,
            m.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]
    assert list(map(int, got)) == mine


def test_kernel_args_refuse_what_they_cannot_marshal():
    import numpy as np

    from gpu_impls.cuda._module import _kernel_arg

    assert _kernel_arg(np.float32(1.5)).value == 1.5
    assert _kernel_arg(np.int32(-3)).value == -3
    with pytest.raises(TypeError, match="NumPy scalar"):
        _kernel_arg(1.5)  # a Python float: its C type would be a guess
    assert _kernel_arg(np.float64(0.1)).value == 0.1  # a C double (kp_rope's table constants)
    with pytest.raises(TypeError):
        _kernel_arg(np.float16(1.0))


def test_every_mutant_define_reaches_some_kernel():
    """nvcc_check compiles a define only for the sources that read it: a define no source reads
    would silently compile nothing (a renamed macro, a typo), so each must reach one."""
    from gpu_impls.cuda.nvcc_check import KERNEL_DIR, MUTANT_DEFINES, defines_for

    reached = {d for p in KERNEL_DIR.glob("*.cu") for d in defines_for(p)}
    assert reached == set(MUTANT_DEFINES), sorted(set(MUTANT_DEFINES) - reached)
    # through a header: rms_math.cuh holds the RMS math's hooks, which only its includers get
    assert "KPARITY_MUTANT_DROP_EPS" in defines_for(KERNEL_DIR / "mt_rms_norm.cu")
    assert "KPARITY_MUTANT_DROP_EPS" not in (KERNEL_DIR / "mt_rms_norm.cu").read_text()
    assert "KPARITY_MUTANT_DROP_EPS" not in defines_for(KERNEL_DIR / "silu_mul.cu")


def test_a_define_named_only_in_a_comment_reaches_nothing(tmp_path):
    """A define a source names only in a comment cannot change its code: no variant for it."""
    from gpu_impls.cuda.nvcc_check import defines_for

    source = tmp_path / "k.cu"
    source.write_text("// KPARITY_MUTANT_DROP_EPS: see rms_math.cuh\n/* KPARITY_MUTANT_SKIP_LANE */\n"
                      "#ifdef KPARITY_MUTANT_DROP_BIAS\n#endif\n")
    assert defines_for(source) == ("KPARITY_MUTANT_DROP_BIAS",)


# --- the compile cache, with a stand-in nvcc (no CUDA needed) ----------------------------------

FAKE_NVCC = """#!{python}
# A stand-in nvcc: logs each compile, fails a unit with #error, hangs on one with HANG, writes
# a one-entry PTX for --ptx.
import os, pathlib, sys, time
args = sys.argv[1:]
if args == ["--version"]:
    print("fake nvcc, release {version}")
    sys.exit(0)
with open(os.environ["FAKE_NVCC_LOG"], "a") as f:
    f.write(" ".join(args[:-3]) + "\\n")
source = pathlib.Path(args[-1]).read_text()
if "HANG" in source:
    time.sleep(60)
if "#error" in source:
    print("unit.cu(1): error: planted", file=sys.stderr)
    sys.exit(1)
if "--ptx" in args:
    pathlib.Path(args[args.index("-o") + 1]).write_text(".entry fake(\\n")
"""


def _install_fake_nvcc(folder: Path, version: str) -> None:
    nvcc = folder / "nvcc"
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable, version=version))
    nvcc.chmod(0o755)


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    """A stand-in nvcc first on PATH, a fresh cache; returns the number of compiles so far."""
    import os

    (tmp_path / "bin").mkdir()
    _install_fake_nvcc(tmp_path / "bin", "1.0")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("KPARITY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KPARITY_NVCC_TIMEOUT", raising=False)
    log = tmp_path / "compiles.log"
    log.touch()
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    return lambda: len(log.read_text().splitlines())


def test_a_compile_is_cached_by_the_content_of_the_unit_and_every_header_it_reaches(
        fake_nvcc, tmp_path):
    from gpu_impls.cuda.nvcc_check import compile_unit

    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "a.cuh").write_text('#include "b.cuh"\n')
    (inc / "b.cuh").write_text("int b;\n")
    unit = '#include "a.cuh"\n'
    first = compile_unit(unit, "sm_90", include_dir=inc)
    assert first.ok and not first.cached and fake_nvcc() == 1
    assert compile_unit(unit, "sm_90", include_dir=inc).cached and fake_nvcc() == 1
    (inc / "b.cuh").write_text("int b2;\n")  # a header two includes deep changed
    assert not compile_unit(unit, "sm_90", include_dir=inc).cached and fake_nvcc() == 2
    for other in ({"define": "KPARITY_MUTANT_DROP_EPS"}, {"arch": "sm_80"}, {"ptx": True}):
        compiled = compile_unit(unit, other.pop("arch", "sm_90"), include_dir=inc, **other)
        assert compiled.ok and not compiled.cached, other
    assert fake_nvcc() == 5
    ptx = compile_unit(unit, "sm_90", ptx=True, include_dir=inc)
    assert ptx.cached and ptx.ptx == ".entry fake(\n"
    _install_fake_nvcc(tmp_path / "bin", "2.0")  # another nvcc: every verdict again
    assert not compile_unit(unit, "sm_90", include_dir=inc).cached and fake_nvcc() == 6


def test_a_failing_compile_is_not_cached(fake_nvcc):
    """A failure is rerun every time (nvcc_check's docstring says why), with nvcc's log."""
    from gpu_impls.cuda.nvcc_check import compile_unit

    for expected_compiles in (1, 2):
        compiled = compile_unit("#error broken\n", "sm_90")
        assert not compiled.ok and "error: planted" in compiled.log
        assert fake_nvcc() == expected_compiles


def test_the_only_time_limit_is_a_per_nvcc_hang_guard_named_in_the_failure(fake_nvcc,
                                                                          monkeypatch):
    from gpu_impls.cuda.nvcc_check import compile_unit

    monkeypatch.setenv("KPARITY_NVCC_TIMEOUT", "0.5")
    compiled = compile_unit("// HANG\n", "sm_90")
    assert not compiled.ok and "KPARITY_NVCC_TIMEOUT" in compiled.log
    monkeypatch.setenv("KPARITY_NVCC_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="KPARITY_NVCC_TIMEOUT='soon'"):
        compile_unit("int x;\n", "sm_90")


def test_nvcc_check_twice_compiles_nothing_the_second_time(fake_nvcc, capsys):
    from gpu_impls.cuda.nvcc_check import main

    assert main(["--arch", "sm_90"]) == 0
    compiles = fake_nvcc()
    assert compiles >= 14  # every listed source, each of its variants
    capsys.readouterr()
    assert main(["--arch", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert fake_nvcc() == compiles and out.count(" cached)") == out.count("ok  "), out


def test_names_nvrtc_lacks_are_found_outside_comments():
    """nvcc compiles INFINITY (its implicit math.h); NVRTC, which CuPy uses on the GPU, does
    not: the first kp_sdpa_decode.cu passed nvcc_check and failed to compile on the H100."""
    from gpu_impls.cuda.nvcc_check import nvrtc_missing

    assert nvrtc_missing("float m = -INFINITY; // not NAN\n/* FLT_MAX */") == ["INFINITY"]
    assert nvrtc_missing("#define KP_INF __int_as_float(0x7f800000)\nfloat m = -KP_INF;") == []
