"""Every .cu source compiles for sm_90 with nvcc, for every dtype and mutant define, before a GPU
machine ever sees it (skips where nvcc is absent)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_all_kernels_compile_for_sm90():
    proc = subprocess.run([sys.executable, "-m", "gpu_impls.cuda.nvcc_check", "--arch", "sm_90"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") >= 6, proc.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_planted_fault_kernels_compile_for_sm90(tmp_path):
    from pathlib import Path

    source = Path(__file__).with_name("faults_cuda.cu")
    proc = subprocess.run(["nvcc", "-arch=sm_90", "--ptx", str(source), "-o",
                           str(tmp_path / "faults.ptx")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ptx = (tmp_path / "faults.ptx").read_text()
    for kernel in ("illegal_address", "hang", "store_past_end", "fill_bits", "racy_sum_squares",
                   "scale_rows"):
        assert f".entry {kernel}(" in ptx


def _ptx_entries(source: str, tmp_path) -> list[str]:
    """The PTX of every listed instance of `source` (nvcc --ptx, sm_90), one body per entry."""
    import re

    from gpu_impls.cuda.nvcc_check import KERNEL_DIR, instantiation_unit, listed_kernels

    unit = tmp_path / "unit.cu"
    unit.write_text(instantiation_unit(source, listed_kernels()[source]))
    proc = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-I", str(KERNEL_DIR), "--ptx",
                           str(unit), "-o", str(tmp_path / "unit.ptx")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entries = re.split(r"\.entry ", (tmp_path / "unit.ptx").read_text())[1:]
    assert entries
    return entries


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_kp_qgemv_mma_static_shared_memory_is_1024_bytes(tmp_path):
    """kp_qgemv_mma's dynamic stages follow its static shared memory, `partial` (1024 bytes),
    so they start on a 1024-byte boundary. A 2-word `__shared__` array beside it moved them 16
    bytes and cost 3.3-4.7 us at the bench shapes on an H100
    (benchmarks/h100-2026-11-24-subnormal): new shared state goes inside `partial` or the
    dynamic region."""
    import re

    for body in _ptx_entries("kp_qgemv_mma.cu", tmp_path):
        name = body.split("(", 1)[0]
        if "F32" in name:
            continue  # f32 instances only trap: the contract refuses f32
        sizes = [int(n) for n in re.findall(r"^\s*\.shared \.align \d+ \.b8 \S+\[(\d+)\];",
                                            body, re.M)]
        assert sum(sizes) == 1024, f"{name}: static shared memory {sizes} bytes, not [1024]"


# Sources whose kernels the wrappers launch as programmatic dependent launches (kp_norms.py,
# gemv.py `_kp`): each must wait for its predecessors before touching global memory.
PDL_SOURCES = ("kp_rms_norm.cu", "kp_qgemv.cu", "kp_qgemv_mma.cu")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("source", PDL_SOURCES)
def test_pdl_kernels_wait_before_any_global_access(source, tmp_path):
    """In the PTX of every instance, `griddepcontrol.wait` comes before the first global load or
    store: a PDL-launched kernel may start while its predecessor still writes."""
    import re

    for body in _ptx_entries(source, tmp_path):
        name = body.split("(", 1)[0]
        wait = body.find("griddepcontrol.wait")
        first = min((m.start() for m in re.finditer(r"\b(ld|st)\.global", body)),
                    default=len(body))
        assert 0 <= wait < first, f"{source} {name}: global access before griddepcontrol.wait"


@pytest.mark.skipif(shutil.which("gcc") is None or not Path("/usr/local/cuda/include/cuda.h")
                    .exists(), reason="gcc or cuda.h absent")
def test_launch_structs_match_cuda_h(tmp_path):
    """The ctypes mirrors of CUlaunchConfig / CUlaunchAttribute (`_module.launch`) have cuda.h's
    sizes and offsets, and the attribute id is cuda.h's."""
    import ctypes

    from gpu_impls.cuda import _module as m

    (tmp_path / "s.c").write_text(
        "#include <cuda.h>\n#include <stddef.h>\n#include <stdio.h>\n"
        "int main(void) { printf(\"%zu %zu %zu %zu %zu %zu %d\\n\", sizeof(CUlaunchAttribute),"
        " offsetof(CUlaunchAttribute, value), sizeof(CUlaunchConfig),"
        " offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs),"
        " offsetof(CUlaunchConfig, numAttrs),"
        " (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION); return 0; }\n")
    subprocess.run(["gcc", "-I/usr/local/cuda/include", str(tmp_path / "s.c"), "-o",
                    str(tmp_path / "s")], check=True, timeout=60)
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
    with pytest.raises(TypeError):
        _kernel_arg(np.float64(1.0))
