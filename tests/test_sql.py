"""`kparity sql`: DuckDB views over the store (every table, `latest`, `history`), read from real
rows of CPU runs; older schema versions read with the newer columns null; DuckDB stays off the
GPU import path."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("duckdb")

from cases.distributions import DISTRIBUTIONS  # noqa: E402
from results.query import query  # noqa: E402
from results.schema import CORRECTNESS, SCHEMA_VERSION  # noqa: E402
from results.store import Store  # noqa: E402
from verbs.cli import main  # noqa: E402

N = len(DISTRIBUTIONS)  # cases of one preset and dtype


def _check_twice(root) -> None:
    for _ in range(2):
        assert main(["--store", str(root), "check", "--impl", "torch:rms_norm",
                     "--preset", "qwen3-0.6b", "--dtype", "bf16"]) == 0


def test_views_latest_and_history_over_real_runs(tmp_path):
    _check_twice(tmp_path)
    store = Store(tmp_path)
    _, [(runs,)] = query(store, "SELECT count(*) FROM runs")
    _, [(rows,)] = query(store, "SELECT count(*) FROM correctness")
    _, [(latest,)] = query(store, "SELECT count(*) FROM latest")
    assert (runs, rows, latest) == (2, 2 * N, N)  # N cases (distributions) per run
    # newest by start time: run ids sort by time only to the second
    newest = max(store.read("runs").to_pylist(), key=lambda r: r["started"])["run_id"]
    _, got = query(store, "SELECT DISTINCT run_id FROM latest")
    assert got == [(newest,)]
    cols, hist = query(store, "SELECT run_id, metric, value FROM history ORDER BY run_id")
    assert cols == ["run_id", "metric", "value"] and len(hist) == 2 * N
    assert {m for _, m, _ in hist} == {"budget"} and all(0 <= v <= 1 for *_, v in hist)


def test_history_takes_plain_bench_rows_only(tmp_path):
    store = Store(tmp_path)
    store.write("runs", [{"run_id": "r1", "verb": "bench"}], "r1", 0)
    base = {"run_id": "r1", "case_id": "c1", "impl": "cuda:k", "op": "rms_norm", "mode": "graph_rot",
            "device": "gpu", "status": "ok"}
    store.write("bench", [{**base, "arm": "", "median_ns": 100.0},
                          {**base, "arm": "", "median_ns": 110.0},
                          {**base, "arm": "A", "ab_id": "x", "median_ns": 999.0},
                          {**base, "arm": "", "status": "fail", "median_ns": 5.0}], "r1", 0)
    _, got = query(store, "SELECT metric, value FROM history")
    assert got == [("median_ns", 105.0)]  # the median of the two plain, timed rows


def test_empty_store_has_every_view(tmp_path):
    for view in ("runs", "correctness", "bench", "ab", "ceilings", "annotations", "latest",
                 "history"):
        cols, rows = query(Store(tmp_path), f"SELECT * FROM {view}")
        assert cols and rows == []


def test_older_schema_parts_read_with_new_columns_null(tmp_path):
    old = pa.schema([f for f in CORRECTNESS if f.name != "flags"])
    part = tmp_path / "correctness" / "date=2026-11-01"
    part.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"schema_version": 1, "run_id": "r0", "case_id": "c",
                                          "impl": "torch:x", "status": "pass"}], schema=old),
                   part / "r0-00000.parquet")
    Store(tmp_path).write("correctness", [{"run_id": "r1", "case_id": "c", "impl": "torch:x",
                                           "status": "fail", "flags": "near_tie:out"}], "r1", 0)
    _, got = query(Store(tmp_path), "SELECT schema_version, flags FROM correctness ORDER BY run_id")
    assert got == [(1, None), (SCHEMA_VERSION, "near_tie:out")]


def test_sql_verb_formats_and_errors(tmp_path, capsys):
    _check_twice(tmp_path)
    capsys.readouterr()
    assert main(["--store", str(tmp_path), "sql", "--format", "json",
                 "SELECT impl, count(*) AS n FROM correctness GROUP BY impl"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"impl": "torch:rms_norm", "n": 2 * N}]
    assert main(["--store", str(tmp_path), "sql", "--format", "csv",
                 "SELECT 1 AS a, 'x' AS b"]) == 0
    assert capsys.readouterr().out.splitlines() == ["a,b", "1,x"]
    assert main(["--store", str(tmp_path), "sql", "SELECT * FROM no_such_view"]) == 2
    assert "no_such_view" in capsys.readouterr().out
    for empty in ("  ", "-- a comment only"):  # no statement: said, not a crash or a blank
        assert main(["--store", str(tmp_path), "sql", empty]) == 2
        assert "the query holds no statement" in capsys.readouterr().out


def test_duckdb_and_plotly_are_not_on_the_gpu_import_path():
    """The GPU image has neither: importing the impls, the runners and the CLI parser (which
    registers every verb) must not pull them in."""
    code = ("import sys, gpu_impls, runners.correctness, runners.timing, runners.bench, "
            "verbs.cli; gpu_impls.impls(); verbs.cli.parser(); "
            "print(sorted(m for m in ('duckdb', 'plotly', 'jsonschema') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"



def test_views_skip_unreadable_parts_and_see_journaled_rows(tmp_path):
    from results.store import RowWriter

    store = Store(tmp_path)
    store.write("correctness", [{"run_id": "r1", "case_id": "a", "impl": "torch:x"}], "r1", 0)
    store.write("correctness", [{"run_id": "r2", "case_id": "b", "impl": "torch:x"}], "r2", 0)
    next((tmp_path / "correctness").glob("date=*/r1-*.parquet")).write_bytes(b"garbage")
    writer = RowWriter(store, "correctness", "r3", every=100, seconds=1e9)
    writer.add({"run_id": "r3", "case_id": "c", "impl": "torch:x"})  # then "killed"
    _, got = query(Store(tmp_path), "SELECT run_id, case_id FROM correctness ORDER BY run_id")
    assert got == [("r2", "b"), ("r3", "c")]
