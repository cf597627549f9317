"""Bad input: a verb's `UsageError` (printed as one message, exit code 2), the unknown-name error
that lists the valid names closest first, and comma-separated flag values."""

from __future__ import annotations

from cases.casefile import closest


class UsageError(Exception):
    """Bad input: printed as one message, exit code 2."""


def unknown(kind: str, given: str, valid) -> UsageError:
    return UsageError(f"unknown {kind} {given!r}. Valid {kind}s (closest first): "
                      + closest(given, valid))


def split_csv(values) -> list[str]:
    return [v for item in values or [] for v in item.split(",") if v]
