"""Issue 6, done-when 1: what a fault sweep's store says. Every row of a planted fault
(`cuda:fault_*`, tests/faults_cuda.py) that is not a pass, and each other impl's status counts.

    python3 scripts/fault_summary.py STORE
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results.store import Store  # noqa: E402
from runners.verdicts import outcome  # noqa: E402


def main(root: str) -> int:
    import pyarrow.compute as pc

    store = Store(root)
    checks = [r for r in store.read("runs").to_pylist() if r["verb"] == "check"]
    if not checks:
        print(f"no check runs in {root}")
        return 1
    latest = max(checks, key=lambda r: (r["started"], r["run_id"]))["run_id"]
    rows = store.read("correctness", filter=pc.field("run_id") == latest).to_pylist()
    print(f"run {latest}: {len(rows)} rows")
    print("\nplanted faults, every row that is not a pass:")
    for r in sorted(rows, key=lambda r: (r["impl"], r["dtype"], r["dist"], r["label"])):
        if r["impl"].startswith("cuda:fault_") and outcome(r) not in ("pass", "rejected ok"):
            print(f"  {r['impl']:30s} {r['dtype']:4s} {r['dist']:13s} {r['label']:20s} "
                  f"{r['status']:11s} flags={r['flags']} | {r['message'][:160]}")
    counts = defaultdict(Counter)
    for r in rows:
        counts[r["impl"]][outcome(r)] += 1
    print("\nstatus counts per impl:")
    for impl, c in sorted(counts.items()):
        print(f"  {impl:40s} " + ", ".join(f"{n} {s}" for s, n in sorted(c.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
