"""`kparity report` (a static, self-contained HTML dashboard of the store) and `kparity nightly`
(check + bench + compare against history + report, for a cron job or a CI schedule).

Plotting imports happen inside the verbs: none of this is on the GPU import path.
"""

from __future__ import annotations


def add_parsers(sub, filters) -> None:
    rep = sub.add_parser("report", help="static HTML dashboard of the store")
    rep.add_argument("--out", required=True, help="output folder (created)")
    rep.add_argument("--baseline", type=int, default=20,
                     help="runs of history for the regression page (20)")
    nightly = sub.add_parser("nightly", help="check + bench + compare + report")
    filters(nightly)
    nightly.add_argument("--out", required=True, help="report folder")
    nightly.add_argument("--baseline", type=int, default=10, help="runs of history (10)")
    nightly.add_argument("--no-bench", action="store_true", help="correctness only")


def cmd_report(args) -> int:
    raise NotImplementedError


def cmd_nightly(args) -> int:
    raise NotImplementedError
