"""Did two pytest runs give every test the same outcome? `python3 scripts/same_tests.py A.xml B.xml`

Issue 32's test of the gate under pytest-xdist: `pytest -m gpu -n N --junit-xml B.xml` must
pass, skip and fail the tests that one process (`-n 0 --junit-xml A.xml`) does. Compares the
two JUnit files as maps test id -> outcome (passed, skipped, failed, error); prints the counts,
each run's summed test time and its five longest tests (a worker count that does not pay shows
there: more work per test, or a long tail), each difference (at most 20), and exits 1 when
they differ. `--by-file A.xml [B.xml ...]`: instead, per test file the tests run and their
summed seconds in each file given (benchmarks/data/tiers-h100/test-seconds.txt). Standard library
only.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter


def outcomes(path: str) -> dict[str, tuple[str, float]]:
    """test id (classname::name) -> (outcome, seconds), from a pytest JUnit XML file."""
    found = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(
            kinds[0] if kinds else "", "passed")
        found[f"{case.get('classname')}::{case.get('name')}"] = (outcome,
                                                                 float(case.get("time") or 0))
    return found


def by_file(paths: list[str]) -> str:
    """A table: per test file (longest first in the first run), each run's tests and seconds."""
    runs = []
    for path in paths:
        files: dict[str, list] = {}
        for test, (outcome, seconds) in outcomes(path).items():
            name = test.split("::")[0].rsplit(".", 1)[-1] + ".py"
            row = files.setdefault(name, [0, 0.0])
            row[0] += outcome != "skipped"
            row[1] += seconds
        runs.append(files)
    names = sorted(set().union(*runs), key=lambda f: -runs[0].get(f, [0, 0.0])[1])
    lines = [f"{'file':<30}" + "".join(f"{'run ' + str(i + 1) + ' n':>10}{'s':>9}"
                                        for i in range(len(runs)))]
    for name in [*names, "total"]:
        cells = [run.get(name, [0, 0.0]) if name != "total" else
                 [sum(r[0] for r in run.values()), sum(r[1] for r in run.values())] for run in runs]
        lines.append(f"{name:<30}" + "".join(f"{n:>10}{s:>9.1f}" for n, s in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="JUNIT_XML")
    ap.add_argument("--by-file", action="store_true",
                    help="per test file: tests run (not skipped) and summed seconds, per run")
    args = ap.parse_args(argv)
    if args.by_file:
        print(by_file(args.runs))
        return 0
    if len(args.runs) != 2:
        ap.error("two JUnit files to compare (or --by-file with one or more)")
    timed = [outcomes(path) for path in args.runs]
    for path, run in zip(args.runs, timed):
        seconds = sorted(((t, test) for test, (_, t) in run.items()), reverse=True)
        print(f"{path}: {len(run)} tests, {dict(Counter(o for o, _ in run.values()))}, "
              f"test time {sum(t for t, _ in seconds):.1f} s; longest: "
              + ", ".join(f"{test} {t:.1f} s" for t, test in seconds[:5]))
    a, b = ({test: o for test, (o, _) in run.items()} for run in timed)
    differ = sorted(t for t in a.keys() | b.keys() if a.get(t) != b.get(t))
    for test in differ[:20]:
        print(f"{test}: {a.get(test, 'absent')} in A, {b.get(test, 'absent')} in B")
    print(f"DIFFERENT: {len(differ)} tests" if differ else "same outcome for every test")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
