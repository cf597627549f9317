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
