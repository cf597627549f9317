"""`kparity repro CASE --dump DIR`: one case as files, to rerun and inspect without the CLI.

DIR receives, for case id C:

| file                         | holds                                                        |
|------------------------------|--------------------------------------------------------------|
| `C.input.<name>.npy`         | each input, as the impls get it                              |
| `C.<impl>.out.<name>.npy`    | each output of that impl (impl id with `:` as `-`)           |
| `C.<impl>.exact.<name>.npy`  | the oracle's float64 pre-store value the impl is judged on   |
| `C.<impl>.ref.<name>.npy`    | that value rounded to the output's dtype                     |
| `C.<impl>.bound.<name>.npy`  | the bound on |out - exact| for that impl's declared numerics  |
| `repro_C.py`                 | a script that reruns the case on the dumped inputs           |

Arrays keep their dtype where NumPy has it (f32, f16, u32...); bf16 and fp8 values are written
as float32 (exact: every such value is a float32), so any NumPy reads them. The oracle is per
impl because an impl's bounds follow its declared numerics and a backend that flushes
subnormals is judged under the flushed oracle. The script builds the case from its JSON, loads
the inputs, runs each impl through `runners.correctness.check_op` (what `kparity check` runs
for a plain impl; a staged pipeline impl through `check`, on inputs it regenerates), and prints
each verdict and whether it matches the dump's.

The impls run again in this process to capture their outputs (not in an isolated worker).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from cases.generate import Work
from cases.model import Case, make_inputs
from runners.correctness import check, check_op, oracle_for


def dump(case: Case, work: list[Work], plugins: list[str], folder: str | Path) -> tuple[Path, dict]:
    """Writes the files of the module docstring; returns (the script's path, {impl id: status
    of the dumped run})."""
    import gpu_impls

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    inputs = make_inputs(case)
    for name, array in inputs.items():
        _save(folder / f"{case.id}.input.{name}.npy", array)
    statuses = {}
    for w in work:
        backend = gpu_impls.backend(w.impl.backend)
        tag = f"{case.id}.{w.impl.id.replace(':', '-')}"
        if w.impl.stages is not None:  # staged: checked stage by stage, as `check` does
            statuses[w.impl.id] = check(w, backend)["status"]
            continue
        outputs: dict = {}
        statuses[w.impl.id] = check_op(w, backend, inputs=inputs, keep=outputs)["status"]
        if not outputs:  # refused by its contract, or raised: nothing ran to compare
            continue
        exact, ref, bounds = oracle_for(w.impl, backend, case, inputs)
        for t in case.spec.outputs:
            for kind, arrays in (("out", outputs), ("exact", exact), ("ref", ref),
                                 ("bound", bounds)):
                _save(folder / f"{tag}.{kind}.{t.name}.npy", arrays[t.name])
    script = folder / f"repro_{case.id}.py"
    runs = [(w.impl.id, w.expect, w.invariant, statuses[w.impl.id]) for w in work]
    script.write_text(SCRIPT.format(
        case_id=case.id, short=case.short(), label=case.label, case_json=case.to_json(),
        plugins=[_absolute(p) for p in plugins], runs=runs,
        statuses=", ".join(f"{i} {s}" for i, s in statuses.items())), encoding="utf-8")
    return script, statuses


def _save(path: Path, array) -> None:
    """`array` as .npy: as is where NumPy knows its dtype, else as float32 (bf16, fp8, fp4:
    exact)."""
    array = np.asarray(array)
    if array.dtype.isbuiltin != 1:  # an ml_dtypes type: NumPy alone cannot read it back
        array = array.astype(np.float32)
    np.save(path, np.ascontiguousarray(array))


def _absolute(plugin: str) -> str:
    """A plugin file as an absolute path (the script may run from elsewhere); a module name as
    is."""
    return os.path.abspath(plugin) if os.path.isfile(plugin) else plugin


SCRIPT = '''"""Rerun kparity case {case_id} ({short}, {label}) without the CLI.

Written by `kparity repro {case_id} --dump`. Loads the inputs dumped beside this file, runs each
impl through the function `kparity check` uses (runners.correctness.check_op), judges it against
the oracle and prints the verdict; exit status 1 if any impl fails. Needs kparity's packages
importable (installed, or PYTHONPATH=<kparity checkout>). At the dump: {statuses}.
"""

import json
import sys
from pathlib import Path

import numpy as np

import gpu_impls
from cases.generate import Work
from cases.model import Case, make_inputs
from oracle.comparators import describe
from oracle.dtypes import storage_dtype
from runners.correctness import check, check_op
from runners.verdicts import is_failure

HERE = Path(__file__).resolve().parent
CASE_ID = {case_id!r}  # the dumped files' prefix
CASE = Case.from_json({case_json!r})
PLUGINS = {plugins!r}  # --plugin modules that register the impls
RUNS = {runs!r}  # (impl, expected, invariant a violating case breaks, status at the dump)


def load_inputs() -> dict:
    """The dumped inputs in their storage dtypes (bf16 and fp8 were written as exact float32)."""
    return {{t.name: np.load(HERE / f"{{CASE_ID}}.input.{{t.name}}.npy").astype(
        storage_dtype(t.dtype(CASE)), copy=False) for t in CASE.spec.inputs}}


def main() -> int:
    for plugin in PLUGINS:
        gpu_impls.load_plugin(plugin)
    if CASE.id != CASE_ID:  # the id hashes the oracle version: another oracle judges it now
        print(f"note: this kparity gives the case id {{CASE.id}} (another oracle version)")
    inputs = load_inputs()
    fresh = make_inputs(CASE)
    if any(inputs[k].tobytes() != fresh[k].tobytes() for k in fresh):
        print("note: this kparity draws other inputs for the case; running the dumped ones")
    failed = False
    for impl_id, expect, invariant, was in RUNS:
        impl = gpu_impls.impls()[impl_id]
        backend = gpu_impls.backend(impl.backend)
        ok, why = impl.available(backend)
        if not ok:
            print(f"{{impl_id}}: cannot run here ({{why}})")
            failed = True
            continue
        work = Work(impl, CASE, expect, invariant)
        row = check(work, backend) if impl.stages else check_op(work, backend, inputs=inputs)
        same = "as at the dump" if row["status"] == was else f"at the dump: {{was}}"
        print(f"{{impl_id}} {{row['status']}} ({{same}}): {{row['message']}}")
        for name, metrics in json.loads(row["outputs_json"]).items():
            print(f"  {{name}}: {{describe(CASE.spec, name, metrics)}}")
        failed |= is_failure(row)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
'''
