"""`kparity compare`'s report (`results/compare.py`'s `compare`) for a reader: rich tables for the
terminal (`render_table`) or markdown for a PR comment (`render_markdown`).
"""

from __future__ import annotations


CHANGE_TEXT = {"new_case_failure": "new case failing", "new_failure": "new failure",
               "fixed": "fixed", "budget_jump": "budget jump", "budget_drop": "budget drop",
               "still_failing": "still failing"}


def case_text(e: dict) -> str:
    return e["label"].split(":", 1)[-1] or e["case_id"]


def _runs_text(h: dict) -> str:
    """'1 of 10 runs', or '1-3 of 10 runs' when the series' histories differ."""
    lo, hi = h["min_runs"], h["max_runs"]
    return f"{lo if lo == hi else f'{lo}-{hi}'} of {h['needed']} runs"


def headline(report: dict) -> str:
    s = report["summary"]
    extra = [f"{s['not_judged']} not judged ({_runs_text(s['not_judged_history'])})"
             ] if s["not_judged"] else []
    extra += [f"{s[k]} {k}" for k in ("ambiguous", "accepted") if s[k]]
    for table, what, failing in (("correctness", "cases", "new_case_failure"),
                                 ("speed", "timings", "new_failed")):
        c = s[table]
        if c["new_cases"] or c["missing_cases"]:
            new = f"{c['new_cases']} new" + (f" ({c[failing]} failing)" if c[failing] else "")
            extra.append(f"{table}: {new}, {c['missing_cases']} missing {what}")
    return (f"{s['regressions']} regressions, {s['improvements']} improvements, "
            f"{s['unchanged']} unchanged" + "".join(f", {x}" for x in extra))


def against(report: dict, quote: str = "") -> str:
    """'B ... against A ...' (or against the history), run ids between `quote`s."""
    def q(run_id):
        return f"{quote}{run_id}{quote}"
    if report["mode"] == "pair":
        return f"B {q(report['run_b'])} against A {q(report['run_a'])}"
    runs = report["baseline_runs"]
    return (f"{q(report['run_b'])} against the history of {len(runs)} runs "
            f"({q(runs[0])} .. {q(runs[-1])})")


def _fmt(value, spec: str, none: str = "-") -> str:
    return format(value, spec) if value is not None else none


def _status_budget(status: str | None, budget) -> str:
    if status is None:
        return "- (no row)"
    return f"{status} ({budget:.3g})" if budget is not None else status


def _verdict_text(e: dict, needed: int | None) -> str:
    if e["verdict"] == "NOT_JUDGED":
        return f"NOT_JUDGED ({e['history_runs']} of {needed} runs)"
    return e["verdict"]


def _speed_change(e: dict) -> str:
    if e["ratio"] is None:
        return e["status_b"] if e["verdict"] in ("FAILED", "NOT_TIMED", "NEW_FAILED") else "-"
    text = f"{100 * (e['ratio'] - 1):+.1f}%"
    if e["ci_lo"] is not None:
        text += f" [{100 * (e['ci_lo'] - 1):+.1f}%, {100 * (e['ci_hi'] - 1):+.1f}%]"
    if e["z"] is not None:
        text += f" z {e['z']:.1f}"
    return text


def render_table(report: dict, console) -> None:
    """Rich tables (correctness changes, speed), then the one-line summary."""
    from rich.markup import escape
    from rich.table import Table

    colour = {"regression": "red", "improvement": "green", "ambiguous": "yellow",
              "not_judged": "yellow", "unchanged": "cyan"}
    console.print(escape(f"compare {against(report)}"))
    if not report["same_device_kind"]:
        console.print("[yellow]note: the runs are of different device kinds:[/] " + escape(
            f"A {report['devices']['a']}, B {report['devices']['b']}"))
    accepted = any(e["accepted_by"] for e in report["correctness"] + report["speed"])
    if report["correctness"]:
        t = Table(title="correctness changes")
        for col in ("impl", "case", "dtype", "change", "A", "B") + ("accepted",) * accepted:
            t.add_column(col, no_wrap=col in ("impl", "case"))
        for e in report["correctness"]:
            style = "dim" if e["accepted_by"] else colour[e["direction"]]
            t.add_row(e["impl"], escape(case_text(e)), e["dtype"],
                      f"[{style}]{CHANGE_TEXT[e['change']]}[/]",
                      _status_budget(e["status_a"], e["budget_a"]),
                      _status_budget(e["status_b"], e["budget_b"]),
                      *(escape(e["accepted_by"] or ""),) * accepted)
        console.print(t)
    if report["speed"]:
        pair = report["mode"] == "pair"
        t = Table(title="speed: median per call" + ("" if pair else ", history mean as A"))
        for col in ("impl", "case", "dtype", "mode", "A µs", "B µs", "B/A",
                    "95% CI" if pair else "z", "verdict") + ("accepted",) * accepted:
            t.add_column(col, justify="right" if col in ("A µs", "B µs", "B/A", "95% CI", "z")
                         else "left", no_wrap=col in ("impl", "case"))
        for e in report["speed"]:
            ci = (f"[{_fmt(e['ci_lo'], '.3f')}, {_fmt(e['ci_hi'], '.3f')}]"
                  if e["ci_lo"] is not None else "-") if pair else _fmt(e["z"], ".1f")
            style = "dim" if e["accepted_by"] else colour[e["direction"]]
            t.add_row(e["impl"], escape(case_text(e)), e["dtype"], e["mode"],
                      _fmt(e["median_a_ns"] and e["median_a_ns"] / 1e3, ".2f"),
                      _fmt(e["median_b_ns"] and e["median_b_ns"] / 1e3, ".2f"),
                      _fmt(e["ratio"], ".3f"), escape(ci),
                      f"[{style}]{_verdict_text(e, report['thresholds']['min_history'])}[/]",
                      *(escape(e["accepted_by"] or ""),) * accepted)
        console.print(t)
    style = "red" if report["regression"] else "green"
    console.print(f"[{style}]{escape(headline(report))}[/]")


def _budget_change_text(e: dict) -> str:
    if e["z"] is not None:
        return f"z {e['z']:.1f}"
    a, b = e["budget_a"], e["budget_b"]
    return f"budget x{b / a:.3g}" if a and b is not None else ""


def _md_rows(entries: list[dict], needed: int | None) -> list[str]:
    lines = ["| change | impl | case | dtype | mode | A | B | B vs A |",
             "|---|---|---|---|---|---|---|---|"]
    for e in entries:
        if "change" in e:
            cells = [CHANGE_TEXT[e["change"]], e["impl"], case_text(e), e["dtype"], "",
                     _status_budget(e["status_a"], e["budget_a"]),
                     _status_budget(e["status_b"], e["budget_b"]), _budget_change_text(e)]
        else:
            cells = [_verdict_text(e, needed), e["impl"], case_text(e), e["dtype"], e["mode"],
                     _fmt(e["median_a_ns"] and e["median_a_ns"] / 1e3, ".2f") + " µs",
                     _fmt(e["median_b_ns"] and e["median_b_ns"] / 1e3, ".2f") + " µs",
                     _speed_change(e)]
        if e["accepted_by"]:
            cells[0] += f" (accepted: {e['accepted_by']})"
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def render_markdown(report: dict) -> str:
    """A PR comment: headline, regressions, improvements, accepted changes, then the counts."""
    s = report["summary"]
    entries = report["correctness"] + report["speed"]
    title = (f"{s['regressions']} regression{'s' if s['regressions'] != 1 else ''}"
             if report["regression"] else "no regressions")
    th = report["thresholds"]
    out = [f"### kparity compare: {title}", "",
           f"{against(report, quote='`')}; min change {100 * th['min_change']:g} %, budget jump "
           f"{th['budget_jump']:g}x, z {th['z']:g}", ""]
    sections = (("Regressions", [e for e in entries if e["regression"]]),
                ("Improvements", [e for e in entries if e["direction"] == "improvement"]),
                ("Accepted", [e for e in entries if e["accepted_by"]
                              and e["direction"] == "regression"]))
    for name, rows in sections:
        if rows:
            out += [f"#### {name}", "", *_md_rows(rows, th["min_history"]), ""]
    out += ["#### Counts", "", f"**{headline(report)}**", ""]
    for table, name in (("correctness", "correctness"), ("bench", "speed")):
        if table in report["tables"]:
            out.append(f"- {name}: " + ", ".join(f"{v} {k.replace('_', ' ')}"
                                                 for k, v in s[name].items()))
    return "\n".join(out + [""])
