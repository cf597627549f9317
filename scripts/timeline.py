"""A pytest plugin that writes each test's start and end (wall clock) per xdist worker, for
seeing where a parallel gate's wall time goes (startup and collection before the first test,
idle workers at the end): `python -m pytest -p scripts.timeline ...` with KPARITY_TIMELINE=DIR
(one JSONL file per worker), then `python -m scripts.timeline DIR`."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

_T0 = time.time()  # this process's start (the plugin loads with pytest)
_open: dict[str, float] = {}


def _sink():
    out = os.environ.get("KPARITY_TIMELINE")
    if not out:
        return None
    Path(out).mkdir(parents=True, exist_ok=True)
    return Path(out) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl"


def _stamp(phase: str) -> None:
    sink = _sink()
    if sink is not None:
        with sink.open("a") as f:
            f.write(json.dumps({"phase": phase, "t0": _T0, "at": time.time()}) + "\n")


def pytest_configure(config):
    _stamp("configured")  # imports done, conftest's configure (the accelerator guard) next


def pytest_collection_finish(session):
    _stamp("collected")


def pytest_runtest_logstart(nodeid, location):
    _open[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid, location):
    sink = _sink()
    if sink is not None:
        with sink.open("a") as f:
            f.write(json.dumps({"id": nodeid, "t0": _T0, "start": _open.pop(nodeid, None),
                                "end": time.time()}) + "\n")


def summary(folder: str) -> None:
    lines = {p.stem: [json.loads(line) for line in p.open()]
             for p in sorted(Path(folder).glob("*.jsonl"))}
    rows = {w: [r for r in rs if "id" in r] for w, rs in lines.items()}
    phases = {w: {r["phase"]: r["at"] for r in rs if "phase" in r} for w, rs in lines.items()}
    if len(rows) > 1:
        rows.pop("main", None)  # xdist's controller sees every worker's tests again
    begin = min(r[0]["t0"] for r in rows.values() if r)
    end = max(r[-1]["end"] for r in rows.values() if r)
    print(f"{len(rows)} workers, {end - begin:.1f} s from the first process start to the last test")
    for worker, rs in rows.items():
        busy = sum(r["end"] - r["start"] for r in rs if r["start"])
        stamps = "".join(f", {name} +{at - begin:.1f} s" for name, at in phases[worker].items())
        print(f"  {worker}: process start +{rs[0]['t0'] - begin:.1f} s{stamps}, first test "
              f"+{rs[0]['start'] - begin:.1f} s, last end +{rs[-1]['end'] - begin:.1f} s, "
              f"busy {busy:.1f} s over {len(rs)} tests")


if __name__ == "__main__":
    summary(sys.argv[1])
