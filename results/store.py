"""The result store: Parquet datasets under one root (default `.kparity/`).

Layout: `<root>/<table>/date=YYYY-MM-DD/<run_id>-<part>.parquet`. Each part is written to a
temporary name in the same folder and renamed into place (atomic on POSIX), so a reader never sees
half a file and a run killed mid-sweep keeps every part it flushed. `RowWriter` flushes every
`every` rows and every `seconds`, and on close. No pickle anywhere.
"""

from __future__ import annotations

import os
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


class Store:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_root()

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
        final = folder / f"{run_id}-{part:05d}.parquet"
        tmp = folder / f".{final.name}.tmp-{os.getpid()}"
        pq.write_table(batch, tmp)
        os.replace(tmp, final)
        return final

    def read(self, table: str, filter=None) -> pa.Table:
        """The whole table (every run), or an empty table with the schema."""
        folder = self.root / table
        schema = TABLES[table]
        files = sorted(str(p) for p in folder.glob("date=*/*.parquet")) if folder.exists() else []
        if not files:
            return schema.empty_table()
        dataset = ds.dataset(files, schema=schema, format="parquet")
        return dataset.to_table(filter=filter)


class RowWriter:
    """Buffers rows of one table for one run and flushes them as atomic parts."""

    def __init__(self, store: Store, table: str, run_id: str, every: int = 200,
                 seconds: float = 5.0):
        self.store, self.table, self.run_id = store, table, run_id
        self.every, self.seconds = every, seconds
        self.rows: list[dict] = []
        self.part = 0
        self.last_flush = time.monotonic()
        self.written = 0

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.every or time.monotonic() - self.last_flush > self.seconds:
            self.flush()

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
        self.flush()
