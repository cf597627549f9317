"""The gate's long tests, from JUnit files: `python3 -m scripts.long_tests A.xml [B.xml ...]`

Writes tests/long_tests.json: {pytest node id (`stable_node_id`): seconds} for each test that took at least
`--min` seconds (default 5) in any of the runs (its longest time). Under pytest-xdist the
gate runs these first, longest first (tests/conftest.py): left at the end of a worker's
queue, a 25 s test is taken whole by a worker that runs out of work while the others idle
(the gate's Mamba part on two H100s: 1.41x from two workers where its test time allowed
about 1.9x; benchmarks/README.md "Many GPUs"). Regenerate from a full gate's JUnit file:
`python3 -m pytest -m gpu --junit-xml gate.xml` then this script (`--update`: from a commit-tier
run, keeping the table's times of the tests it did not run).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from scripts.same_tests import outcomes

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tests" / "long_tests.json"


def node_id(test: str) -> str:
    """JUnit's `classname::name` (tests.test_x[.Class]::name) as pytest's node id
    (tests/test_x.py[::Class]::name)."""
    classname, name = test.split("::", 1)
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if (ROOT / path).is_file():
            return "::".join([path, *parts[i:], name])
    raise SystemExit(f"{test}: no test file for {classname!r} under {ROOT}")


CASE_ID = re.compile(r"-[0-9a-f]{12}\]$")


def stable_node_id(node: str) -> str:
    """`node` with a trailing case id (`test_gate[torch:sdpa-2ce218aeca51]`) as `-*`: a case's
    id hashes its op's oracle version (`cases/model.py`), so an oracle edit renames every such
    test, and a table keyed by the old names would order nothing. Keyed per impl instead, each
    of an impl's cases sorts as its longest one (its first call compiles, whichever runs it)."""
    return CASE_ID.sub("-*]", node)


def long_tests(paths: list[str], least: float, old: dict | None = None) -> dict[str, float]:
    """{stable node id: its longest time} over the runs, for those of `least` seconds or more;
    with `old` (a table), its entries for tests none of the runs ran are kept (a commit-tier
    run leaves the nightly tests' times as they were)."""
    longest: dict[str, float] = {}
    ran: set[str] = set()
    for path in paths:
        for test, (_, seconds) in outcomes(path).items():
            key = stable_node_id(node_id(test))
            ran.add(key)
            if seconds >= least:
                longest[key] = round(max(seconds, longest.get(key, 0.0)), 1)
    for key, seconds in (old or {}).items():
        if key not in ran:
            longest[key] = seconds
    return dict(sorted(longest.items(), key=lambda kv: -kv[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="JUNIT_XML")
    ap.add_argument("--min", type=float, default=5.0, help="seconds (default 5)")
    ap.add_argument("--out", default=str(TABLE))
    ap.add_argument("--update", action="store_true",
                    help="keep the --out table's entries for the tests these runs did not run")
    args = ap.parse_args(argv)
    out = Path(args.out)
    old = json.loads(out.read_text()) if args.update and out.is_file() else None
    table = long_tests(args.runs, args.min, old)
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{args.out}: {len(table)} tests of {args.min:g} s or more")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
