"""The verbs' console: where a verb prints, a sweep's progress and its time line."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

# Wide enough for impl ids when output is not a terminal (CI logs, pipes).
console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)


# When this command started (`verbs/cli.py`'s `main`): a sweep's time line counts from it.
COMMAND_STARTED = time.monotonic()


def duration(seconds: float) -> str:
    """A person's rounding of a duration: `40 s`, `3 min`, `1.5 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def time_line(first_row: float | None, last_row: float | None, rows: list[dict]) -> str:
    """Where a sweep's wall time went: until its first row (imports, planning, the workers'
    start), from the first row to the last, after it (the summary), and the seconds the rows
    took inside their workers, per device under --devices (summed over more devices than the
    row span: the workers did not keep pace; short of it: time between rows, outside them)."""
    def secs(x: float) -> str:
        return f"{x:.1f} s" if x < 10 else f"{x:.0f} s"
    now = time.monotonic()
    if first_row is None:
        return f"time: {secs(now - COMMAND_STARTED)}, no row"
    from runners.devices import seconds_by_device

    per = ", ".join(f"{'device ' + str(d) + ': ' if d is not None else ''}{secs(sum(s))}"
                    for d, s in seconds_by_device(rows))
    return (f"time: {secs(now - COMMAND_STARTED)}: {secs(first_row - COMMAND_STARTED)} until the "
            f"first row, {secs(last_row - first_row)} of rows ({per} inside the workers), "
            f"{secs(now - last_row)} after the last")


class SweepProgress(Progress):
    """A sweep's progress: rich's bar on a terminal; where the console is no terminal (CI, a
    nightly's log, a pipe) the bar draws nothing, so one plain line every `every` seconds
    says how far the sweep is and, at the pace so far, how long the rest takes
    (`check: 1200/14717 done, 0 failed, 310 s, about 58 min left; now cuda:x bf16`). The task's
    field `field`, followed by `suffix`, is shown after the count."""

    def __init__(self, verb: str, field: str, suffix: str = "", every: float = 30.0):
        super().__init__(TextColumn("[bold]{task.description}"), BarColumn(),
                         MofNCompleteColumn(), TextColumn(f"{{task.fields[{field}]}}{suffix}"),
                         TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                         console=console, transient=True)
        self.verb, self.field, self.suffix, self.every = verb, field, suffix, every
        self.started = self.last_line = time.monotonic()

    def update(self, task_id, **changes) -> None:
        super().update(task_id, **changes)
        if self.console.is_terminal:
            return
        with self._lock:  # --devices threads update it too: one line per period
            now = time.monotonic()
            if now - self.last_line < self.every:
                return
            self.last_line = now
            task = self._tasks[task_id]
            detail = f"{task.fields.get(self.field, '')}{self.suffix}".strip()
            elapsed = now - self.started
            left = (f", about {duration(elapsed * (task.total - task.completed) / task.completed)}"
                    " left" if task.completed and task.total else "")
            line = (f"{self.verb}: {task.completed:.0f}/{task.total:.0f} done, "
                    + (f"{detail}, " if detail else "")
                    + f"{elapsed:.0f} s{left}; now {task.description}")
        self.console.print(escape(line), soft_wrap=True)
