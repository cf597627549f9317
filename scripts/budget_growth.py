"""What the chunked budget scripts share (`scripts/gdn_chunked_budget.py`,
`scripts/ssd_chunked_budget.py`): the budget of a bound against the truth, and the table of it
they print, a row per T with the growth of max B_S over the first row's.
"""

from __future__ import annotations

import numpy as np

DEFAULT_TOKENS = (1, 63, 64, 65, 512, 4096, 16384)


def budget(got, truth, bound) -> float:
    """max(|got − truth| / bound): above 1, a bound that does not hold (0 where got is exact)."""
    err = np.abs(np.asarray(got, dtype=np.float64) - truth)
    return float(np.max(np.where(err == 0, 0.0, err / bound)))


def print_growth(title: str, cols: tuple[str, ...], rows) -> None:
    """`title`, then a markdown table of `cols` over `rows` (dicts, each printed as it comes),
    its "growth" column the row's B_S over the first row's."""
    print(title)
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    first = None
    for row in rows:
        first = first or row["B_S"] or None
        row["growth"] = row["B_S"] / first if first else float("nan")
        print("| " + " | ".join(_fmt(row.get(c)) for c in cols) + " |", flush=True)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    return f"{v:.3g}"
