"""How a verb stops early: Ctrl-C or SIGTERM ends a sweep with one line (what was kept in the
store and, for `check`, the command that runs the rest), never a traceback; exit 130 (SIGINT)
or 143 (SIGTERM), a shell's codes."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading

from rich.markup import escape

from results.store import Store
from verbs.console import console
from verbs.selection import global_flags


class Terminated(KeyboardInterrupt):
    """SIGTERM (a cancelled CI job, `timeout`, `kill`), raised in the main thread where Ctrl-C
    raises KeyboardInterrupt (`sigterm_interrupts`): the same stop (finished rows kept, workers
    and the oracle pool ended, one line), exit 143 (a shell's code for SIGTERM)."""


@contextlib.contextmanager
def sigterm_interrupts():
    """SIGTERM raises `Terminated` meanwhile; a second one, while the first stops the sweep, is
    ignored. Off the main thread (a test calling `main` from a thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_kind(e: KeyboardInterrupt) -> tuple[str, int]:
    """How a KeyboardInterrupt (or `Terminated`) is named in a stop's line, and its exit code."""
    return ("terminated (SIGTERM)", 143) if isinstance(e, Terminated) else ("interrupted", 130)


class Interrupted(Exception):
    """Ctrl-C or SIGTERM (`stop`) during a sweep, after its finished rows (of `table`) were
    written: what was kept, and how to run the rest (`check --resume`)."""

    def __init__(self, args, verb: str, run_id: str, store: Store, stop: KeyboardInterrupt,
                 table: str = "correctness"):
        import pyarrow.compute as pc

        self.how, self.code = stop_kind(stop)
        kept = store.read(table, filter=pc.field("run_id") == run_id).num_rows
        what = "rows" if table == "correctness" else f"{table} rows"
        rest = f"; the rest: {resume_command(args, run_id)}" if verb == "check" else ""
        super().__init__(f"{kept} {what} of run {run_id} kept in {store.root}/{rest}")


@contextlib.contextmanager
def keeping_rows_on_stop(args, verb: str, run_id: str, store: Store, table: str):
    """Ctrl-C or SIGTERM inside becomes `Interrupted` (the rows kept): outermost, so the row
    writers inside have closed before it counts."""
    try:
        yield
    except KeyboardInterrupt as e:
        raise Interrupted(args, verb, run_id, store, e, table) from None


def resume_command(args, run_id: str) -> str:
    """The command that runs what check run `run_id` left (its store and plugins named again)."""
    ray = f" --ray {args.ray}" if getattr(args, "ray", None) else ""  # its cluster again
    return f"kparity{global_flags(args)} check --resume {run_id}{ray}"


def interruptible(verb):
    """A verb that Ctrl-C ends with one line (exit 130, a shell's code for SIGINT), and SIGTERM
    likewise (exit 143), not a traceback."""
    @functools.wraps(verb)
    def run(args) -> int:
        try:
            return verb(args)
        except Interrupted as e:
            console.print(f"[yellow]{e.how}[/]: {escape(str(e))}", soft_wrap=True)
            return e.code
        except KeyboardInterrupt as e:  # before or after the sweep: no row was being written
            how, code = stop_kind(e)
            console.print(f"[yellow]{how}[/] outside the sweep: rows already written stay in "
                          "the store")
            return code
    return run
