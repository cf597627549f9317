"""Test-only impls that kill the process running them, for `check --ray` (tests/test_ray.py):
each is torch:rms_norm, except on the bf16 case of dist `zero_rows`, where it ends its process
with `os._exit(1)`, as a segfaulting kernel ends a Ray worker. Loaded as a plugin (`--plugin
tests/ray_faults.py`), never registered by default; only ever run them under --ray (or
--isolate case): they end the process that runs them.

| impl                  | on the bf16 zero_rows case                                       |
|-----------------------|------------------------------------------------------------------|
| torch:ray_kill_once   | the first time (no file `once` in $KPARITY_RAY_KILL_DIR yet):    |
|                       | creates the file, then exits; later runs compute the norm        |
| torch:ray_kill_always | exits, every time, after adding a line to `always.log` there     |
"""

from __future__ import annotations

import os
from pathlib import Path

from gpu_impls import impls, register
from gpu_impls.impl import Impl

BASE = impls()["torch:rms_norm"]
DIST = "zero_rows"


def kill_once():
    mark = Path(os.environ["KPARITY_RAY_KILL_DIR"], "once")  # per call: the task's environment
    if not mark.exists():
        mark.touch()
        os._exit(1)


def kill_always():
    with open(Path(os.environ["KPARITY_RAY_KILL_DIR"], "always.log"), "a") as log:
        log.write("killed\n")
    os._exit(1)


def killing(name: str, kill):
    def run(launch, inputs, outputs, case):
        if case.dtype == "bf16" and case.dist == DIST:
            kill()
        return BASE.run(launch, inputs, outputs, case)
    return Impl(BASE.op, BASE.backend, name, run, BASE.contract,
                doc=f"{BASE.id}, but {kill.__name__} on bf16 {DIST}")


_existing = impls()
register(*(i for i in (killing("ray_kill_once", kill_once),
                       killing("ray_kill_always", kill_always)) if i.id not in _existing))
