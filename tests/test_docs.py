"""The README and docs/ stay true (scripts/readme_examples.py): the README is a short front door
whose two commands are `.ci/run`'s, verbatim; every command block is marked (run, regenerated,
CI's, or skipped with a reason); inline `kparity ...` commands name real verbs and flags; the
counts the README states are the registry's; and every command shown runs, with the output
shown being what it prints now.
"""

from __future__ import annotations

import re

import pytest

from scripts import readme_examples as rx

DOCS = rx.documents()
README_MAX_LINES = 350
FIRST_BLOCK_BY = 40


def test_readme_is_a_front_door():
    lines = rx.README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    first = next(i for i, line in enumerate(lines, 1) if line.lstrip().startswith("```"))
    assert first <= FIRST_BLOCK_BY, f"README.md's first command block is at line {first}"


def test_the_readme_commands_are_ci_verbatim():
    """`.ci/run` runs "the README's two commands, verbatim": its announced lines are exactly the
    README's `ci` blocks, in order (and docs/ repeats them only verbatim: `lint`)."""
    shown = [line for block in rx.blocks(rx.README) if block.kind == "ci"
             for line in block.body if line.strip()]
    assert len(rx.ci_lines()) == 2
    assert shown == rx.ci_lines()


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_block_is_marked_and_every_inline_command_exists(doc):
    assert rx.lint(doc) == []


def test_counts_the_docs_state_are_the_registrys():
    import gpu_impls
    import oracle
    from oracle.spec import registry

    oracle.load_all()
    ops = registry()
    families = {op.family for op in ops.values()}
    builtin = [i for i in gpu_impls.impls() if gpu_impls.origin(i) == "builtin"]
    for doc in (rx.README, rx.DOCS / "ops.md"):
        text = " ".join(doc.read_text().split())
        claim = re.search(r"(\d+) ops in (\d+) families (?:with|and) (\d+) builtin impls", text)
        assert claim, f"{doc.name} states no 'N ops in M families with K builtin impls'"
        assert tuple(map(int, claim.groups())) == (len(ops), len(families), len(builtin)), doc


def docs_machine() -> str | None:
    """Why this machine's outputs would differ from the docs' (torch CPU and MLX CPU, no CUDA,
    no Metal: CI's), or None."""
    import gpu_impls

    here = {b: gpu_impls.backend(b).available() for b in gpu_impls.BACKENDS}
    cpu = {b: ok and why.endswith("on cpu") for b, (ok, why) in here.items()}
    if cpu == {"cuda": False, "metal": False, "torch": True, "mlx": True} \
            and not here["cuda"][0] and not here["metal"][0]:
        return None
    return "the docs' outputs come from torch CPU and MLX CPU alone (as CI); here: " + \
        "; ".join(f"{b}: {why}" for b, (ok, why) in here.items())


# nightly: the documents' commands are whole sweeps, A/Bs and model runs (about 6 minutes on a
# 2-core CPU, README's 61 s of it), more than CI's budget; every commit still lints each block
# and checks each inline command's verb and flags against the parser (above)
@pytest.mark.nightly
@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_command_runs_and_every_output_is_current(doc):
    """Each document's `run` and `example` blocks, in order, in a sandbox of their own; a stale
    output fails with the command that regenerates it."""
    why = docs_machine()
    if why:
        pytest.skip(why)
    problems = rx.run(doc, check=True, log=lambda line: None)
    assert not problems, "\n".join(problems)
