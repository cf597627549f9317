"""Markdown report of A/B results from one or more stores (directories or .tgz of a store).

    python3 scripts/bench_report.py benchmarks/data/rmsnorm-h100/store-*.tgz > REPORT.md

Per A/B row: verdict, ratio and interval, and for each arm the run medians' spread
((max - min) / median) and B's bandwidth as % of the copy ceiling measured in the same run.
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds


def _rows(root: Path, table: str) -> list[dict]:
    files = sorted(str(p) for p in root.rglob(f"{table}/date=*/*.parquet"))
    return ds.dataset(files, format="parquet").to_table().to_pylist() if files else []


def _spread(values) -> float:
    v = np.asarray(values, dtype=np.float64)
    return float((v.max() - v.min()) / np.median(v))


def report(roots: list[Path]) -> str:
    lines = []
    for root in roots:
        ab = _rows(root, "ab")
        bench = _rows(root, "bench")
        ceilings = {c["run_id"]: c for c in _rows(root, "ceilings")}
        groups: dict[tuple, list[dict]] = {}
        for r in ab:
            groups.setdefault((r["run_id"], r["impl_a"], r["impl_b"], r["mode"]), []).append(r)
        for (run_id, a, b, mode), rows in groups.items():
            copy = ceilings.get(run_id, {}).get("copy_gbps")
            lines += [f"### B = `{b}` against A = `{a}` ({mode}, run `{run_id}`)", "",
                      f"Copy ceiling in this run: {copy:.0f} GB/s." if copy else "", "",
                      "| case | dtype | A µs | B µs | B/A | 95% CI | δ | verdict | A spread "
                      "| B spread | B % copy |", "|---|---|---|---|---|---|---|---|---|---|---|"]
            for r in sorted(rows, key=lambda r: (r["label"], r["dtype"])):
                if r["status"] != "ok":
                    lines.append(f"| {r['label']} | {r['dtype']} | {r['status']}: "
                                 f"{r['message'][:80]} |||||||||")
                    continue
                runs_b = [x for x in bench if x["ab_id"] == r["ab_id"] and x["arm"] != "A"
                          and x["impl"] == r["impl_b"]]  # `ab A B C`: one ab_id, arms B, C
                pct = np.median([x["pct_copy_ceiling"] for x in runs_b]) if runs_b else None
                lines.append(
                    f"| {r['label'].split(':', 1)[-1]} | {r['dtype']} "
                    f"| {np.median(r['runs_a_ns']) / 1e3:.2f} | {np.median(r['runs_b_ns']) / 1e3:.2f} "
                    f"| {r['ratio']:.3f} | [{r['ci_lo']:.3f}, {r['ci_hi']:.3f}] "
                    f"| {100 * r['delta']:.1f}% | **{r['verdict']}** "
                    f"| {100 * _spread(r['runs_a_ns']):.2f}% | {100 * _spread(r['runs_b_ns']):.2f}% "
                    f"| {pct:.1f}% |" if pct is not None else "| - |")
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        roots = []
        for i, arg in enumerate(argv):
            path = Path(arg)
            if path.suffix == ".tgz":
                dest = Path(tmp) / str(i)
                with tarfile.open(path) as tar:
                    tar.extractall(dest, filter="data")
                path = dest
            roots.append(path)
        print(report(roots))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
