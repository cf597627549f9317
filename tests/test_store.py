"""The Parquet store: atomic parts, rows kept when a run dies mid-way, schema on read."""

from __future__ import annotations

import pytest

from results.schema import CORRECTNESS, SCHEMA_VERSION
from results.store import RowWriter, Store


def _row(i: int) -> dict:
    return {"run_id": "r1", "case_id": f"c{i:03d}", "impl": "torch:x", "status": "pass",
            "budget": i / 10, "max_ulp": i}


def test_interrupted_run_keeps_flushed_rows(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(RuntimeError):
        with RowWriter(store, "correctness", "r1", every=3, seconds=1e9) as writer:
            for i in range(7):
                writer.add(_row(i))
            raise RuntimeError("kernel crashed the sweep")
    # __exit__ flushed the tail too: all 7 rows, in 3 parts, none half-written.
    table = store.read("correctness")
    assert sorted(table.column("case_id").to_pylist()) == [f"c{i:03d}" for i in range(7)]
    parts = list((tmp_path / "correctness").glob("date=*/*.parquet"))
    assert len(parts) == 3
    assert not list((tmp_path / "correctness").glob("date=*/.*"))  # no temp files left


def test_rows_flushed_before_a_kill_survive(tmp_path):
    store = Store(tmp_path)
    writer = RowWriter(store, "correctness", "r2", every=2, seconds=1e9)
    for i in range(5):
        writer.add(_row(i))
    # No close: the process "dies" here. Two full parts were written.
    assert store.read("correctness").num_rows == 4


def test_read_uses_schema_and_version(tmp_path):
    store = Store(tmp_path)
    store.write("correctness", [_row(1)], "r3", 0)
    table = store.read("correctness")
    assert table.schema.equals(CORRECTNESS, check_metadata=False)
    assert table.column("schema_version").to_pylist() == [SCHEMA_VERSION]
    assert Store(tmp_path / "empty").read("correctness").num_rows == 0


def test_version_1_files_read_back_with_flags_null(tmp_path):
    """Schema 2 added correctness.flags: a part written before it still reads."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    old = pa.schema([f for f in CORRECTNESS if f.name != "flags"])
    part = tmp_path / "correctness" / "date=2026-11-01"
    part.mkdir(parents=True)
    row = {**_row(1), "schema_version": 1}
    pq.write_table(pa.Table.from_pylist([row], schema=old), part / "r0-0.parquet")
    table = Store(tmp_path).read("correctness")
    assert table.column("flags").to_pylist() == [None]
    assert table.column("case_id").to_pylist() == [row["case_id"]]
