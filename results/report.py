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

import shutil
from pathlib import Path

from results.report_data import ReportData, impl_page_name
from results.report_html import ASSETS, CSS, CSS_FILE, PLOTLY_JS
from results.store import Store

CORRECTNESS_COLUMNS = ["run_id", "case_id", "impl", "op", "backend", "device", "dtype", "dist",
                       "dims", "label", "expect", "status", "message", "budget"]
BENCH_COLUMNS = ["run_id", "case_id", "impl", "op", "backend", "device", "dtype", "dims",
                 "label", "mode", "status", "arm", "median_ns", "q1_ns", "q3_ns",
                 "pct_copy_ceiling"]
AB_DROPPED = {"schema_version"}
MODEL_DROPPED = {"schema_version", "plan_json", "summary_json"}  # long JSON the page never shows


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
