"""Regenerate the README's example outputs from the commands themselves.

    python scripts/readme_examples.py [--check]

Each example in README.md is a marker line followed by a fenced block:

    <!-- example: kparity cases --op rms_norm --invalid | keep: ^[┃│] | head: 12 -->
    ```
    ...replaced by `$ <command>` and what it prints...
    ```

The command runs in a fresh temporary store (shared by the examples in README order, so a
`compare` sees the `check` runs before it), on this machine's backends, with the output not a
terminal (150 columns). `keep: REGEX` keeps only matching lines (rows shortened), `head: N`
the first N kept lines. `--check` writes nothing and exits 1 if any block would change, naming
it. CPU examples only: GPU outputs in the README come from `benchmarks/` and say so.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
MARKER = re.compile(r"^<!-- example: (?P<spec>.+?) -->\n```[a-z]*\n(?P<body>.*?)^```\n",
                    re.M | re.S)
# Run-specific text that would make every regeneration a diff: ids, times, paths.
VOLATILE = [(re.compile(r"\b\d{8}T\d{6}Z-[0-9a-f]{10}\b"), "RUN_ID"),
            (re.compile(r"/tmp/\S*?/store"), ".kparity")]


def parse(spec: str) -> tuple[str, str | None, int | None]:
    """(command, keep regex, head count) from a marker's text."""
    command, *options = [part.strip() for part in spec.split(" | ")]
    keep = head = None
    for option in options:
        key, _, value = option.partition(":")
        if key.strip() == "keep":
            keep = value.strip()
        elif key.strip() == "head":
            head = int(value)
        else:
            raise SystemExit(f"README marker {spec!r}: unknown option {key!r} (keep, head)")
    return command, keep, head


def run(command: str, store: str) -> str:
    argv = shlex.split(command)
    if argv[0] != "kparity":
        raise SystemExit(f"README marker runs {argv[0]!r}: only kparity commands")
    env = {**os.environ, "KPARITY_STORE": store, "COLUMNS": "150"}
    proc = subprocess.run([sys.executable, "-m", "verbs.cli", *argv[1:]], env=env,
                          capture_output=True, text=True, cwd=README.parent)
    text = proc.stdout + proc.stderr
    for pattern, repl in VOLATILE:
        text = pattern.sub(repl, text)
    return text


def render(command: str, output: str, keep: str | None, head: int | None) -> str:
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    if keep:
        lines = [ln for ln in lines if re.search(keep, ln)]
    if head is not None:
        lines = lines[:head]
    return "\n".join([f"$ {command}", *lines]) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each block that would change")
    args = parser.parse_args(argv)
    text = README.read_text()
    changed = []
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "store")

        def replace(match: re.Match) -> str:
            command, keep, head = parse(match["spec"])
            print(f"running: {command}", file=sys.stderr)
            body = render(command, run(command, store), keep, head)
            if body != match["body"]:
                changed.append(command)
            fence = match[0].splitlines()[1]
            return f"<!-- example: {match['spec']} -->\n{fence}\n{body}```\n"

        new = MARKER.sub(replace, text)
    if args.check:
        for command in changed:
            print(f"stale README example: {command}")
        return 1 if changed else 0
    README.write_text(new)
    print(f"{len(changed)} README example(s) regenerated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
