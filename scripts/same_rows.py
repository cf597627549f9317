"""Do two check runs have the same rows? `python3 scripts/same_rows.py STORE_A STORE_B`

Issue 32's test of a spread sweep (`--devices`, `--ray`, `pytest -n`): it must give the rows
the plain run gives. Compares the newest check run of each store as multisets of (impl, case
id, expect, status); prints the counts, each difference (at most 20 of each side), the devices
each run used (`device_index`) with their worker seconds (the rows' `seconds`, timed inside
the workers: summed, and the median row; a spread run whose sum exceeds the plain run's did
more work per row), and exits 1 when they differ. Needs pyarrow only (no DuckDB: the GPU image
lacks it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter

from results.store import Store
from runners.devices import seconds_by_device

KEY = ("impl", "case_id", "expect", "status")


def newest_check_rows(path: str) -> tuple[str, list[dict]]:
    """(run id, rows) of the store's newest `check` run."""
    store = Store(path)
    runs = [r for r in store.read("runs").to_pylist() if r.get("verb") == "check"]
    if not runs:
        sys.exit(f"{path}: no check run in this store")
    run_id = max(runs, key=lambda r: r["run_id"])["run_id"]
    rows = [r for r in store.read("correctness").to_pylist() if r["run_id"] == run_id]
    return run_id, rows


def worker_seconds(rows: list[dict]) -> str:
    """`device: sum s (median ms)` per device_index, from the rows' `seconds`."""
    return ", ".join(f"{d}: {sum(v):.1f} s (median {statistics.median(v) * 1e3:.2f} ms)"
                     for d, v in seconds_by_device(rows))


def grown(a: list[dict], b: list[dict], most: int) -> list[str]:
    """Lines: the `most` impls whose summed worker seconds grew most from run A to run B (the
    devices B ran each on), then the gross growth (impls that grew) by backend."""
    def per_impl(rows):
        out: dict[str, list[dict]] = {}
        for r in rows:
            out.setdefault(r["impl"], []).append(r)
        return out
    in_a, in_b = per_impl(a), per_impl(b)
    change = {i: sum(r["seconds"] or 0.0 for r in in_b.get(i, []))
              - sum(r["seconds"] or 0.0 for r in rs) for i, rs in in_a.items()}
    lines = []
    for impl in sorted(change, key=change.get, reverse=True)[:most]:
        before = sum(r["seconds"] or 0.0 for r in in_a[impl])
        devices = sorted({r.get("device_index") for r in in_b.get(impl, [])}, key=str)
        lines.append(f"  {impl:36s} {len(in_a[impl]):4d} rows  {before:5.1f} -> "
                     f"{before + change[impl]:5.1f} s  on {devices}")
    by_backend = Counter()
    for impl, delta in change.items():
        by_backend[impl.split(":")[0]] += max(delta, 0.0)
    lines.append(f"  gross growth {sum(by_backend.values()):.1f} s: " + ", ".join(
        f"{b} {s:.1f} s" for b, s in by_backend.most_common()))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", nargs=2, metavar="STORE")
    ap.add_argument("--grown", type=int, metavar="N", default=0,
                    help="also list the N impls whose worker seconds grew most from A to B")
    args = ap.parse_args(argv)
    counts, runs = [], []
    for path in args.stores:
        run_id, rows = newest_check_rows(path)
        runs.append(rows)
        devices = Counter(r.get("device_index") for r in rows)
        print(f"{path}: run {run_id}, {len(rows)} rows, by device_index {dict(devices)}")
        print("  worker seconds by device_index: " + worker_seconds(rows))
        counts.append(Counter(tuple(r[k] for k in KEY) for r in rows))
    if args.grown:
        print(f"the {args.grown} impls whose worker seconds grew most from A to B (summed over "
              "their rows; the devices B ran them on):")
        print("\n".join(grown(runs[0], runs[1], args.grown)))
    only_a, only_b = counts[0] - counts[1], counts[1] - counts[0]
    for name, only in (("only in A", only_a), ("only in B", only_b)):
        for key, n in list(only.items())[:20]:
            print(f"{name}: {n} x {dict(zip(KEY, key))}")
    same = not only_a and not only_b
    print("same rows (impl, case id, expect, status)" if same else
          f"DIFFERENT: {sum(only_a.values())} rows only in A, {sum(only_b.values())} only in B")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
