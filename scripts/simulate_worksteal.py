"""How long would N xdist workers take on this gate? `python3 -m scripts.simulate_worksteal A.xml`

A model, not a measurement: replays the test times of a one-process run (JUnit XML, `-n 0`:
its tests in run order) through xdist's `worksteal` scheduler (xdist/scheduler/worksteal.py,
pytest-xdist 3.8: contiguous equal chunks first; a worker left with fewer than two pending
tests steals the last half of the longest queue, leaving its owner two) and prints the
finishing time in the files' order and in tests/conftest.py's `long_first` order
(tests/long_tests.json's tests first). It leaves out what a real run adds: the workers' start
and collection, and each test's own slow-down beside the other workers. Issue 32's reading of
the gate's Mamba part: benchmarks/README.md "Many GPUs".
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

from scripts.long_tests import node_id
from scripts.same_tests import outcomes
from tests.conftest import long_first

KEEP = 2  # xdist's MIN_PENDING: a worker runs a test once it knows the next one


def xdist_chunks(n: int, workers: int) -> list[int]:
    """The sizes of the first chunks xdist's `worksteal` sends to `workers` idle workers from
    `n` pending tests, in its order (pytest-xdist 3.x `check_schedule`: each the pending count
    over the workers left)."""
    sizes = []
    for left in range(max(workers, 1), 0, -1):
        sizes.append(n // left)
        n -= sizes[-1]
    return sizes


def finish_time(seconds: list[float], workers: int) -> float:
    """When the last of `workers` workers is done with `seconds` (in this order)."""
    start, queues = 0, []
    for size in xdist_chunks(len(seconds), workers):
        queues.append(list(range(start, start + size)))
        start += size
    now, ends = 0.0, {w: seconds[q[0]] for w, q in enumerate(queues) if q}
    while ends:
        worker = min(ends, key=ends.get)
        now = ends.pop(worker)
        queues[worker].pop(0)
        for idle in [w for w in range(workers) if len(queues[w]) < KEEP]:
            victim = max(range(workers), key=lambda w: len(queues[w]))
            take = min(len(queues[victim]) // 2, max(0, len(queues[victim]) - KEEP))
            if take and victim != idle:
                queues[idle] += queues[victim][-take:]
                del queues[victim][-take:]
        for w in range(workers):
            if w not in ends and queues[w]:
                ends[w] = now + seconds[queues[w][0]]
    return now


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", metavar="JUNIT_XML", help="a one-process run (-n 0)")
    ap.add_argument("-n", type=int, default=2, help="workers (default 2)")
    args = ap.parse_args(argv)
    tests = [(node_id(test), t) for test, (_, t) in outcomes(args.run).items()]
    items = [SimpleNamespace(nodeid=node, seconds=t) for node, t in tests]
    long_first(items)  # tests/conftest.py's order under `-n`
    first = [(i.nodeid, i.seconds) for i in items]
    total = sum(t for _, t in tests)
    print(f"{args.run}: {len(tests)} tests, {total:.1f} s; {args.n} workers, modelled: "
          f"{finish_time([t for _, t in tests], args.n):.1f} s in the files' order, "
          f"{finish_time([t for _, t in first], args.n):.1f} s long tests first "
          f"(the ideal: {total / args.n:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
