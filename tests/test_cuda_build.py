"""Every .cu source compiles for sm_90 with nvcc, for every dtype and mutant define, before a GPU
machine ever sees it (skips where nvcc is absent)."""

from __future__ import annotations

import shutil
import subprocess
import sys

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
