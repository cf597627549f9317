"""HTML pieces of `kparity report`: the page shell, tables, and plotly figures embedded as JSON.

Every string that reaches the HTML goes through `esc`; figure JSON goes through `_script_json`,
which also keeps `</script>` out of an inline script. Pages load `assets/plotly.min.js` and
`assets/report.css` by relative path: nothing is fetched over the network when a page is viewed.
"""

from __future__ import annotations

import html
import json
import math
from datetime import datetime, timezone

ASSETS = "assets"
PLOTLY_JS = "plotly.min.js"
CSS_FILE = "report.css"
NO_ROWS = "no rows yet"

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 1300px;
       padding: 0 1em; color: #222; }
nav { margin-bottom: 1em; padding-bottom: .5em; border-bottom: 1px solid #ccc; }
nav a { margin-right: 1.2em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.ok { background: #d9f2d9; } td.bad { background: #f8d0d0; } td.none { color: #999; }
td.mixed { background: #fff0c0; }
.empty { color: #777; font-style: italic; }
.plot { width: 100%; height: 440px; }
.meta td:first-child { font-weight: 600; }
code { font-size: 12px; }
"""

# Line colours; a series' IQR band uses its line's colour, translucent.
PALETTE = ["#1F77B4", "#FF7F0E", "#2CA02C", "#D62728", "#9467BD", "#8C564B", "#E377C2",
           "#7F7F7F", "#BCBD22", "#17BECF", "#393B79", "#AD494A", "#637939", "#7B4173"]


def esc(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def colour(i: int, alpha: float = 1.0) -> str:
    c = PALETTE[i % len(PALETTE)]
    r, g, b = (int(c[k:k + 2], 16) for k in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def fmt(value, spec: str = ".4g", none: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return none
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return format(value, spec)


def when(ts) -> str:
    """A UTC timestamp as the x value of a figure and the text of a table cell."""
    if ts is None:
        return ""
    if ts.tzinfo is not None:
        ts = ts.astimezone(timezone.utc)
    return ts.strftime("%Y-%m-%d %H:%M:%S")


def link(href: str, text) -> str:
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def table(headers: list[str], rows: list[list], raw: bool = False, numeric=(),
          empty: str = NO_ROWS) -> str:
    """An HTML table, or `empty` said in words. Cells are escaped unless `raw` (then each cell
    is already HTML, or a (html, css class) pair); columns named in `numeric` are right-aligned."""
    if not rows:
        return f'<p class="empty">{esc(empty)}</p>'
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for h, cell in zip(headers, row):
            cls = "num" if h in numeric else ""
            if raw and isinstance(cell, tuple):
                cell, cls = cell
            text = cell if raw else esc(cell)
            cells.append(f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>\n" + "\n".join(body) + "</table>"


def _compact(value):
    """Floats to 4 significant digits (NaN and inf to null): a figure's JSON stays small."""
    if isinstance(value, float):
        return float(f"{value:.4g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_compact(v) for v in value]
    return value


def _script_json(value) -> str:
    text = json.dumps(_compact(value), separators=(",", ":"), allow_nan=False)
    # '<', '>' and '&' occur only inside JSON strings: escaped there, no tag can close the script.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def figure(div_id: str, fig) -> str:
    """A plotly.graph_objects Figure as a div and the inline call that draws it."""
    spec = fig.to_plotly_json()
    config = {"displaylogo": False, "responsive": True}
    return (f'<div id="{esc(div_id)}" class="plot"></div>\n<script>Plotly.newPlot('
            f'{_script_json(div_id)},{_script_json(spec["data"])},{_script_json(spec["layout"])},'
            f'{_script_json(config)});</script>')


def layout(title: str, y_title: str, **extra) -> dict:
    """The shared look: no plotly.py template (its JSON is large), a light grid, legend below."""
    return {"template": "none", "title": {"text": title}, "hovermode": "closest",
            "margin": {"l": 70, "r": 20, "t": 50, "b": 40},
            "xaxis": {"gridcolor": "#eee"},
            "yaxis": {"title": {"text": y_title}, "gridcolor": "#eee"},
            "legend": {"orientation": "h", "y": -0.15}, **extra}


def hline(y: float, text: str) -> dict:
    """A dashed horizontal line across the plot, for layout.shapes."""
    return {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": y, "y1": y,
            "line": {"color": "#c00", "dash": "dash", "width": 1},
            "label": {"text": text, "textposition": "end", "yanchor": "bottom",
                      "font": {"size": 11, "color": "#c00"}}}


def standalone_page(title: str, body: str) -> str:
    """A page that stands alone (its CSS inline, no plotly, no links to the report's other
    pages): what `kparity ops --html` writes."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f"<title>{esc(title)}</title>\n<style>{CSS}</style></head><body>\n"
            f"<h1>{esc(title)}</h1>\n{body}\n</body></html>\n")


def page(title: str, body: str) -> str:
    """Every page loads plotly (from disk, relative to the page) whether or not it plots."""
    script = f'<script src="{ASSETS}/{PLOTLY_JS}" charset="utf-8"></script>\n'
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{esc(title)}</title>\n"
            f'<link rel="stylesheet" href="{ASSETS}/{CSS_FILE}">\n{script}</head><body>\n'
            f'<nav>{link("index.html", "overview")}{link("regressions.html", "regressions")}'
            f'{link("ab.html", "A/B")}<span class="empty">generated {stamp}</span></nav>\n'
            f"<h1>{esc(title)}</h1>\n{body}\n</body></html>\n")
