"""Run every command shown in README.md and docs/*.md; regenerate the outputs they show.

    python scripts/readme_examples.py [--check] [FILE ...]

Every fenced block that shows commands or output (a block in `sh`, `bash`, `console`, `text`
or no language) follows a marker line, which says what happens to it:

    <!-- example: kparity cases --op rms_norm --invalid | keep: ^[┃│] | head: 12 -->
        runs the kparity command; the block is `$ <command>` and what it prints, regenerated.
        `keep: REGEX` keeps only matching lines, `head: N` the first N kept lines, `exit: N`
        the exit status it must give (0 unless said).
    <!-- run -->   (or <!-- run | exit: 1 -->)
        runs each line of the block in bash (a line ending in \\ goes on); each must exit 0
        (or N). Nothing is regenerated.
    <!-- ci -->
        the block's lines are lines of `.ci/run`, verbatim: CI runs them on a clean clone.
    <!-- skip: REASON -->
        shown, never run: a GPU, the network, hours of CPU, or an output measured elsewhere.
        The reason is required.
    <!-- file: PATH -->
        the block is the text of PATH (a file in the repo), checked equal (and rewritten).

Blocks in other languages (python, toml, json) are code, not commands: they need no marker.
`run` and `example` blocks share a store and an option `cache: fresh` (a private oracle cache
instead of the user's, for `kparity cache` commands). Each document runs in its own sandbox: a
temporary folder holding a link to every top-level entry of the repository, so relative paths
(`tests/mutants.py`, `examples/...`) work and what a command writes (`.kparity/`, `site/`) stays
there. The examples of one document run in order, so a `compare` sees the `check` runs before
it. Outputs come from this machine's backends (README's from torch CPU and MLX CPU, as CI),
with the output not a terminal (150 columns); run ids and temporary paths are replaced.

Inline code that starts with `kparity ` (outside blocks) is checked too: its verb must exist
and each of its --flags must be one of that verb's.

`--check` writes nothing and exits 1 on a stale example, a failing command, an unmarked block,
a `ci` or `file` block that differs, or a bad inline command, naming each. Without it the
examples are rewritten (other problems are still reported, exit 1).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CI_RUN = ROOT / ".ci" / "run"
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
MARKER = re.compile(r"^ *<!-- (?P<kind>[a-z]+)(?P<rest>.*?) -->\s*$")
KINDS = ("example", "run", "ci", "skip", "file")
COMMAND_LANGS = ("", "sh", "bash", "console", "shell", "text")
# Run-specific text that would make every regeneration a diff: ids, times, paths.
VOLATILE = [(re.compile(r"\b\d{8}T\d{6}Z-[0-9a-f]{10}\b"), "RUN_ID"),
            (re.compile(r"/tmp/\S*?/store\b"), ".kparity")]
INLINE = re.compile(r"`(kparity [^`\n]+)`")
TIMEOUT_S = 900  # one command, at most


@dataclass
class Block:
    doc: Path
    line: int            # the opening fence's line, 1-based
    indent: str
    lang: str
    body: list[str]      # without the indent
    start: int           # index of the first body line
    end: int             # index of the closing fence
    kind: str | None = None
    spec: str = ""
    options: dict = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def documents() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def split_options(text: str, allowed: tuple[str, ...], where: str) -> dict:
    options = {}
    for part in [p.strip() for p in text.split(" | ") if p.strip()]:
        key, _, value = (s.strip() for s in part.partition(":"))
        if key not in allowed:
            raise SystemExit(f"{where}: unknown marker option {key!r} ({', '.join(allowed)})")
        options[key] = value
    return options


def blocks(doc: Path, lines: list[str] | None = None) -> list[Block]:
    """The fenced blocks of a document, each with its marker (if the line before is one)."""
    lines = doc.read_text().splitlines() if lines is None else lines
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, close = m["indent"], i + 1
        while close < len(lines) and lines[close].rstrip() != f"{indent}```":
            close += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                for ln in lines[i + 1:close]]
        block = Block(doc, i + 1, indent, m["lang"], body, i + 1, close)
        marker = MARKER.match(lines[i - 1]) if i else None
        if marker and marker["kind"] in KINDS:
            block.kind, rest = marker["kind"], marker["rest"]
            where = block.where
            if block.kind == "example":
                command, _, opts = rest.lstrip(":").strip().partition(" | ")
                block.spec = command.strip()
                block.options = split_options(opts, ("keep", "head", "exit", "cache"), where)
            elif block.kind == "run":
                block.options = split_options(rest, ("exit", "cache"), where)
            elif block.kind in ("skip", "file"):
                block.spec = rest.lstrip(":").strip()
        found.append(block)
        i = close + 1
    return found


def commands(body: list[str]) -> list[str]:
    """The command lines of a `run` block: comments and blank lines dropped, `\\` joined."""
    out, pending = [], ""
    for line in body:
        if not line.strip() or (not pending and line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((pending + line).strip())
        pending = ""
    return out


def ci_lines() -> list[str]:
    """The command lines of .ci/run that a `# README ...` comment announces."""
    lines = CI_RUN.read_text().splitlines()
    return [line for prev, line in zip(lines, lines[1:])
            if prev.startswith("# README") and line.strip()]


class Sandbox:
    """A temporary folder with a link to every top-level entry of the repository."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.work = tmp / "work"
        self.work.mkdir()
        for entry in ROOT.iterdir():
            if entry.name not in (".kparity", "site"):
                (self.work / entry.name).symlink_to(entry)

    def env(self, options: dict) -> dict:
        env = {**os.environ, "COLUMNS": "150",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                           os.environ.get("PYTHONPATH")]))}
        env.pop("KPARITY_STORE", None)
        if options.get("cache") == "fresh":
            env["KPARITY_CACHE"] = str(self.tmp / "cache")
        return env

    def clean(self, text: str) -> str:
        text = text.replace(str(self.tmp / "cache"), "~/.cache/kparity")
        text = text.replace(str(self.work) + "/", "")
        for pattern, repl in VOLATILE:
            text = pattern.sub(repl, text)
        return text

    def example(self, command: str, options: dict) -> tuple[int, str]:
        argv = shlex.split(command)
        if argv[0] != "kparity":
            raise SystemExit(f"example {command!r}: only kparity commands (use a run block)")
        proc = subprocess.run([sys.executable, "-m", "verbs.cli", *argv[1:]],
                              env=self.env(options), capture_output=True, text=True,
                              cwd=self.work, timeout=TIMEOUT_S)
        return proc.returncode, self.clean(proc.stdout + proc.stderr)

    def shell(self, command: str, options: dict) -> tuple[int, str]:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], env=self.env(options),
                              capture_output=True, text=True, cwd=self.work, timeout=TIMEOUT_S)
        return proc.returncode, proc.stdout + proc.stderr


def render(command: str, output: str, keep: str | None, head: int | None) -> list[str]:
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    if keep:
        lines = [ln for ln in lines if re.search(keep, ln)]
    if head is not None:
        lines = lines[:head]
    return [f"$ {command}", *lines]


def inline_problems(doc: Path, text: str) -> list[str]:
    """Inline `kparity ...` commands whose verb or --flags the CLI does not have."""
    from verbs.cli import parser

    top = parser()
    verbs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    global_flags = {"--store", "--plugin", "--help", "-h"}
    outside = re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S)
    problems = []
    for m in INLINE.finditer(outside):
        tokens = [t.strip("[]()") for t in m[1].replace("|", " ").split()[1:]]
        verb, skip_value = None, False
        for tok in tokens:
            if skip_value:
                skip_value = False
            elif tok in ("--store", "--plugin"):
                skip_value = True
            elif not tok.startswith("-"):
                verb = tok
                break
        if verb is None or not re.fullmatch(r"[a-z][a-z-]*", verb):
            continue  # `kparity --help`, `kparity VERB`: a placeholder
        if verb not in verbs:
            problems.append(f"{doc.relative_to(ROOT)}: `{m[1]}`: no verb {verb!r}")
            continue
        known = set(verbs[verb]._option_string_actions) | global_flags
        for tok in tokens:
            flag = tok.split("=")[0]
            if flag.startswith("-") and flag not in ("-", "--") and flag not in known:
                problems.append(f"{doc.relative_to(ROOT)}: `{m[1]}`: {verb} has no {flag}")
    return problems


def lint(doc: Path) -> list[str]:
    """What is wrong with a document without running anything: a command block with no marker,
    a skip without a reason, a `file` or `ci` block that differs, a bad inline command."""
    text = doc.read_text()
    problems = inline_problems(doc, text)
    ci = set(ci_lines())
    for block in blocks(doc):
        if block.kind is None and block.lang in COMMAND_LANGS:
            problems.append(f"{block.where}: a ```{block.lang} block with no marker "
                            f"(example, run, ci, skip: REASON or file: PATH)")
        elif block.kind == "skip" and not block.spec:
            problems.append(f"{block.where}: skip without a reason")
        elif block.kind == "file":
            path = ROOT / block.spec
            if not path.is_file():
                problems.append(f"{block.where}: file {block.spec} does not exist")
            elif path.read_text().rstrip("\n").splitlines() != block.body:
                problems.append(f"{block.where}: block differs from {block.spec}")
        elif block.kind == "ci":
            problems += [f"{block.where}: not a line of .ci/run: {line}"
                         for line in block.body if line.strip() and line not in ci]
    return problems


def run(doc: Path, check: bool, log=print) -> list[str]:
    """Run a document's `example` and `run` blocks, in order, in one sandbox; rewrite its stale
    examples unless `check`. The problems found (a stale example only with `check`)."""
    text = doc.read_text()
    lines = text.splitlines()
    problems, replacements = [], []
    with tempfile.TemporaryDirectory(prefix="kparity-docs-") as tmp:
        box = Sandbox(Path(tmp))
        for block in blocks(doc, lines):
            if block.kind == "file" and (ROOT / block.spec).is_file():
                body = (ROOT / block.spec).read_text().rstrip("\n").splitlines()
                if body != block.body and not check:  # `lint` reports it under --check
                    replacements.append((block, body))
            if block.kind not in ("example", "run"):
                continue
            want = int(block.options.get("exit", 0))
            if block.kind == "run":
                for command in commands(block.body):
                    log(f"running: {command}")
                    rc, out = box.shell(command, block.options)
                    if rc != want:
                        tail = "\n".join(out.splitlines()[-15:])
                        problems.append(f"{block.where}: `{command}` exited {rc}, not {want}:\n"
                                        f"{tail}")
                continue
            log(f"running: {block.spec}")
            rc, out = box.example(block.spec, block.options)
            if rc != want:
                tail = "\n".join(out.splitlines()[-15:])
                problems.append(f"{block.where}: `{block.spec}` exited {rc}, not {want}:\n{tail}")
            head = block.options.get("head")
            body = render(block.spec, out, block.options.get("keep"), int(head) if head else None)
            if body != block.body:
                replacements.append((block, body))
    replacements = [(b, body) for b, body in replacements if b.kind == "example" or not check]
    if check:
        regenerate = f"python scripts/readme_examples.py {doc.relative_to(ROOT)}"
        problems += [f"{b.where}: stale example: {b.spec} (regenerate: {regenerate})"
                     for b, _ in replacements]
    elif replacements:
        for block, body in sorted(replacements, key=lambda r: -r[0].start):
            lines[block.start:block.end] = [(block.indent + ln) if ln else ln for ln in body]
        doc.write_text("\n".join(lines) + ("\n" if text.endswith("\n") else ""))
        log(f"{doc.relative_to(ROOT)}: {len(replacements)} example(s) regenerated")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each stale example or problem")
    parser.add_argument("files", nargs="*", type=Path,
                        help="documents to run (default: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    docs = [f.resolve() for f in args.files] or documents()
    problems = []
    for doc in docs:
        problems += lint(doc) + run(doc, args.check, log=lambda s: print(s, file=sys.stderr))
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
