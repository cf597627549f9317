"""Summarise a seed sweep (scripts/seed_sweep.sh): per impl, checks, failures and the largest
budget over every seed's store; then each failing row with its repro."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.dataset as ds


def main(out: str) -> int:
    rows = []
    for store in sorted(Path(out).glob("store-*")):
        rows += ds.dataset(store / "correctness", format="parquet").to_table(
            columns=["impl", "status", "expect", "budget", "case_json", "case_id", "message"]
        ).to_pylist()
    print("| impl | checks | failing | max budget |")
    print("|---|---|---|---|")
    failing = []
    for impl in sorted({r["impl"] for r in rows}):
        mine = [r for r in rows if r["impl"] == impl]
        bad = [r for r in mine if r["status"] not in ("pass", "rejected")
               or (r["status"] == "rejected" and r["expect"] != "rejected")]
        failing += bad
        budget = max((r["budget"] for r in mine if r["budget"] is not None), default=0.0)
        print(f"| {impl} | {len(mine)} | {len(bad)} | {budget:.4g} |")
    for r in failing:
        seed = json.loads(r["case_json"])["seed"]
        print(f"FAIL {r['impl']} seed {seed} case {r['case_id']}: {r['message'][:200]}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/seed-sweep"))
