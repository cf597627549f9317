"""The CI recipe users copy (examples/ci/): the workflow's steps, run on this CPU.

The GitHub Actions workflow (`examples/ci/github-actions.yml`) runs nothing but the subcommands
of the kernel repository's `ci/kparity.sh`; every `kparity` command in that script must parse
with flags that exist. The script's `gate` and `nightly` then run for real, in a copy of
`examples/ci/kernel-repo/` (installed as `pip install -e .` would: its entry point found, no
--plugin), on torch CPU, one preset: nightly twice (the second compares against the first),
then the gate (its check compared against the last nightly), then the gate again with the
kernel broken (it must go red). `install` is not run (it needs the network and makes a venv);
its pip line is checked instead.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CI = ROOT / "examples" / "ci"
WORKFLOW = CI / "github-actions.yml"
REPO = CI / "kernel-repo"
SCRIPT = REPO / "ci" / "kparity.sh"
SUBCOMMANDS = {"gate": "install gate", "nightly": "install nightly"}
FILTERS = "--preset qwen3-0.6b"  # a few cases: the recipe, not the gate, is under test here


def run_lines() -> list[str]:
    """The workflow's `run:` commands (each a single line: no `run: |` blocks)."""
    lines = [m.group(1).strip() for m in
             re.finditer(r"^\s*(?:-\s+)?run:\s*(.*)$", WORKFLOW.read_text(), re.M)]
    assert lines and all(line and line[0] not in "|>" for line in lines), lines
    return lines


def script_commands(program: str) -> list[list[str]]:
    """Each command of ci/kparity.sh that starts with `program`, as words (continuation lines
    joined, comments dropped, cut at a redirection or a pipe)."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        if line.strip().startswith(program + " "):
            words = shlex.split(line, comments=True)
            cut = [i for i, w in enumerate(words) if w in (">", ">>", "|", "||", "&&")]
            commands.append(words[:cut[0]] if cut else words)
    return commands


def test_the_workflow_runs_only_the_scripts_subcommands():
    verbs = [shlex.split(line) for line in run_lines()]
    assert all(v[:2] == ["bash", "ci/kparity.sh"] and len(v) == 3 for v in verbs), verbs
    assert {v[2] for v in verbs} == {"install", "gate", "nightly"}
    for sub in ("install", "gate", "nightly"):
        assert re.search(rf"^\s*{sub}\) cmd_{sub} ;;$", SCRIPT.read_text(), re.M), sub


def test_the_workflows_jobs():
    """gate on pull requests, nightly on the schedule, both on a self-hosted GPU runner, each
    uploading its outputs whatever the outcome."""
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(WORKFLOW.read_text())
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in on and on["schedule"][0]["cron"]
    for name, job in doc["jobs"].items():
        assert job["runs-on"] == ["self-hosted", "gpu"]
        runs = " ".join(s["run"].split()[-1] for s in job["steps"] if "run" in s)
        assert runs == SUBCOMMANDS[name]
        uses = [s["uses"].split("@")[0] for s in job["steps"] if "uses" in s]
        assert uses == ["actions/checkout", "actions/checkout", "actions/upload-artifact"]
        upload = job["steps"][-1]
        assert upload["if"] == "always()" and "KPARITY_OUT" in upload["with"]["path"]
    assert "pull_request" in doc["jobs"]["gate"]["if"]
    assert "schedule" in doc["jobs"]["nightly"]["if"]


def test_every_kparity_command_in_the_script_exists():
    """Each `kparity ...` line parses with kparity's own parser, every flag spelled out in full
    (argparse would accept a prefix), `$VAR` words standing in as 1."""
    import argparse

    from verbs.cli import parse_args, parser

    top = parser()
    verbs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    commands = script_commands("kparity")
    seen = set()
    for words in commands:
        args = []
        for w in words[1:]:
            args += shlex.split(FILTERS) if w == "$FILTERS" else ["1" if "$" in w else w]
        verb = parse_args(args).verb
        seen.add(verb)
        known = set(top._option_string_actions) | set(verbs[verb]._option_string_actions)
        unknown = [w for w in args if w.startswith("-") and w not in known]
        assert not unknown, f"{' '.join(words)}: no such flag {unknown}"
    assert seen == {"ops", "check", "compare", "nightly", "sql"}


def test_install_is_locked_by_kparitys_constraints():
    (pip,) = [w for w in script_commands("python") if w[1:4] == ["-m", "pip", "install"]]
    assert pip[pip.index("-c") + 1] == "$SRC/constraints.txt" and "-e" in pip
    assert (ROOT / "constraints.txt").is_file()


def installed_copy(tmp: Path) -> tuple[Path, Path]:
    """The kernel repo copied under `tmp`, and a folder whose dist-info declares its entry
    points: on PYTHONPATH with the copy, it is what `pip install -e .` gives kparity
    (importlib.metadata finds the entry point), without touching this venv."""
    repo = tmp / "kernel-repo"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    info = tmp / "site" / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = project["entry-points"]["kparity.plugins"]
    info.joinpath("entry_points.txt").write_text(
        "[kparity.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()))
    return repo, tmp / "site"


BUG = ("* (w.float() + weight_offset)", "")  # the kernel forgets its weight


def step(name: str, repo: Path, env: dict, out: Path) -> tuple[int, str, Path]:
    """`bash ci/kparity.sh NAME` in the repo: (exit status, output, its KPARITY_OUT)."""
    p = subprocess.run(["bash", "ci/kparity.sh", name], cwd=repo,
                       env={**env, "KPARITY_OUT": str(out)}, capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stdout + p.stderr, out


def test_the_workflow_steps_run_on_cpu(tmp_path):
    """nightly twice (the report; the second compares with the first), the gate (pytest, check,
    compare against the last nightly), and the gate of a broken kernel (red, a repro line). One
    test, so that pytest-xdist runs the sequence once."""
    repo, site = installed_copy(tmp_path)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT")) and k != "KPARITY_IMPLS"}
    env.update({"PYTHONPATH": os.pathsep.join([str(repo), str(site)]),
                "KPARITY_VENV": sys.prefix, "KPARITY_ALLOW_CPU": "1", "KPARITY_FILTERS": FILTERS,
                "KPARITY_STORE": str(tmp_path / "store"),
                "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
                "PYTEST_ADDOPTS": "-p no:cacheprovider", "COLUMNS": "120"})

    for night in ("first", "second"):
        rc, log, out = step("nightly", repo, env, tmp_path / f"nightly-{night}")
        assert rc == 0 and "nightly OK" in log, log
        assert (out / "site" / "index.html").is_file()
        assert (out / "site" / "impl-torch_my_rms_norm.html").is_file()
    assert "no earlier nightly check run" in (tmp_path / "nightly-first" / "compare-check.md"
                                              ).read_text()
    compare = (out / "compare-check.md").read_text()
    assert compare.startswith("### kparity compare: no regressions"), compare
    assert "no earlier nightly bench run" in (out / "compare-bench.md").read_text()
    assert compare in (tmp_path / "summary.md").read_text()

    rc, log, out = step("gate", repo, env, tmp_path / "gate")
    assert rc == 0, log
    junit = (out / "pytest.xml").read_text()
    assert "test_entry_point_registers_every_impl" in junit and 'failures="0"' in junit, junit
    check = json.loads((out / "check.json").read_text())
    assert check["verdict"] == "OK" and (out / "check.xml").is_file()
    assert {r["impl"] for r in check["rows"]} == {"torch:my_rms_norm"}
    compare = (out / "compare-nightly.md").read_text()
    assert compare.startswith("### kparity compare: no regressions"), compare
    runs = ds.dataset(str(tmp_path / "store" / "runs"), format="parquet").to_table()
    assert runs.num_rows == 2 and check["run_id"] not in runs.column("run_id").to_pylist()

    kernel = repo / "my_kernels" / "__init__.py"
    assert BUG[0] in kernel.read_text()
    kernel.write_text(kernel.read_text().replace(*BUG))
    rc, log, out = step("gate", repo, env, tmp_path / "gate-broken")
    assert rc == 1, log
    assert "FAILED tests/test_kparity_gate.py::test_gate[torch:my_rms_norm-" in log, log
    assert "repro: kparity repro " in log
    assert not (out / "check.json").exists()  # the first red step ends the job
