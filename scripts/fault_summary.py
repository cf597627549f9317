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


def main(store: str) -> int:
    runs = Store(store).read("runs").to_pylist()
    if not runs:
        print(f"no runs in {store}")
        return 1
    latest = max(runs, key=lambda r: (r["started"], r["run_id"]))["run_id"]
    rows = [r for r in Store(store).read("correctness").to_pylist() if r["run_id"] == latest]
    print(f"run {latest}: {len(rows)} rows")
    print("\nplanted faults, every row that is not a pass:")
    for r in sorted(rows, key=lambda r: (r["impl"], r["dtype"], r["dist"], r["label"])):
        expected_rejection = r["status"] == "rejected" and r["expect"] == "rejected"
        if r["impl"].startswith("cuda:fault_") and r["status"] != "pass" \
                and not expected_rejection:
            print(f"  {r['impl']:30s} {r['dtype']:4s} {r['dist']:13s} {r['label']:20s} "
                  f"{r['status']:11s} flags={r['flags']} | {r['message'][:160]}")
    counts = defaultdict(Counter)
    for r in rows:
        counts[r["impl"]][r["status"] if r["status"] != "rejected" or r["expect"] != "rejected"
                          else "rejected ok"] += 1
    print("\nstatus counts per impl:")
    for impl, c in sorted(counts.items()):
        print(f"  {impl:40s} " + ", ".join(f"{n} {s}" for s, n in sorted(c.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
