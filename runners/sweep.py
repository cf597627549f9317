"""The sweep's executor, at the top of `runners/`: in order in one place (`runners.isolation`),
one worker per device (`runners.devices`) or as Ray tasks (`runners.ray_sweep`)."""

from __future__ import annotations

from contextlib import contextmanager

from runners.isolation import case_runner, serial_rows


@contextmanager
def runner_for(args, work, say=lambda text, **_: print(text)):
    """The sweep's executor: yields `rows(work, one) -> iterator of (w, row)`, every item of
    `work` once, in the order the rows complete. `one(w, run_case) -> row` is the caller's: it
    turns one item into its row given `run_case(w, run_id) -> row` (the check of one case
    where this executor runs cases: `case_runner`'s function, one per device), with the run id,
    repeats and ledger bound (`verbs/check.py::run_work`). The caller is the only writer of
    rows: an executor hands them back, never stores them. The caller may stop early (break,
    --maxfail): closing the iterator must stop the executor's work and its processes.

    An executor:
    - calls `one` once per item (from any thread: `one` is thread-safe), with a `run_case`
      bound to where it runs the item, and yields each row it returns as it completes;
    - may tag rows (`device_index`, a store column) before yielding them;
    - raises `DeviceUnusable` once no device of it can go on (rows so far yielded), and on
      KeyboardInterrupt yields the rows already complete, then re-raises it.
    The serial one (`serial_rows`) runs them in order in one isolated worker (or in this
    process); `--devices` deals them to one worker per device (`runners/devices.py`); `--ray`
    sends them to a Ray cluster's hosts as tasks (`runners/ray_sweep.py`). `say(text)` prints
    an executor's lines (the sweep's console, so its progress bar stays intact)."""
    if getattr(args, "ray", None):
        from runners.ray_sweep import ray_rows

        with ray_rows(args) as rows:
            yield rows
        return
    if getattr(args, "devices", None):
        from runners.devices import device_rows

        with device_rows(args, work, say) as rows:
            yield rows
        return
    with case_runner(args, work) as run_case:
        yield serial_rows(run_case)
