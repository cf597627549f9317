"""Gate tiers (cases/tiers.py): the commit tier keeps what the nightly tier can tell apart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import gpu_impls
from cases.generate import plan, valid_cases
from cases.model import Case
from cases.coverage import coverage
from cases.tiers import case_cost, case_features, commit_subset, tier_features
from tests.conftest import tier

ROOT = Path(__file__).resolve().parent.parent


def _gated_impls():
    """The builtin impls that gate (plugins other tests loaded in this process left out)."""
    return [i for i in gpu_impls.impls().values()
            if not i.report_only and gpu_impls.origin(i.id) == "builtin"]


def test_commit_keeps_every_feature_of_every_registered_impl():
    """Every (impl, dtype, distribution), parameter value, edge and label kind that nightly has,
    commit has: no (impl, dtype, distribution) is nightly-only (`kparity ops --coverage`)."""
    missing = {}
    for impl in _gated_impls():
        cases = valid_cases(impl)
        lost = tier_features(cases) - tier_features(commit_subset(cases))
        if lost:
            missing[impl.id] = sorted(map(str, lost))[:3]
    assert not missing, missing
    gaps = {op: row["nightly_only"] for op, row in coverage(_gated_impls()).items()
            if row["nightly_only"]}
    assert not gaps, gaps


def test_commit_is_the_cheap_share():
    """Commit keeps under half of nightly's cases and under half of its work (elements + flops)
    over every registered impl: the tier is worth having."""
    n_all = n_commit = cost_all = cost_commit = 0
    for impl in _gated_impls():
        cases = valid_cases(impl)
        kept = commit_subset(cases)
        n_all, n_commit = n_all + len(cases), n_commit + len(kept)
        cost_all += sum(map(case_cost, cases))
        cost_commit += sum(map(case_cost, kept))
    assert n_commit < n_all / 2 and cost_commit < cost_all / 2, (n_commit, n_all)


def test_the_smallest_case_carries_a_feature():
    """Of two cases showing the same thing, commit keeps the smaller; a new distribution, dtype
    or parameter value brings its own case in."""
    small = Case.make("rms_norm", {"rows": 5, "n": 64}, "f16", "normal", label="preset:a")
    big = Case.make("rms_norm", {"rows": 7, "n": 4096}, "f16", "normal", label="preset:b")
    tiny = Case.make("rms_norm", {"rows": 7, "n": 4096}, "f16", "tiny", label="preset:b")
    bf16 = Case.make("rms_norm", {"rows": 7, "n": 4096}, "bf16", "normal", label="preset:b")
    normed = big.replace(rounding="normed")
    assert commit_subset([big, small]) == [small]
    assert commit_subset([big, small, tiny, bf16, normed]) == [small, tiny, bf16, normed]


def test_edges_are_kept_per_element_width():
    """A tile edge is kept once for f32 and once for the 2-byte formats (vector widths differ),
    not once per 2-byte dtype."""
    edge = {"rows": 5, "n": 4095}
    f32, f16, bf16 = (Case.make("rms_norm", edge, d, "normal", label="edge")
                      for d in ("f32", "f16", "bf16"))
    assert ("edge", "edge", f32.dim_items, "4-byte") in case_features(f32)
    assert ("edge", "edge", f16.dim_items, "narrow") in case_features(bf16)
    small = [Case.make("rms_norm", {"rows": 1, "n": 8}, d, "normal", label="preset:tiny")
             for d in ("f32", "f16", "bf16")]  # cheaper: they show each (dtype, dist) first
    kept = commit_subset(small + [f32, f16, bf16])
    assert kept[:3] == small and f32 in kept
    assert len(kept) == 5 and (f16 in kept) != (bf16 in kept)  # one 2-byte edge, not two


def test_plan_tier_and_filters():
    """The commit tier covers what the filters leave (a preset's cover, not nothing); nightly is
    every case; violating cases are in both."""
    impl = gpu_impls.impls()["torch:rms_norm"]
    commit = plan([impl], tier="commit")
    nightly = plan([impl], tier="nightly")
    assert {w.case.id for w in commit} < {w.case.id for w in nightly}
    assert [w for w in commit if w.expect == "rejected"] == \
        [w for w in nightly if w.expect == "rejected"]
    preset = plan([impl], presets=["qwen3-8b"], tier="commit")
    assert preset and all("qwen3-8b" in w.case.label for w in preset)
    with pytest.raises(ValueError, match="tier 'weekly'"):
        plan([impl], tier="weekly")


@pytest.mark.parametrize("given, markexpr, want", [
    (None, "", "commit"), (None, "gpu", "commit"), (None, "gpu and nightly", "nightly"),
    ("nightly", "gpu", "nightly"), ("commit", "nightly", "commit")])
def test_pytest_tier(given, markexpr, want):
    options = {"tier": given, "markexpr": markexpr}
    config = SimpleNamespace(getoption=lambda name, default=None: options.get(name, default))
    assert tier(config) == want


def test_pytest_commit_tier_deselects_nightly_tests(tmp_path):
    """In a fresh pytest run with kparity's conftest: the nightly-marked test is deselected by
    default and runs under --tier nightly or -m nightly."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    nightly: nightly tier\n")
    (tmp_path / "test_x.py").write_text("import pytest\n\n@pytest.mark.nightly\n"
                                        "def test_long():\n    pass\n\n"
                                        "def test_short():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def passed(*args) -> set[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p",
                              "no:cacheprovider", "-q", "-rA", *args], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return {line.split("::")[-1] for line in out.stdout.splitlines()
                if line.startswith("PASSED")}

    assert passed() == {"test_short"}
    assert passed("--tier", "nightly") == {"test_short", "test_long"}
    assert passed("-m", "nightly") == {"test_long"}


def test_cli_tiers(capsys):
    from verbs.cli import main

    assert main(["cases", "--impl", "torch:rms_norm"]) == 0
    commit = capsys.readouterr().out
    assert main(["cases", "--impl", "torch:rms_norm", "--tier", "nightly"]) == 0
    nightly = capsys.readouterr().out
    count = lambda out: int(out.split("(impl, case) pairs")[0].split()[-1])  # noqa: E731
    assert 0 < count(commit) < count(nightly)
    with pytest.raises(SystemExit) as bad:
        main(["check", "--tier", "weekly"])
    assert bad.value.code == 2
    assert "invalid choice: 'weekly'" in capsys.readouterr().err
