"""kparity verbs: the `kparity` CLI (`verbs/cli.py`) and one module per group of verbs.

The CLI discovers the verb modules: every module here that defines `add_parsers(sub)` (adds its
verbs' subparsers) and `VERBS` ({verb name: function(args) -> exit code}); `ORDER` places its
verbs in `kparity --help`, under the heading `GROUP`. Adding a verb group is adding a module. Every module is imported to
build the parser, so heavy imports (DuckDB, plotly) stay inside the verb functions.
What they share, by concern: `console.py` (where a verb prints, a sweep's progress and time
line), `usage.py` (bad input) and `selection.py` (the filters, the work list, the repro line);
these import no verb module. Nothing below this package (oracle, cases, gpu_impls, runners,
results) imports the verbs: tests/test_layers.py.
"""
