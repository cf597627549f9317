"""The result store: Parquet datasets under one root (default `.kparity/`).

Layout: `<root>/<table>/date=YYYY-MM-DD/<run_id>-<part>.parquet`. Each part is written to a
temporary name in the same folder and renamed into place (atomic on POSIX), so a reader never sees
half a file. `RowWriter` flushes every `every` rows and every `seconds`, and on close. No pickle
anywhere.

Nothing finished is lost when the process dies (SIGKILL included): before a row waits for its
part, `RowWriter` appends it to a journal, `<root>/.journal/<table>/<run_id>.jsonl`, one JSON line
`{"part": P, "row": {...}}` per row, written through to the OS at once (a killed process loses
only what it had not yet handed to the kernel: the row being written). A clean close deletes the
journal. Readers take the journal's rows whose part P was never written, so a killed run's last
rows read like any other; `recover(table, run_id)` turns them into a part (`kparity check
--resume` does). A line cut short by the kill is ignored.

A part that cannot be read (truncated, not Parquet) is skipped and named in `Store.skipped`
(path, reason) and on stderr; the rest of the store stays readable.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from results.schema import SCHEMA_VERSION, TABLES


class StoreError(RuntimeError):
    pass


def default_root() -> Path:
    return Path(os.environ.get("KPARITY_STORE", ".kparity"))


JOURNAL = ".journal"


def part_name(run_id: str, part: int) -> str:
    return f"{run_id}-{part:05d}.parquet"


def _journal_entries(path: Path) -> list[dict]:
    """The journal's complete lines; a last line cut short by a kill is dropped."""
    entries = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                break  # only the line being written when the process died can be partial
    return entries


def unwritten_rows(journal: Path, written: set[str]) -> list[dict]:
    """The journal's rows whose part (a file name in `written`) was never written."""
    run_id = journal.stem
    return [e["row"] for e in _journal_entries(journal)
            if part_name(run_id, e["part"]) not in written]


class Store:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_root()
        self.skipped: dict[Path, str] = {}  # unreadable parts met by `parts`, and why

    def ensure_writable(self) -> None:
        """Fail before any kernel runs if the store cannot be written."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise StoreError(f"result store {self.root} is not writable ({e.strerror}); "
                             f"pass --store DIR or set KPARITY_STORE") from None

    def write(self, table: str, rows: list[dict], run_id: str, part: int) -> Path | None:
        if not rows:
            return None
        schema = TABLES[table]
        rows = [{**r, "schema_version": SCHEMA_VERSION} for r in rows]
        batch = pa.Table.from_pylist(rows, schema=schema)
        day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
        folder = self.root / table / f"date={day}"
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / part_name(run_id, part)
        tmp = folder / f".{final.name}.tmp-{os.getpid()}"
        pq.write_table(batch, tmp)
        os.replace(tmp, final)
        return final

    def parts(self, table: str) -> list[Path]:
        """The table's readable parts; unreadable ones go to `self.skipped`, named on stderr."""
        folder = self.root / table
        good = []
        for path in sorted(folder.glob("date=*/*.parquet")) if folder.exists() else []:
            try:
                pq.read_metadata(path)
                good.append(path)
            except (OSError, ValueError, pa.ArrowException) as e:
                if path not in self.skipped:
                    self.skipped[path] = str(e).splitlines()[0]
                    print(f"kparity: skipping unreadable part {path} ({self.skipped[path]})",
                          file=sys.stderr)
        return good

    def read(self, table: str, filter=None) -> pa.Table:
        """The whole table (every run, journaled rows of killed runs too), or an empty table
        with the schema."""
        schema = TABLES[table]
        files = self.parts(table)
        pieces = []
        if files:
            pieces.append(ds.dataset([str(f) for f in files], schema=schema,
                                     format="parquet").to_table(filter=filter))
        written = {f.name for f in files}
        for journal in sorted(self._journal_dir(table).glob("*.jsonl")):
            rows = unwritten_rows(journal, written)
            if rows:
                got = pa.Table.from_pylist([{**r, "schema_version": SCHEMA_VERSION}
                                            for r in rows], schema=schema)
                pieces.append(got.filter(filter) if filter is not None else got)
        if not pieces:
            return schema.empty_table()
        return pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]

    def _journal_dir(self, table: str) -> Path:
        return self.root / JOURNAL / table

    def has_journal(self, table: str) -> bool:
        """Whether a killed run left unwritten rows of `table` in its journal."""
        return any(self._journal_dir(table).glob("*.jsonl"))

    def journal_path(self, table: str, run_id: str) -> Path:
        return self._journal_dir(table) / f"{run_id}.jsonl"

    def next_part(self, table: str, run_id: str) -> int:
        """The part number after every part this run has written (or journaled) so far."""
        used = [int(p.stem.rsplit("-", 1)[1]) for p in self.parts(table)
                if p.stem.rsplit("-", 1)[0] == run_id]
        journal = self.journal_path(table, run_id)
        used += [e["part"] for e in _journal_entries(journal)] if journal.exists() else []
        return max(used) + 1 if used else 0

    def recover(self, table: str, run_id: str) -> int:
        """Writes a killed run's journaled rows of `table` as a part, deletes the journal;
        returns how many rows it recovered."""
        journal = self.journal_path(table, run_id)
        if not journal.exists():
            return 0
        rows = unwritten_rows(journal, {f.name for f in self.parts(table)})
        if rows:
            self.write(table, rows, run_id, self.next_part(table, run_id))
        journal.unlink()
        return len(rows)


def _plain(value):
    """NumPy scalars and arrays as their Python values (json's fallback for rows)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"row value {value!r} ({type(value).__name__}) has no JSON form")


class RowWriter:
    """Buffers rows of one table for one run and flushes them as atomic parts."""

    def __init__(self, store: Store, table: str, run_id: str, every: int = 200,
                 seconds: float = 5.0, first_part: int = 0):
        self.store, self.table, self.run_id = store, table, run_id
        self.every, self.seconds = every, seconds
        self.rows: list[dict] = []
        self.part = first_part
        self.last_flush = time.monotonic()
        self.written = 0
        self.journal_path = store.journal_path(table, run_id)
        self.journal = None  # opened at the first row

    def add(self, row: dict) -> None:
        if self.journal is None:
            self.journal_path.parent.mkdir(parents=True, exist_ok=True)
            self.journal = open(self.journal_path, "a", encoding="utf-8")
        # one line per row, handed to the OS before the row counts as done
        self.journal.write(json.dumps({"part": self.part, "row": row}, default=_plain) + "\n")
        self.journal.flush()
        self.rows.append(row)
        if len(self.rows) >= self.every or time.monotonic() - self.last_flush > self.seconds:
            self.flush()

    def close(self) -> None:
        """Flushes the tail; the journal goes once every row is in a part."""
        self.flush()
        if self.journal is not None:
            self.journal.close()
            self.journal = None
            self.journal_path.unlink(missing_ok=True)

    def flush(self) -> None:
        if self.rows:
            self.store.write(self.table, self.rows, self.run_id, self.part)
            self.written += len(self.rows)
            self.part += 1
            self.rows = []
        self.last_flush = time.monotonic()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
