"""Bad input: a verb's `UsageError` (printed as one message, exit code 2), the unknown-name error
that lists the valid names closest first, and comma-separated flag values."""

from __future__ import annotations

from cases.casefile import closest


class UsageError(Exception):
    """Bad input: printed as one message, exit code 2."""


LINE = 116  # the longest line a bad-input message should print (readable in 120 columns)
# The command that lists every valid name of a kind, for a bad-name message that shows a few.
LISTED_BY = {"op": "`kparity ops`", "impl": "`kparity ops`", "family": "`kparity ops`",
             "preset": "`kparity cases --list`",
             "run": '`kparity sql "SELECT run_id, verb FROM runs"`',
             "check run": '`kparity sql "SELECT run_id FROM runs"`',
             "namespace": "`kparity cache info`"}


def unknown(kind: str, given: str, valid) -> UsageError:
    """An unknown name, in two lines: what was given, then the valid names closest first (as
    many as fit LINE, with the command that lists them all)."""
    kinds = f"{kind[:-1]}ies" if kind.endswith("y") else f"{kind}s"
    listed_by = LISTED_BY.get(kind, "")
    head = f"  Valid {kinds} (closest first): "
    return UsageError(f"unknown {kind} {given!r}\n{head}"
                      + closest(given, valid, listed_by, LINE - len(head)))


def split_csv(values) -> list[str]:
    return [v for item in values or [] for v in item.split(",") if v]
