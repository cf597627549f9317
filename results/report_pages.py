"""The overview, regressions, A/B and model pages of `kparity report` (impl pages: `report_impl.py`).
Each page function takes the `ReportData` and returns the page's HTML; an empty table gives a
page that says so."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict

from oracle.dtypes import FLOAT_DTYPES
from results.history import MIN_HISTORY
from results.report_data import ReportData, impl_page_name
from results.report_html import (NO_ROWS, colour, esc, figure, fmt, hline, layout, link, page,
                                 table, when)
from results.report_impl import case_text
from runners.verdicts import is_failure, outcome

STATUS_ORDER = ["pass", "fail", "error", "rejected", "rejected ok", "timeout", "crash",
                "xpass", "xfail", "quarantined", "unsupported"]


def _counts_text(rows: list[dict]) -> str:
    c = Counter(outcome(r) for r in rows)
    return ", ".join(f"{c[s]} {s}" for s in sorted(c, key=lambda s: (_status_order(s), s)))


def _json_pairs(text: str | None) -> str:
    """`{"torch": "cpu"}` -> `torch: cpu`."""
    try:
        return "; ".join(f"{k}: {v}" for k, v in json.loads(text or "{}").items())
    except (TypeError, ValueError):
        return text or ""


def _run_meta(run_id: str, run: dict | None) -> str:
    if run is None:
        return f'<p class="empty">run {esc(run_id)} has no runs row</p>'
    sha = (run.get("git_sha") or "?")[:12] + (" (dirty)" if run.get("git_dirty") else "")
    rows = [("run id", run_id), ("verb", run.get("verb")), ("started", when(run.get("started"))),
            ("command", run.get("command")), ("git sha", sha), ("host", run.get("host")),
            ("platform", run.get("platform")), ("devices", _json_pairs(run.get("devices"))),
            ("versions", _json_pairs(run.get("versions")))]
    return '<table class="meta">' + "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>"
                                            for k, v in rows) + "</table>"


def _matrix(rows: list[dict]) -> str:
    """op x impl rows, one column per dtype: each cell the counts by status, coloured."""
    dtypes = sorted({r["dtype"] for r in rows},
                    key=lambda d: (FLOAT_DTYPES.index(d) if d in FLOAT_DTYPES else 99, d))
    cells = defaultdict(list)
    for r in rows:
        cells[(r["op"], r["impl"], r["dtype"])].append(r)
    body = []
    for op, impl in sorted({(r["op"], r["impl"]) for r in rows}):
        line = [esc(op), link(impl_page_name(impl), impl)]
        for d in dtypes:
            got = cells.get((op, impl, d), [])
            if not got:
                line.append(("-", "none"))
                continue
            failing = sum(is_failure(r) for r in got)
            cls = "ok" if not failing else ("bad" if failing == len(got) else "mixed")
            line.append((esc(_counts_text(got)), cls))
        body.append(line)
    return (table(["op", "impl", *dtypes], body, raw=True)
            + '<p class="empty">green: every row as expected; amber: some failing; red: all '
              "failing (fail, error, an unexpected rejection, timeout, crash)</p>")


def _impl_index(data: ReportData) -> str:
    """Current impls: the latest check of each; retired ones (`ReportData.retired`) apart."""
    retired = data.retired()
    rows, gone = [], []
    for impl in data.impls():
        corr = data.rows_of(impl, "correctness")
        latest = data.latest_check_run(corr) or ""
        now = [r for r in corr if r["run_id"] == latest]
        timed = sum(r["status"] == "ok" for r in data.rows_of(impl, "bench"))
        line = [link(impl_page_name(impl), impl), esc(_counts_text(now) or "-"),
                esc(latest or "-")]
        if impl in retired:
            gone.append(line + [esc(retired[impl])])
        else:
            rows.append(line + [(str(timed), "num")])
    out = table(["impl page", "latest check of the impl", "its run", "timed rows"], rows,
                raw=True)
    if gone:
        out += (f"<h3>retired impls ({len(gone)})</h3><p>not in a later check that ran their "
                "op on their backend and device for every impl registered then (a plugin "
                "loaded once, or an impl since removed): history only</p>"
                + table(["impl page", "its last check", "its run", "left out of check"], gone,
                        raw=True))
    return out


def _runs_table(data: ReportData) -> str:
    n = Counter(r["run_id"] for t in (data.correctness, data.bench, data.ab, data.model)
                for r in t)
    n.update(data.repro_rows)
    rows = []
    for run_id in reversed(data.order):
        run = data.runs.get(run_id, {})
        verb = run.get("verb", "?")
        rows.append([run_id, verb + (" (not in the history)" if verb == "repro" else ""),
                     when(data.started(run_id)), _json_pairs(run.get("devices")), n[run_id]])
    return table(["run id", "verb", "started (UTC)", "devices", "rows"], rows, numeric={"rows"})


def _status_order(status: str) -> int:
    return STATUS_ORDER.index(status) if status in STATUS_ORDER else len(STATUS_ORDER)


def index_page(data: ReportData) -> str:
    latest = data.latest_check_run()
    parts = []
    if latest is None:  # the headline is a full sweep: a repro of a few cases is none
        parts.append(f'<h2>latest check</h2><p class="empty">{NO_ROWS}: run `kparity check`</p>')
    else:
        rows = [r for r in data.correctness if r["run_id"] == latest]
        failing = sum(is_failure(r) for r in rows)
        verdict = f"FAILED: {failing} of {len(rows)} failing" if failing else f"OK: {len(rows)}"
        counts = sorted(Counter(outcome(r) for r in rows).items(),
                        key=lambda kv: _status_order(kv[0]))
        parts += [f"<h2>latest check: {esc(verdict)}</h2>",
                  _run_meta(latest, data.runs.get(latest)), "<h3>counts by status</h3>",
                  table(["status", "rows"], [list(kv) for kv in counts], numeric={"rows"}),
                  "<h3>op &times; impl &times; dtype</h3>", _matrix(rows)]
    parts += ["<h2>pages</h2><p>" + link("regressions.html", "regressions and accepted changes")
              + " &middot; " + link("ab.html", "A/B results")
              + (" &middot; " + link("model.html", "model gate") if data.model else "")
              + "</p>", _impl_index(data),
              f"<h2>runs ({len(data.order)})</h2>", _runs_table(data)]
    return page("kparity report", "\n".join(parts))


# --- regressions -------------------------------------------------------------------------------

def _case_names(data: ReportData) -> dict[str, str]:
    return {r["case_id"]: f"{case_text(r)} {r['dtype']}" for t in (data.correctness, data.bench)
            for r in t}


def _value(metric: str, v) -> str:
    return f"{fmt(v / 1e3)} µs" if metric == "median_ns" and v is not None else fmt(v)


def _alert_rows(data: ReportData, alerts: list, accepted: bool) -> list[list]:
    names = _case_names(data)
    rows = []
    for a in alerts:
        k = a.key
        row = [esc(k.metric), link(impl_page_name(k.impl), k.impl),
               esc(f"{names.get(k.case_id, '')} ({k.case_id})"), esc(k.mode or "-"),
               esc(k.device), esc(a.run_id), esc(a.kind), esc(a.direction),
               (esc(_value(k.metric, a.baseline)), "num"), (esc(_value(k.metric, a.value)), "num"),
               (esc(fmt(a.change, "+.1%")), "num"), (esc(fmt(a.z, ".1f")), "num")]
        rows.append(row + ([esc(a.accepted_by)] if accepted else []))
    return rows


def regressions_page(data: ReportData) -> str:
    heads = ["metric", "impl", "case", "mode", "device", "run", "kind", "direction",
             "baseline", "value", "change", "z"]
    num = {"baseline", "value", "change", "z"}
    pending = [a for a in data.alerts if not a.accepted_by]
    regressed = [a for a in pending if a.direction == "regression"]
    improved = [a for a in pending if a.direction != "regression"]
    accepted = [a for a in data.alerts if a.accepted_by]
    notes = sorted(data.annotations, key=lambda r: r.get("created") or data.started(r["run_id"]),
                   reverse=True)
    judged, short = data.judged
    body = [f"<p>Each series (metric, impl, case, mode, device) over the last {data.baseline} "
            f"runs with rows (<code>--baseline</code>): lookback z-score and step detection "
            f"(<code>results/history.py</code>); lower is better for both metrics.</p>",
            f"<p>{judged} series judged; {short} not judged (fewer than {MIN_HISTORY} runs "
            f"before their newest): no verdict for their newest run.</p>",
            f"<h2>regressions ({len(regressed)})</h2>",
            table(heads, _alert_rows(data, regressed, False), raw=True, numeric=num),
            f"<h2>accepted changes ({len(accepted)})</h2>",
            table(heads + ["accepted by"], _alert_rows(data, accepted, True), raw=True,
                  numeric=num),
            f"<h2>improvements ({len(improved)})</h2>",
            table(heads, _alert_rows(data, improved, False), raw=True, numeric=num),
            f"<h2>annotations ({len(notes)})</h2>",
            table(["created (UTC)", "from run", "kind", "target", "metric", "reason"],
                  [[when(r.get("created")), r["run_id"], r.get("kind"), r.get("target"),
                    r.get("metric") or "every metric", r.get("reason")] for r in notes])]
    return page("regressions and accepted changes", "\n".join(body))


# --- A/B ---------------------------------------------------------------------------------------

def _median_us(values) -> float | None:
    return statistics.median(values) / 1e3 if values else None


def _ab_figure(rows: list[dict]):
    """B/A with its 95 % interval, the newest row of each (pair, mode, case), a trace per pair."""
    import plotly.graph_objects as go

    newest = {}
    for r in rows:  # rows are oldest first: the later row wins
        if r["status"] == "ok" and r["ratio"] is not None:
            newest[(r["impl_a"], r["impl_b"], r["mode"], case_text(r), r["dtype"])] = r
    pairs = defaultdict(list)
    for (a, b, mode, _, _), r in sorted(newest.items()):
        pairs[f"{b} vs {a} ({mode})"].append(r)
    fig = go.Figure(layout=layout("B/A run-median ratio, 95 % interval (below 1: B is faster)",
                                  "B/A", shapes=[hline(1.0, "same speed")]))
    for i, (name, rs) in enumerate(pairs.items()):
        ratio = [r["ratio"] for r in rs]
        fig.add_trace(go.Scatter(
            x=[f"{case_text(r)} {r['dtype']}" for r in rs], y=ratio, mode="markers", name=name,
            marker={"color": colour(i), "size": 9},
            error_y={"type": "data", "symmetric": False,
                     "array": [(r["ci_hi"] or q) - q for r, q in zip(rs, ratio)],
                     "arrayminus": [q - (r["ci_lo"] or q) for r, q in zip(rs, ratio)]},
            customdata=[f"{r['run_id']} {r['verdict']}" for r in rs],
            hovertemplate="%{x}<br>B/A %{y:.3f}<br>run %{customdata}"))
    return fig if pairs else None


def ab_page(data: ReportData) -> str:
    rows = sorted(data.ab, key=lambda r: (data.started(r["run_id"]), r["run_id"]))
    fig = _ab_figure(rows)
    body = [figure("fig-ab", fig) if fig else f'<p class="empty">{NO_ROWS}: run `kparity ab`</p>',
            f"<h2>every A/B case ({len(rows)}), newest first</h2>",
            table(["run", "A", "B", "case", "dtype", "mode", "A µs", "B µs", "B/A", "95% CI",
                   "δ", "verdict", "status"],
                  [[r["run_id"], r["impl_a"], r["impl_b"], case_text(r), r["dtype"], r["mode"],
                    fmt(_median_us(r["runs_a_ns"])), fmt(_median_us(r["runs_b_ns"])),
                    fmt(r["ratio"], ".3f"),
                    f"[{fmt(r['ci_lo'], '.3f')}, {fmt(r['ci_hi'], '.3f')}]",
                    fmt(r["delta"], ".1%"), r["verdict"] or "-",
                    r["status"] + (f": {r['message'][:200]}" if r.get("message") else "")]
                   for r in reversed(rows)],
                  numeric={"A µs", "B µs", "B/A", "95% CI", "δ"})]
    return page("A/B results", "\n".join(body))


# --- model -------------------------------------------------------------------------------------

GATE_CLASS = {"pass": "ok", "fail": "bad"}  # `report` rows are not gated: no colour


def _plus_minus(value, unc, spec: str = ".3g", scale: float = 1.0) -> str:
    if value is None:
        return "-"
    return f"{fmt(value * scale, spec)} ± {fmt(None if unc is None else unc * scale, spec)}"


def _newest_model_rows(rows: list[dict]) -> list[dict]:
    """The newest run's row of each (model, plan, text); `rows` are oldest first."""
    newest = {(r["model"], r["plan"], r["text"]): r for r in rows}
    return [newest[k] for k in sorted(newest)]


def _model_table(data: ReportData, rows: list[dict]) -> str:
    heads = ["model", "plan", "text", "run", "positions", "mean KLD", "median KLD", "KLD 99 %",
             "max KLD", "same top %", "RMS Δp %", "flips (near ties)", "gate", "decode tok/s",
             "ms/token", "step", "eager tok/s", "roofline tok/s", "batch tok/s",
             "prefill tok/s"]
    body = []
    for r in rows:
        reasons = f": {r['gate_reasons']}" if r.get("gate_reasons") else ""
        body.append([esc(r["model"]), esc(r["plan"]), esc(r["text"]), esc(r["run_id"]),
                     (fmt(r["positions"], "d"), "num"),
                     (esc(_plus_minus(r["mean_kld"], r["mean_kld_unc"])), "num"),
                     *[(fmt(r[k], ".3g"), "num") for k in ("median_kld", "kld_99", "max_kld")],
                     (esc(_plus_minus(r["same_top_p"], r["same_top_p_unc"], ".4g", 100)), "num"),
                     (esc(_plus_minus(r["rms_dp"], r["rms_dp_unc"], ".3g", 100)), "num"),
                     (f"{fmt(r['flips'], 'd')} ({fmt(r.get('near_ties'), 'd')})", "num"),
                     (esc((r["gate"] or "-") + reasons), GATE_CLASS.get(r["gate"], "")),
                     *[(fmt(r[k], ".4g"), "num") for k in ("decode_tok_s", "ms_per_token")],
                     esc(r.get("decode_mode") or "-"),
                     *[(fmt(r.get(k), ".4g"), "num") for k in ("eager_tok_s", "roofline_tok_s")],
                     (_with_size(r.get("batch_tok_s"), r.get("batch_size")), "num"),
                     (_with_size(r.get("prefill_tok_s"), r.get("prefill_tokens")), "num")])
    return table(heads, body, raw=True)


def _with_size(tok_s, size) -> str:
    """tokens/s with the batch or prompt size it was measured at: "3389 (8)"; "-" if none."""
    return "-" if tok_s is None else f"{fmt(tok_s, '.4g')} ({fmt(size, 'd')})"


def _model_figure(data: ReportData, rows: list[dict], title: str):
    """One (model, plan) over runs: mean KLD (log, with its ±) per text on the left axis,
    decode tok/s per text (dashed, where the run timed it) on the right."""
    import plotly.graph_objects as go

    by_text = defaultdict(dict)
    for r in rows:  # oldest first: a run's last row of a text wins
        by_text[r["text"]][r["run_id"]] = r
    # KLD spans orders of magnitude between plans and runs; a log axis draws no 0 (the
    # reference plan against itself), so an all-zero series keeps a linear axis.
    log = any((r["mean_kld"] or 0) > 0 for r in rows)
    y_title = "mean KLD" + (" (log)" if log else "")
    fig = go.Figure(layout=layout(title, y_title,
                                  yaxis={"type": "log" if log else "linear",
                                         "title": {"text": y_title}, "gridcolor": "#eee"},
                                  yaxis2={"title": {"text": "decode tok/s"}, "overlaying": "y",
                                          "side": "right", "rangemode": "tozero"},
                                  margin={"l": 70, "r": 70, "t": 50, "b": 40}))
    for i, (text, per_run) in enumerate(sorted(by_text.items())):
        pts = sorted(per_run.values(), key=lambda r: (data.started(r["run_id"]), r["run_id"]))
        x = [when(data.started(p["run_id"])) for p in pts]
        runs = [p["run_id"] for p in pts]
        fig.add_trace(go.Scatter(
            x=x, y=[p["mean_kld"] for p in pts], name=f"mean KLD {text}", mode="lines+markers",
            line={"color": colour(i)}, customdata=runs,
            error_y={"type": "data", "array": [p["mean_kld_unc"] or 0.0 for p in pts]},
            hovertemplate="run %{customdata}<br>%{x}<br>mean KLD %{y:.3g}"))
        if any(p["decode_tok_s"] for p in pts):
            fig.add_trace(go.Scatter(
                x=x, y=[p["decode_tok_s"] for p in pts], name=f"decode tok/s {text}",
                mode="lines+markers", yaxis="y2", line={"color": colour(i), "dash": "dash"},
                customdata=runs, hovertemplate="run %{customdata}<br>%{x}<br>%{y:.4g} tok/s"))
    return fig


def model_page(data: ReportData) -> str:
    rows = sorted(data.model, key=lambda r: (data.started(r["run_id"]), r["run_id"]))
    body = ["<p>The model gate (<code>kparity model</code>): each plan's logits against the "
            "float64 reference plan over the committed texts, llama-perplexity's KLD "
            "statistics; gate: mean KLD &le; 1e-4 and same top &ge; 99 % with the near ties "
            "counted as agreeing, and no flip beyond <code>models.metrics.margin_bound</code> "
            "(<code>models.metrics.gate</code>); <code>report</code> rows are not gated. "
            "Step: <code>graph</code> where the decode step was replayed as a CUDA graph.</p>",
            "<h2>newest run of each model, plan and text</h2>",
            _model_table(data, _newest_model_rows(rows)),
            "<h2>over runs</h2>"]
    plans = defaultdict(list)
    for r in rows:
        plans[(r["model"], r["plan"])].append(r)
    for i, ((model, plan), rs) in enumerate(sorted(plans.items())):
        title = f"{model}: plan {plan}"
        body += [f"<h3>{esc(title)}</h3>", figure(f"fig-model-{i}", _model_figure(data, rs, title))]
    if not rows:
        body.append(f'<p class="empty">{NO_ROWS}: run `kparity model`</p>')
    return page("model gate", "\n".join(body))
