"""Did two pytest runs give every test the same outcome? `python3 scripts/same_tests.py A.xml B.xml`

Issue 32's test of the gate under pytest-xdist: `pytest -m gpu -n N --junit-xml B.xml` must
pass, skip and fail the tests that one process (`-n 0 --junit-xml A.xml`) does. Compares the
two JUnit files as maps test id -> outcome (passed, skipped, failed, error); prints the counts,
each run's summed test time and its five longest tests (a worker count that does not pay shows
there: more work per test, or a long tail), each difference (at most 20), and exits 1 when
they differ. Standard library only.
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs=2, metavar="JUNIT_XML")
    args = ap.parse_args(argv)
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
