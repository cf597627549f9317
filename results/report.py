"""`kparity report`: the store as a static, self-contained HTML site.

    index.html        the latest full sweep (the newest `kparity check` run: op x impl x dtype
                      matrix, counts, run metadata), links to every page, the impls (those
                      retired apart, see below), and every run
    impl-<id>.html    one per impl: latency (median, IQR band), % of the copy ceiling and the
                      error budget over runs
    regressions.html  regressions against the last N runs (`results.history.regressions`),
                      accepted changes, the annotations table
    ab.html           every A/B verdict, and B/A with its 95 % interval per case
    model.html        the model gate (`kparity model`): the newest run's row per (model, plan,
                      text), and mean KLD and decode tok/s over runs per (model, plan); written
                      and linked only when the store has `model` rows

Which runs. `kparity repro` runs (`runs.verb`) rerun a few cases without the known-issues
ledger: they are listed with the runs (marked) but are never the headline nor a point of any
series (their rows stay in the store). An impl is retired, listed apart and not as current,
when a later check run ran its op on its backend and device without `--impl` (so every impl of
that op then registered ran) and it had no row there: an impl a plugin registered once, or one
since removed. The SQL `latest` view (results/query.py) applies the same two rules.

Pages read `assets/plotly.min.js` (copied from the installed plotly package) and
`assets/report.css` by relative path, so the folder can be copied anywhere and opened offline.
Rows come from `Store.read` only; the columns a page never shows (raw samples, case JSON) are
dropped before rows become Python dicts.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from results.report_html import ASSETS, CSS, CSS_FILE, PLOTLY_JS
from results.runinfo import started_from_id
from results.store import Store

CORRECTNESS_COLUMNS = ["run_id", "case_id", "impl", "op", "backend", "device", "dtype", "dist",
                       "dims", "label", "expect", "status", "message", "budget"]
BENCH_COLUMNS = ["run_id", "case_id", "impl", "op", "backend", "device", "dtype", "dims",
                 "label", "mode", "status", "arm", "median_ns", "q1_ns", "q3_ns",
                 "pct_copy_ceiling"]
AB_DROPPED = {"schema_version"}
MODEL_DROPPED = {"schema_version", "plan_json", "summary_json"}  # long JSON the page never shows


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


def _rows(store: Store, table: str, columns: list[str] | None = None) -> list[dict]:
    t = store.read(table)
    return (t.select(columns) if columns else t).to_pylist()


def load(store: Store, baseline: int) -> ReportData:
    from results.history import scan

    runs = {r["run_id"]: r for r in _rows(store, "runs")}
    ab = [{k: v for k, v in r.items() if k not in AB_DROPPED} for r in _rows(store, "ab")]
    model = [{k: v for k, v in r.items() if k not in MODEL_DROPPED}
             for r in _rows(store, "model")]
    alerts, judged, short = scan(store, baseline=baseline)
    return ReportData(runs=runs, correctness=_rows(store, "correctness", CORRECTNESS_COLUMNS),
                      bench=_rows(store, "bench", BENCH_COLUMNS), ab=ab,
                      annotations=_rows(store, "annotations"), alerts=alerts,
                      baseline=baseline, model=model, judged=(judged, short))


def copy_assets(out: Path) -> None:
    """plotly.min.js once (it is 4.8 MB: skipped when the copy there has the same size), and the
    stylesheet."""
    import plotly

    assets = out / ASSETS
    assets.mkdir(parents=True, exist_ok=True)
    source = Path(plotly.__file__).parent / "package_data" / PLOTLY_JS
    target = assets / PLOTLY_JS
    if not target.exists() or target.stat().st_size != source.stat().st_size:
        shutil.copyfile(source, target)
    (assets / CSS_FILE).write_text(CSS)


def write_report(store: Store, out: str | Path, baseline: int = 20) -> list[Path]:
    """Writes every page under `out` (created); returns the page paths, index first."""
    from results.report_impl import impl_page
    from results.report_pages import ab_page, index_page, model_page, regressions_page

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    copy_assets(out)
    data = load(store, baseline)
    pages = {"index.html": index_page(data)}
    for impl in data.impls():
        pages[impl_page_name(impl)] = impl_page(data, impl)
    pages["regressions.html"] = regressions_page(data)
    pages["ab.html"] = ab_page(data)
    if data.model:
        pages["model.html"] = model_page(data)
    written = []
    for name, text in pages.items():
        path = out / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)  # a viewer reloading mid-write never sees half a page
        written.append(path)
    return written
