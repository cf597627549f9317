"""The report's data, read once (`ReportData`), and the impl pages' file names: what the pages
(`results/report_pages.py`, `results/report_impl.py`) and the report's writer
(`results/report.py`) share."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from results.runinfo import started_from_id


@dataclass
class ReportData:
    """Everything the pages show, read once."""
    runs: dict[str, dict]              # run_id -> runs row
    correctness: list[dict]
    bench: list[dict]
    ab: list[dict]
    annotations: list[dict]
    alerts: list                       # results.history.Alert
    baseline: int
    model: list[dict] = field(default_factory=list)  # `model` table rows (kparity model)
    judged: tuple[int, int] = (0, 0)   # series judged, series with too little history
    order: list[str] = field(default_factory=list)  # every run id seen, oldest first
    by_impl: dict[str, dict[str, list[dict]]] = field(default_factory=dict)  # impl -> table -> rows
    repro_rows: Counter = field(default_factory=Counter)  # repro run -> its correctness rows

    def __post_init__(self):
        seen = set(self.runs) | {r["run_id"] for t in (self.correctness, self.bench, self.ab,
                                                       self.model) for r in t}
        self.order = sorted(seen, key=lambda run_id: (self.started(run_id), run_id))
        self.repro_rows = Counter(r["run_id"] for r in self.correctness
                                  if self.is_repro(r["run_id"]))
        self.correctness = [r for r in self.correctness if not self.is_repro(r["run_id"])]
        for name in ("correctness", "bench"):  # grouped once: a long history has many rows
            for r in getattr(self, name):
                self.by_impl.setdefault(r["impl"], {"correctness": [], "bench": []})[name].append(r)

    def verb(self, run_id: str) -> str | None:
        return (self.runs.get(run_id) or {}).get("verb")

    def is_repro(self, run_id: str) -> bool:
        return self.verb(run_id) == "repro"

    def every_impl(self, run_id: str) -> bool:
        """A check run without `--impl`: it ran every impl of its ops then registered."""
        filters = (self.runs.get(run_id) or {}).get("filters")
        if self.verb(run_id) != "check" or not filters:
            return False  # not a sweep, or its selection unknown: it proves nothing
        try:
            return not json.loads(filters).get("impl")
        except (TypeError, ValueError, AttributeError):
            return False

    def rows_of(self, impl: str, table: str) -> list[dict]:
        """The impl's rows of `correctness` or `bench`."""
        return self.by_impl.get(impl, {}).get(table, [])

    def started(self, run_id: str) -> datetime:
        """The run's start time; from the sortable run id where its `runs` row is missing."""
        row = self.runs.get(run_id)
        return row["started"] if row and row.get("started") else started_from_id(run_id)

    def latest_check_run(self, rows: list[dict] | None = None) -> str | None:
        """The newest `check` run with correctness rows (among `rows`, default all of them): a
        full sweep, never a repro."""
        with_rows = {r["run_id"] for r in (self.correctness if rows is None else rows)}
        return next((run_id for run_id in reversed(self.order)
                     if run_id in with_rows and self.verb(run_id) == "check"), None)

    def impls(self) -> list[str]:
        return sorted(self.by_impl)

    def retired(self) -> dict[str, str]:
        """impl -> the later check run that ran its op on its backend and device without it
        (module docstring), for impls retired on every device they ran on."""
        pos = {run_id: i for i, run_id in enumerate(self.order)}
        last: dict[tuple, int] = {}    # (impl, op, backend, device) -> its newest run
        cover: dict[tuple, int] = {}   # (op, backend, device) -> newest every-impl check
        for r in self.correctness:
            i, where = pos[r["run_id"]], (r["op"], r["backend"], r["device"])
            last[(r["impl"], *where)] = max(last.get((r["impl"], *where), -1), i)
            if self.every_impl(r["run_id"]):
                cover[where] = max(cover.get(where, -1), i)
        by_impl = defaultdict(list)
        for (impl, *where), i in last.items():
            newer = cover.get(tuple(where), -1)
            by_impl[impl].append(self.order[newer] if newer > i else None)
        return {impl: max(runs) for impl, runs in by_impl.items() if all(runs)}


def impl_page_name(impl: str) -> str:
    """`cuda:kp_rms_norm` -> `impl-cuda_kp_rms_norm.html`: safe on every file system and URL."""
    return "impl-" + re.sub(r"[^A-Za-z0-9_.-]", "_", impl) + ".html"
