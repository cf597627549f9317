"""Output guards: every in-place output is poisoned and fenced by canaries, so a write one element
past the end and an element never written each fail the case with the element's flat index,
while the same impl passes every other case. The faults are tests/faults.py's in-place torch
impls, on the 6 bf16 qwen3-0.6b cases (7 rows x 1024)."""

from __future__ import annotations

from cases.distributions import DISTRIBUTIONS
from pathlib import Path

import numpy as np
import pytest

from gpu_impls import backend
from gpu_impls.backend import CANARY_BITS, GUARD_BYTES, POISON_BITS
from results.store import Store
from verbs.cli import main

FAULTS = str(Path(__file__).with_name("faults.py"))
CASES = ["--preset", "qwen3-0.6b", "--dtype", "bf16", "--isolate", "none"]
N = 7 * 1024


def _rows(store):
    return {(r["impl"], r["dist"]): r for r in Store(store).read("correctness").to_pylist()}


def test_out_of_bounds_write_and_unwritten_element_fail_with_their_index(tmp_path, capsys):
    rc = main(["--store", str(tmp_path), "--plugin", FAULTS, "check", "--impl",
               "torch:fault_oob_write,torch:fault_unwritten_last,torch:fault_in_place", *CASES])
    assert rc == 1
    rows = _rows(tmp_path)
    assert len(rows) == 3 * len(DISTRIBUTIONS)
    oob = rows[("torch:fault_oob_write", "constant_rows")]
    assert oob["status"] == "fail" and "oob_write" in oob["flags"].split(",")
    assert f"out: out-of-bounds write: 1 element(s) at flat index {N} " in oob["message"]
    unwritten = rows[("torch:fault_unwritten_last", "constant_rows")]
    assert unwritten["status"] == "fail" and "unwritten" in unwritten["flags"].split(",")
    assert f"never written (still the poison NaN): 1 element(s) at flat index {N - 1} " \
        in unwritten["message"]
    rest = [r for k, r in rows.items() if k[1] != "constant_rows" or k[0].endswith("in_place")]
    assert len(rest) == 3 * len(DISTRIBUTIONS) - 2 and all(r["status"] == "pass" and r["flags"] == "" for r in rest)
    out = capsys.readouterr().out
    assert f"--plugin {FAULTS} repro {oob['case_id']} --impl " \
           "torch:fault_oob_write" in out
    assert "fail, by kind: 1 oob_write, 1 unwritten" in out or \
        "fail, by kind: 1 unwritten, 1 oob_write" in out


def test_an_impl_returning_a_view_of_its_output_is_still_checked(tmp_path):
    assert main(["--store", str(tmp_path), "--plugin", FAULTS, "check", "--impl",
                 "torch:fault_unwritten_view", *CASES]) == 1
    bad, = [r for r in Store(tmp_path).read("correctness").to_pylist() if r["status"] != "pass"]
    assert bad["dist"] == "constant_rows" and "unwritten" in bad["flags"].split(",")
    assert "NaN/Inf mismatches" in bad["message"]  # the metrics' message follows the defect


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_guarded_output_is_a_poisoned_view_between_canaries(dtype):
    """The layout the runner relies on, on the torch backend here: the output is a contiguous
    view at GUARD_BYTES into one allocation; an untouched buffer reads back as all unwritten,
    a fully written one as clean, and writes on either side name their flat indices."""
    torch_backend = backend("torch")
    fenced = torch_backend.guarded((3, 5), dtype)
    assert fenced.array.is_contiguous() and tuple(fenced.array.shape) == (3, 5)
    assert fenced.array.storage_offset() * fenced.array.element_size() == GUARD_BYTES
    host, defects = fenced.read(torch_backend)
    assert [flag for flag, _ in defects] == ["unwritten"] and "15 element(s)" in defects[0][1]
    assert (host.view(POISON_BITS[dtype].dtype) == POISON_BITS[dtype]).all()
    fenced.array.copy_(torch_backend.to_device(np.ones((3, 5), np.float32)))
    assert fenced.read(torch_backend)[1] == []
    whole = fenced.whole
    whole[fenced.guard - 2] = 0.0
    whole[fenced.guard + 15 + 3] = 0.0
    (flag, text), = fenced.read(torch_backend)[1]
    assert flag == "oob_write" and "2 element(s) at flat index -2, 18 " in text
    bits = torch_backend.to_host(whole, dtype).view(CANARY_BITS[dtype].dtype)
    assert (bits[:fenced.guard - 2] == CANARY_BITS[dtype]).all()


def test_each_planted_cuda_fault_fires_on_its_cases_only():
    """tests/faults_cuda.py (run on the GPU machine) targets one gate case per fault: checked
    here against the generated rms_norm cases its base impl admits, in a fresh process (the
    plugin registers impls and a ledger entry)."""
    import subprocess
    import sys

    code = """
import gpu_impls
from cases.generate import valid_cases
from gpu_impls import known_issues
import sys
sys.path.insert(0, "tests")
import faults_cuda as f
cases = valid_cases(gpu_impls.impls()["cuda:kp_rms_norm"])
for name in (*f.FIRES, "fault_cuda_nan_f16"):
    hit = [c for c in cases if f.fires(name, c)]
    quarantined = [c for c in hit if known_issues.find("cuda:" + name, c, known_issues.ledger())]
    print(name, len(hit), len(quarantined), len(cases))
print("f16_cases", sum(c.dtype == "f16" for c in cases), 0, len(cases))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = {line.split()[0]: [int(v) for v in line.split()[1:]] for line in proc.stdout.split("\n")
           if line}
    total = got["fault_cuda_race"][2]
    f16 = got.pop("f16_cases")[0]  # f32/bf16 have domain cases f16 cannot hold (f32_overflow)
    assert got == {"fault_cuda_hang": [2, 1, total], "fault_cuda_illegal_address": [1, 0, total],
                   "fault_cuda_oob_write": [1, 0, total], "fault_cuda_unwritten_last": [1, 0, total],
                   "fault_cuda_race": [1, 0, total], "fault_cuda_nan_f16": [f16, 0, total]}
