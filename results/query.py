"""DuckDB over the store: one view per table, plus `latest` and `history` (docs/results-schema.md).

    runs, correctness, bench, ab, ceilings, annotations
        every row of that table, every run (read_parquet over the table's readable parts,
        union_by_name, so parts of older schema versions read with the newer columns null;
        unreadable parts are skipped and named, rows of a killed run's journal included)
    latest
        the newest correctness row of each (impl, case_id, device): what is true now. Rows of
        `kparity repro` runs are left out (a rerun of a few cases without the known-issues
        ledger is not the state of a sweep), and so is a retired impl: one with a later
        `check` run, without `--impl`, that ran its op on its backend and device and had no row
        of it (an impl a plugin registered once, or one since removed), as in the report
    history
        one value per (run, series): run_id, started, device, impl, op, case_id, dtype, label,
        mode, metric, value, where metric is 'median_ns' (plain bench rows that were timed; the
        median of that run's rows for the series) or 'budget' (correctness rows with a budget,
        repro runs left out)

DuckDB is imported here only: it stays off the GPU import path (nothing under gpu_impls/,
runners/correctness.py or runners/timing.py imports this module).
"""

from __future__ import annotations

from results.schema import TABLES
from results.store import Store

LATEST = """
CREATE VIEW latest AS
WITH swept AS (         -- correctness rows of every run but `kparity repro`
    SELECT c.*, r.started AS run_started FROM correctness c JOIN runs r USING (run_id)
    WHERE coalesce(r.verb, '') <> 'repro'
), newest AS (
    SELECT * EXCLUDE (rn) FROM (
        SELECT *, row_number() OVER (PARTITION BY impl, case_id, device
                                     ORDER BY run_started DESC, run_id DESC) AS rn
        FROM swept
    ) WHERE rn = 1
), impl_last AS (       -- each impl's newest run on each device
    SELECT impl, device, max(run_started) AS last_started FROM swept GROUP BY impl, device
), every_impl AS (      -- check runs without --impl: every impl of their ops then registered
    SELECT DISTINCT s.op, s.backend, s.device, s.run_started
    FROM swept s JOIN runs r USING (run_id)
    WHERE r.verb = 'check' AND r.filters IS NOT NULL
      AND coalesce(json_array_length(r.filters -> '$.impl'), 0) = 0
)
SELECT n.* EXCLUDE (run_started) FROM newest n JOIN impl_last l USING (impl, device)
WHERE NOT EXISTS (SELECT 1 FROM every_impl e WHERE e.op = n.op AND e.backend = n.backend
                  AND e.device = n.device AND e.run_started > l.last_started)
"""

HISTORY = """
CREATE VIEW history AS
SELECT b.run_id, r.started, b.device, b.impl, b.op, b.case_id, b.dtype, b.label, b.mode,
       'median_ns' AS metric, median(b.median_ns) AS value
FROM bench b JOIN runs r USING (run_id)
WHERE b.status = 'ok' AND coalesce(b.arm, '') = '' AND b.median_ns IS NOT NULL
GROUP BY ALL
UNION ALL
SELECT c.run_id, r.started, c.device, c.impl, c.op, c.case_id, c.dtype, c.label, '' AS mode,
       'budget' AS metric, max(c.budget) AS value
FROM correctness c JOIN runs r USING (run_id)
WHERE c.budget IS NOT NULL AND coalesce(r.verb, '') <> 'repro'
GROUP BY ALL
"""


def _table_view(con, store: Store, table: str) -> None:
    """DuckDB scans the table's readable parts itself; a table with rows in a killed run's
    journal (or no parts yet) is read through `Store.read` and registered as Arrow instead."""
    files = store.parts(table)
    journaled = store.has_journal(table)
    if files and not journaled:
        paths = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet([{paths}], "
                    "union_by_name = true, hive_partitioning = false)")
    else:
        con.register(f"_{table}_arrow", store.read(table) if files or journaled
                     else TABLES[table].empty_table())
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM _{table}_arrow")


def connect(store: Store):
    """An in-memory DuckDB connection with the store's views."""
    import duckdb

    con = duckdb.connect(":memory:")
    for table in TABLES:
        _table_view(con, store, table)
    con.execute(LATEST)
    con.execute(HISTORY)
    return con


def query(store: Store, sql: str) -> tuple[list[str], list[tuple]] | None:
    """(column names, rows) of one query; None where the text holds no statement (blank, or
    comments only)."""
    con = connect(store)
    try:
        cur = con.execute(sql)
        if cur is None:
            return None
        return [d[0] for d in cur.description or []], cur.fetchall()
    finally:
        con.close()
