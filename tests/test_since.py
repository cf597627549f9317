"""Selection by git change (`runners/since.py`): `kparity check --since REF`, and pytest's
`--kparity-since REF` (`tests/conftest.py`)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

import gpu_impls
from runners import since
from runners.since import SinceError, changed_files, select_since
from verbs.cli import main


@pytest.fixture(scope="module")
def impls():
    return gpu_impls.impls()


def module_of(impl) -> str:
    return impl.run.__module__


def test_an_oracle_change_selects_its_ops_impls_and_not_the_others(impls):
    sel = select_since("HEAD", impls, changed=["oracle/norms.py"])
    ops = {impls[i].op for i in sel.impl_ids}
    assert {"rms_norm", "add_rms_norm", "rms_norm_residual"} <= ops
    rms = {i for i, impl in impls.items() if impl.op == "rms_norm"}
    assert rms <= sel.impl_ids  # every impl of the op: cuda, torch, mlx
    assert not {"sdpa_decode", "rope", "silu_mul", "moe_router"} & ops
    assert not sel.core_changed
    line = next(x for x in sel.lines() if x.strip().startswith("oracle/norms.py ->"))
    assert "rms_norm" in line


def test_a_kernel_change_selects_only_the_cuda_impls_whose_module_names_it(impls):
    sel = select_since("HEAD", impls, changed=["gpu_impls/cuda/kernels/kp_rms_norm.cu"])
    expected = {i for i, impl in impls.items() if module_of(impl) == "gpu_impls.cuda.kp_norms"}
    assert "cuda:kp_rms_norm" in expected
    assert sel.impl_ids == expected
    assert "cuda:mt_rms_norm" not in sel.impl_ids and "torch:rms_norm" not in sel.impl_ids
    assert "cuda:kp_rms_norm" in "\n".join(sel.lines())


def test_a_header_change_selects_the_impls_of_the_kernels_including_it(impls):
    sel = select_since("HEAD", impls, changed=["gpu_impls/cuda/kernels/fp4.cuh"])
    expected = {i for i, impl in impls.items() if module_of(impl) == "gpu_impls.cuda.fp4"}
    assert expected and sel.impl_ids == expected  # kp_fp4.cu and kp_fp4_quantize.cu include it
    rms = select_since("HEAD", impls, changed=["gpu_impls/cuda/kernels/rms_math.cuh"]).impl_ids
    assert {"cuda:kp_rms_norm", "cuda:mt_rms_norm", "cuda:ffai_rms_norm_residual"} <= rms
    assert all(i.startswith("cuda:") for i in rms) and "cuda:kp_sdpa_decode" not in rms


def test_a_core_change_selects_everything(impls):
    for path in ("runners/correctness.py", "oracle/spec.py", "gpu_impls/impl.py",
                 "oracle/comparators.py", "pyproject.toml"):
        sel = select_since("HEAD", impls, changed=[path])
        assert sel.impl_ids == set(impls), path
        assert sel.core_changed == [path]
        assert f"{path} -> everything (core" in "\n".join(sel.lines())


def test_an_unreached_backend_file_selects_that_backend(impls):
    sel = select_since("HEAD", impls, changed=["gpu_impls/cuda/backend.py"])
    assert sel.impl_ids == {i for i, impl in impls.items() if impl.backend == "cuda"}


def test_docs_tests_and_benchmarks_select_nothing(impls):
    changed = ["README.md", "benchmarks/HISTORY.md", "tests/test_cli.py", "scripts/same_rows.py"]
    sel = select_since("HEAD~2", impls, changed=changed)
    assert sel.impl_ids == set() and not sel.core_changed
    lines = sel.lines()
    assert len(lines) == 1 and "4 files changed" in lines[0] and "nothing selected" in lines[0]
    assert select_since("HEAD", impls, changed=[]).lines() == [
        "since HEAD: no file changed: nothing selected"]


def test_changed_files_reads_the_diff_and_untracked_files(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    for name in ("a.py", "b.py", "c.md"):
        (tmp_path / name).write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    (tmp_path / "b.py").write_text("x = 2\n")  # unstaged
    (tmp_path / "new.py").write_text("y = 1\n")  # untracked
    assert changed_files("HEAD", tmp_path) == ["b.py", "new.py"]
    with pytest.raises(SinceError, match=r"--since nope: no such commit(.|\n)*HEAD~3"):
        changed_files("nope", tmp_path)
    bare = tmp_path / "not-git"
    bare.mkdir()
    (bare / ".git").write_text("gitdir: /nonexistent\n")  # stops git looking further up
    with pytest.raises(SinceError, match="is not a git checkout"):
        changed_files("HEAD", bare)


def cli(tmp_path, *argv) -> int:
    return main(["--store", str(tmp_path / "store"), *argv])


def test_check_with_a_bad_ref_exits_2_naming_it(tmp_path, capsys):
    rc = cli(tmp_path, "check", "--since", "no-such-ref-xyz", "--impl", "torch:rms_norm")
    out = capsys.readouterr().out
    assert rc == 2, out
    assert "no-such-ref-xyz" in out and "no such commit" in out
    assert not (tmp_path / "store" / "correctness").exists()


def test_check_since_a_docs_change_runs_nothing_and_exits_0(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(since, "changed_files", lambda *a, **k: ["README.md"])
    rc = cli(tmp_path, "check", "--since", "HEAD", "--backend", "torch", "--op", "rms_norm")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "since HEAD: 1 file changed (README.md)" in out and "nothing selected" in out
    assert not (tmp_path / "store" / "correctness").exists()  # no sweep ran


def test_check_since_runs_only_the_selected_impls(tmp_path, capsys, monkeypatch):
    import pyarrow.dataset as ds

    monkeypatch.setattr(since, "changed_files",
                        lambda *a, **k: ["gpu_impls/torch/norms.py", "README.md"])
    rc = cli(tmp_path, "check", "--since", "HEAD", "--impl", "torch:rms_norm,mlx:fast_rms_norm",
             "--valid-only", "--dtype", "f32")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "gpu_impls/torch/norms.py -> " in out and "README.md -> nothing" in out
    rows = ds.dataset(str(tmp_path / "store" / "correctness"), format="parquet").to_table()
    assert set(rows.column("impl").to_pylist()) == {"torch:rms_norm"}


def test_pytest_deselects_the_tests_of_impls_left_out(impls):
    from tests.conftest import since_deselect

    sel = select_since("HEAD", impls, changed=["gpu_impls/cuda/kernels/kp_rms_norm.cu"])
    deselected = []
    config = SimpleNamespace(_kparity_since=sel, getoption=lambda name, default=None: "HEAD",
                             hook=SimpleNamespace(pytest_deselected=lambda items: deselected
                                                  .extend(items)))

    def item(**params):
        return SimpleNamespace(callspec=SimpleNamespace(params=params))

    kept = item(work=SimpleNamespace(impl=impls["cuda:kp_rms_norm"], case=None))
    dropped = item(work=SimpleNamespace(impl=impls["cuda:mt_rms_norm"], case=None))
    by_id, unrelated, plain = item(impl="torch:rms_norm"), item(dtype="f32"), SimpleNamespace()
    items = [kept, dropped, by_id, unrelated, plain]
    since_deselect(config, items)
    assert items == [kept, unrelated, plain]
    assert deselected == [dropped, by_id]
