"""Arrow schemas of the store's tables. Every row carries `schema_version`.

Documented in README.md ("Store schema"); change both together and bump SCHEMA_VERSION.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1

RUNS = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),           # sortable: UTC time + random suffix
    ("started", pa.timestamp("us", tz="UTC")),
    ("command", pa.string()),          # the command line
    ("verb", pa.string()),             # check, repro, ...
    ("git_sha", pa.string()),
    ("git_dirty", pa.bool_()),
    ("host", pa.string()),
    ("platform", pa.string()),
    ("devices", pa.string()),          # JSON: backend -> device
    ("versions", pa.string()),         # JSON: package -> version (python, numpy, torch, cupy, mlx...)
    ("filters", pa.string()),          # JSON of the CLI filters
])

CORRECTNESS = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),
    ("case_id", pa.string()),          # stable content hash of the case
    ("impl", pa.string()),             # backend:name
    ("op", pa.string()),
    ("backend", pa.string()),
    ("device", pa.string()),
    ("dtype", pa.string()),
    ("dist", pa.string()),
    ("dims", pa.string()),             # JSON
    ("params", pa.string()),           # JSON (eps, weight_offset, ...)
    ("label", pa.string()),            # preset:..., edge, violates:<invariant>
    ("case_json", pa.string()),        # the whole case, for `kparity repro`
    ("expect", pa.string()),           # valid | rejected
    ("status", pa.string()),           # pass fail rejected error timeout crash unsupported
    ("message", pa.string()),
    ("worst_output", pa.string()),
    ("max_abs", pa.float64()),
    ("max_rel", pa.float64()),
    ("nmse", pa.float64()),
    ("cosine", pa.float64()),
    ("max_ulp", pa.int64()),
    ("frac_within", pa.float64()),
    ("nonfinite_mismatch", pa.int64()),
    ("budget", pa.float64()),          # max |out - exact| / bound over the worst output
    ("outputs_json", pa.string()),     # per-output metrics
    ("seconds", pa.float64()),
])

TABLES = {"runs": RUNS, "correctness": CORRECTNESS}
