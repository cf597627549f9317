"""`kparity ops --family NAME --files` (issue 51 item 5): a family's parts in one place, read
from the code."""

from __future__ import annotations

from pathlib import Path

import gpu_impls
from verbs.cli import main
from verbs.family_files import ROOT, family_files


def test_softcaps_files_are_its_new_files_and_the_header_its_kernel_includes():
    parts = family_files("softcap", gpu_impls.impls())
    assert parts["ops"] == ["softcap"]
    assert parts["oracle"] == ["oracle/softcap.py"] and parts["cases"] == ["cases/softcap.py"]
    assert parts["impls (torch)"] == ["gpu_impls/torch/softcap.py"]
    assert parts["impls (mlx)"] == ["gpu_impls/mlx/softcap.py"]
    assert parts["impls (cuda)"] == ["gpu_impls/cuda/softcap.py"]
    assert parts["kernels"] == ["gpu_impls/cuda/kernels/common.cuh",
                                "gpu_impls/cuda/kernels/softcap.cu"]
    assert parts["tests"] == ["tests/test_family_files.py", "tests/test_softcap.py"]  # and this


def test_every_family_lists_files_that_exist():
    families = {spec.family for spec in __import__("oracle.spec").spec.registry().values()}
    for family in families:
        parts = family_files(family, gpu_impls.impls())
        assert parts["oracle"] and parts["cases"], family
        for part, files in parts.items():
            if part != "ops":
                assert all((ROOT / f).is_file() for f in files), (family, part, files)


def test_the_verb_prints_the_table_and_refuses_bad_input(capsys):
    assert main(["ops", "--family", "softcap", "--files"]) == 0
    out = capsys.readouterr().out
    assert "oracle/softcap.py" in out and "kernels/softcap.cu" in out
    assert main(["ops", "--family", "softkap", "--files"]) == 2
    assert "Valid families (closest first): softcap" in capsys.readouterr().out
    assert main(["ops", "--files"]) == 2
    assert "add --family NAME" in capsys.readouterr().out
    assert main(["ops", "--family", "softcap"]) == 0
    out = capsys.readouterr().out
    assert "softcap" in out and "silu_mul" not in out


def test_root_is_the_repository():
    assert (ROOT / "oracle" / "spec.py").is_file() and Path(__file__).parent == ROOT / "tests"
