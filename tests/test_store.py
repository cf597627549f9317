"""The Parquet store: atomic parts, rows kept when a run dies mid-way, schema on read."""

from __future__ import annotations

from pathlib import Path

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


def test_rows_finished_before_a_kill_survive(tmp_path):
    store = Store(tmp_path)
    writer = RowWriter(store, "correctness", "r2", every=2, seconds=1e9)
    for i in range(5):
        writer.add(_row(i))
    # No close: the process "dies" here. Two parts hold 4 rows, the journal the fifth.
    assert len(store.parts("correctness")) == 2
    assert sorted(store.read("correctness").column("case_id").to_pylist()) == \
        [f"c{i:03d}" for i in range(5)]
    assert store.next_part("correctness", "r2") == 3
    assert store.recover("correctness", "r2") == 1  # the journaled row becomes part 2
    assert not store.journal_path("correctness", "r2").exists()
    assert len(store.parts("correctness")) == 3 and store.read("correctness").num_rows == 5


def test_a_clean_close_leaves_no_journal(tmp_path):
    store = Store(tmp_path)
    with RowWriter(store, "correctness", "r4", every=2, seconds=1e9) as writer:
        for i in range(3):
            writer.add(_row(i))
    assert not list((tmp_path / ".journal").rglob("*.jsonl"))
    assert store.read("correctness").num_rows == 3


def test_a_line_cut_short_by_the_kill_is_ignored(tmp_path):
    store = Store(tmp_path)
    writer = RowWriter(store, "correctness", "r5", every=100, seconds=1e9)
    writer.add(_row(1))
    writer.add(_row(2))
    writer.journal.write('{"part": 0, "row": {"run_id": "r5", "case_')  # killed mid-line
    writer.journal.flush()
    assert store.read("correctness").column("case_id").to_pylist() == ["c001", "c002"]


def test_a_killed_process_loses_no_finished_row(tmp_path):
    """SIGKILL of a real process between flushes: every row it finished is read back."""
    import signal
    import subprocess
    import sys
    import time

    code = (f"import sys, time; sys.path.insert(0, {str(Path(__file__).parents[1])!r}); "
            "from results.store import RowWriter, Store; "
            f"w = RowWriter(Store({str(tmp_path)!r}), 'correctness', 'rk', every=4, "
            "seconds=1e9)\n"
            "for i in range(10):\n"
            "    w.add({'run_id': 'rk', 'case_id': f'c{i:03d}', 'impl': 'torch:x', "
            "'status': 'pass'}); print(i, flush=True)\n"
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    for _ in range(10):
        proc.stdout.readline()  # every row is added when its number is printed
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    time.sleep(0.1)
    store = Store(tmp_path)
    assert len(store.parts("correctness")) == 2  # rows 0-7; rows 8, 9 only in the journal
    assert sorted(store.read("correctness").column("case_id").to_pylist()) == \
        [f"c{i:03d}" for i in range(10)]


def test_unreadable_parts_are_skipped_and_named(tmp_path, capsys):
    store = Store(tmp_path)
    for i, run in enumerate(("ra", "rb", "rc")):
        store.write("correctness", [_row(i) | {"run_id": run}], run, 0)
    parts = sorted((tmp_path / "correctness").glob("date=*/*.parquet"))
    truncated, garbage = parts[0], parts[1]
    truncated.write_bytes(truncated.read_bytes()[:100])
    garbage.write_bytes(b"not parquet at all")
    fresh = Store(tmp_path)
    assert fresh.read("correctness").column("run_id").to_pylist() == ["rc"]
    assert set(fresh.skipped) == {truncated, garbage}
    err = capsys.readouterr().err
    assert str(truncated) in err and str(garbage) in err


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


def test_journal_keeps_numpy_values_as_numbers(tmp_path):
    import numpy as np

    store = Store(tmp_path)
    writer = RowWriter(store, "bench", "rn", every=100, seconds=1e9)
    writer.add({"run_id": "rn", "case_id": "c", "impl": "cuda:k", "n_samples": np.int64(12),
                "median_ns": np.float32(1.5), "samples_ns": np.array([1.0, 2.0], np.float32)})
    row = store.read("bench").to_pylist()[0]  # from the journal: nothing flushed
    assert (row["n_samples"], row["median_ns"], row["samples_ns"]) == (12, 1.5, [1.0, 2.0])
