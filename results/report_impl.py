"""One impl's page of `kparity report`: its series over runs.

    latency           plain `bench` rows (not A/B arms) that were timed: the median per call per
                      (case, dtype, mode, device), with the q1..q3 band
    % of copy         the same series as a share of the run's measured copy ceiling
    error budget      correctness rows of valid cases: per (case label, dtype, device), the
                      worst budget over the label's cases (distributions, edge shapes) in each
                      run, with the bound at 1.0; the hover names the worst case. One trace per
                      case would be hundreds on a full sweep; the worst of a label is what moves
                      towards the bound first.

A trace is named "<label> <dtype> <mode>" (budget: "<label> <dtype>"), with " @ <device>" when
the impl ran on more than one device; the x axis is the run's start time, the hover its run id.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict

from results.report_html import NO_ROWS, colour, esc, figure, fmt, hline, layout, page, table, when
from runners.verdicts import is_failure, outcome, repro_command


def case_text(row: dict) -> str:
    """`bench:decode-1x4096` -> `decode-1x4096`, `preset:qwen3-8b` -> `qwen3-8b`."""
    return (row.get("label") or "").split(":", 1)[-1] or row.get("dims") or "?"


def _by_series(rows: list[dict], key, data) -> dict[tuple, list[dict]]:
    """rows grouped by `key(row)`, each group one row per run (the run's last), oldest first."""
    series = defaultdict(dict)
    for r in rows:
        series[key(r)][r["run_id"]] = r
    return {k: sorted(per_run.values(), key=lambda r: (data.started(r["run_id"]), r["run_id"]))
            for k, per_run in sorted(series.items())}


def _name(parts: tuple, device: str, many_devices: bool) -> str:
    return " ".join(parts) + (f" @ {device}" if many_devices else "")


def _timed_series(data, rows: list[dict]):
    timed = [r for r in rows if r["status"] == "ok" and not r["arm"] and r["median_ns"]]
    many = len({r["device"] for r in timed}) > 1
    return _by_series(timed, lambda r: (case_text(r), r["dtype"], r["mode"], r["device"]),
                      data), many


def latency_figure(data, rows: list[dict]):
    import plotly.graph_objects as go

    series, many = _timed_series(data, rows)
    if not series:
        return None
    fig = go.Figure(layout=layout("latency: median per call, band q1..q3", "µs (log)",
                                  yaxis={"type": "log", "title": {"text": "µs (log)"},
                                         "gridcolor": "#eee"}))
    for i, ((label, dtype, mode, device), pts) in enumerate(series.items()):
        name = _name((label, dtype, mode), device, many)
        x = [when(data.started(p["run_id"])) for p in pts]
        q1 = [(p["q1_ns"] or p["median_ns"]) / 1e3 for p in pts]
        q3 = [(p["q3_ns"] or p["median_ns"]) / 1e3 for p in pts]
        # The band: one closed polygon (q3 forwards, q1 backwards), toggled with its line.
        fig.add_trace(go.Scatter(x=x + x[::-1], y=q3 + q1[::-1], fill="toself", name=f"{name} IQR",
                                 mode="none", fillcolor=colour(i, 0.18), hoverinfo="skip",
                                 showlegend=False, legendgroup=name))
        fig.add_trace(go.Scatter(x=x, y=[p["median_ns"] / 1e3 for p in pts], name=name,
                                 mode="lines+markers", legendgroup=name,
                                 line={"color": colour(i)},
                                 customdata=[p["run_id"] for p in pts],
                                 hovertemplate="run %{customdata}<br>%{x}<br>%{y:.4g} µs"))
    return fig


def copy_figure(data, rows: list[dict]):
    import plotly.graph_objects as go

    series, many = _timed_series(data, [r for r in rows if r["pct_copy_ceiling"] is not None])
    if not series:
        return None
    fig = go.Figure(layout=layout("% of the run's measured copy ceiling", "% of copy",
                                  shapes=[hline(100.0, "copy ceiling")]))
    top = max(p["pct_copy_ceiling"] for pts in series.values() for p in pts)
    fig.update_yaxes(range=[0, max(110.0, 1.05 * top)])  # from 0, the ceiling in view
    for i, ((label, dtype, mode, device), pts) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=[when(data.started(p["run_id"])) for p in pts],
                                 y=[p["pct_copy_ceiling"] for p in pts],
                                 name=_name((label, dtype, mode), device, many),
                                 mode="lines+markers", line={"color": colour(i)},
                                 customdata=[p["run_id"] for p in pts],
                                 hovertemplate="run %{customdata}<br>%{x}<br>%{y:.1f} %"))
    return fig


def budget_figure(data, rows: list[dict]):
    import plotly.graph_objects as go

    checked = [r for r in rows if r["expect"] == "valid" and r["budget"] is not None]
    many = len({r["device"] for r in checked}) > 1
    worst = {}  # (label, dtype, device, run) -> the worst row
    for r in checked:
        k = (case_text(r), r["dtype"], r["device"], r["run_id"])
        if k not in worst or r["budget"] > worst[k]["budget"]:
            worst[k] = r
    series = _by_series(list(worst.values()), lambda r: (case_text(r), r["dtype"], r["device"]),
                        data)
    if not series:
        return None
    finite = [r["budget"] for pts in series.values() for r in pts if math.isfinite(r["budget"])]
    top = max(finite, default=1.0)
    fig = go.Figure(layout=layout("error budget: worst case of each label per run (bound 1.0)",
                                  "max |out - exact| / bound", shapes=[hline(1.0, "bound")]))
    fig.update_yaxes(range=[0, max(1.1, 1.05 * top)])  # the bound stays in view
    for i, ((label, dtype, device), pts) in enumerate(series.items()):
        fig.add_trace(go.Scatter(
            x=[when(data.started(p["run_id"])) for p in pts], y=[p["budget"] for p in pts],
            name=_name((label, dtype), device, many), mode="lines+markers",
            line={"color": colour(i)},
            customdata=[f"{p['run_id']}<br>worst case {p['case_id']} {p['dist']} {p['dims']}"
                        for p in pts],
            hovertemplate="run %{customdata}<br>%{x}<br>budget %{y:.3g}"))
    return fig


def _failures(impl: str, rows: list[dict], command: str) -> str:
    """The failing rows of a run, each with its repro line (naming the run's plugins: the impl
    may be one of theirs)."""
    bad = [r for r in rows if is_failure(r)]
    plugins = "".join(f" --plugin {p}" for p in re.findall(r"--plugin[= ](\S+)", command or ""))
    return table(["case", "label", "dtype", "dist", "dims", "status", "message", "repro"],
                 [[r["case_id"], r["label"], r["dtype"], r["dist"], r["dims"], r["status"],
                   (r["message"] or "")[:200],
                   repro_command(impl, r["case_id"]).replace("kparity", "kparity" + plugins, 1)]
                  for r in bad], empty="none")


def declared_order(impl: str) -> str:
    """What the impl declares about the order of its sums, as registered now (`Impl.numerics`;
    `kparity ops --matrix` shows the same): the bounds of its rows assume it."""
    import gpu_impls

    registered = gpu_impls.impls().get(impl)
    if registered is None:
        return "sum order: (not registered here)"
    if callable(registered.numerics):
        return "sum order: declared per case (the kernel's own plans, from its shape)"
    if registered.declares_order:
        return f"sum order: declared, {registered.numerics}"
    return "sum order: undeclared (every order admitted: the widest bound)"


def impl_page(data, impl: str) -> str:
    corr, bench = data.rows_of(impl, "correctness"), data.rows_of(impl, "bench")
    latest = data.latest_check_run(corr)
    now = [r for r in corr if r["run_id"] == latest]
    ops = ", ".join(sorted({r["op"] for r in corr + bench}))
    devices = ", ".join(sorted({r["device"] for r in corr + bench}))
    body = [f"<p>op {esc(ops)}; devices {esc(devices)}; {len(corr)} correctness rows, "
            f"{len(bench)} bench rows in the store; {esc(declared_order(impl))}.</p>"]
    if latest:
        counts = Counter(outcome(r) for r in now)
        worst = max((r["budget"] for r in now if r["budget"] is not None), default=None)
        body += [f"<h2>latest check (run {esc(latest)})</h2><p>"
                 + esc(", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                       + f"; worst budget {fmt(worst, '.3g')}") + "</p>",
                 "<h3>failing rows</h3>",
                 _failures(impl, now, data.runs.get(latest, {}).get("command"))]
    for title, div, fig in (("latency", "fig-latency", latency_figure(data, bench)),
                            ("% of copy ceiling", "fig-copy", copy_figure(data, bench)),
                            ("error budget", "fig-budget", budget_figure(data, corr))):
        body.append(f"<h2>{esc(title)}</h2>")
        body.append(figure(div, fig) if fig else f'<p class="empty">{NO_ROWS}</p>')
    return page(impl, "\n".join(body))
