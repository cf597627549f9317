"""`kparity compare`, `kparity accept`, `kparity sql`: the store as the memory of a kernel project.

compare  run against run (default: the latest two runs of the same device kind), or a run against
         the last N runs (`--baseline N`): correctness changes and speed changes per (impl, case);
         exit 1 on a regression, so it can gate CI.
accept   writes an annotation row: from that run on, the matching series start a new baseline.
sql      ad-hoc DuckDB queries over the Parquet datasets (views documented in README.md).

Heavy imports (DuckDB) happen inside the verbs: none of this is on the GPU import path.
"""

from __future__ import annotations


def add_parsers(sub, filters) -> None:
    cmp = sub.add_parser("compare", help="run vs run, or vs the last N runs: regressions, exit 1")
    cmp.add_argument("run_a", nargs="?", help="baseline run id (default: the second newest)")
    cmp.add_argument("run_b", nargs="?", help="contender run id (default: the newest)")
    cmp.add_argument("--baseline", type=int, default=None, metavar="N",
                     help="compare the contender with the last N runs as history")
    filters(cmp)
    cmp.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    cmp.add_argument("--z", type=float, default=5.0, help="lookback z-score threshold (5)")
    cmp.add_argument("--min-change", type=float, default=0.05,
                     help="smallest relative change that counts (0.05)")
    cmp.add_argument("--budget-jump", type=float, default=2.0,
                     help="error budget ratio that counts as a correctness regression (2)")
    acc = sub.add_parser("accept", help="accept a change: reset the baseline of an impl or case")
    acc.add_argument("target", help="impl id (backend:name) or case id")
    acc.add_argument("--reason", required=True)
    acc.add_argument("--run", default=None, help="first run of the new baseline (default: newest)")
    acc.add_argument("--metric", default="", choices=("", "median_ns", "budget"),
                     help="only this metric's series (default: every metric)")
    sql = sub.add_parser("sql", help="a DuckDB query over the store (views: README 'Queries')")
    sql.add_argument("query")
    sql.add_argument("--format", choices=("table", "csv", "json"), default="table")


def cmd_compare(args) -> int:
    raise NotImplementedError


def cmd_accept(args) -> int:
    raise NotImplementedError


def cmd_sql(args) -> int:
    raise NotImplementedError
