"""pytest setup: markers, the no-accelerator guard for `-m gpu`, hypothesis profiles.

`pytest -m gpu` on a machine without an accelerator must fail loudly, not pass empty: the guard
exits with status 3 and says which backends were looked for and why each is missing. Under
`-n auto` one xdist worker per GPU, each taking its own (`pin_xdist_worker`).
"""

from __future__ import annotations

import os

import pytest

from runners.threads import limited, share

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each xdist worker its share of the host's BLAS / OpenMP threads, set before numpy and
    # torch load and count them (`runners/threads.py`: workers that each start one thread per
    # core slow one another); a smaller count set by hand is kept.
    os.environ.update(limited(share(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))

from cases import strategies  # noqa: E402, F401  (registers the hypothesis profiles)
from hypothesis import settings  # noqa: E402

settings.load_profile(os.environ.get("KPARITY_HYPOTHESIS_PROFILE", "ci"))


def accelerators() -> tuple[list[str], list[str]]:
    """(backends with an accelerator here, reasons for the others)."""
    from gpu_impls import backend

    found, why = [], []
    for name in ("cuda", "torch", "mlx", "metal"):
        be = backend(name)
        ok, reason = be.available()
        if ok and be.accelerator:
            found.append(f"{name} ({be.device()})")
        else:
            why.append(f"{name}: {reason if not ok else 'runs on cpu'}")
    return found, why


# Why the `timing` tests skip in this run: set where more xdist workers than GPUs run, so that
# workers share a GPU and their kernels overlap whatever a test times (None: they run).
SHARED_GPU = None


def pin_xdist_worker() -> None:
    """Under pytest-xdist, this worker takes one GPU (`runners.devices.xdist_gpu`): worker gwN
    gets CUDA_VISIBLE_DEVICES = the (N mod G)th of the G GPUs visible, counted by `nvidia-smi -L`
    (or an existing CUDA_VISIBLE_DEVICES), before any test starts CUDA."""
    global SHARED_GPU
    from runners.devices import visible_gpus, xdist_gpu

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    visible = visible_gpus()
    gpu = xdist_gpu(worker, visible) if worker else None
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        if workers > len(visible):
            SHARED_GPU = (f"{workers} xdist workers share {len(visible)} GPU(s): their kernels "
                          "would overlap what a timing test measures; run with -n "
                          f"{len(visible)} (a worker per GPU), or without -n")


def steal_work(config) -> None:
    """Under `-n`, xdist's work-stealing scheduler unless `--dist` was given (on the command
    line, in PYTEST_ADDOPTS or the ini's addopts): the gate's test
    times range from milliseconds to 30 s, and with `load`'s up-front chunks a worker could be
    left with the long ones while the others idle (xdist reads the choice when the run starts);
    the long ones also run first (`long_first`)."""
    import shlex

    sources = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    try:
        sources += list(config.getini("addopts"))
    except (ValueError, AttributeError):  # no such ini option (a stand-in config)
        pass
    given = any(a in ("--dist", "-d") or a.startswith("--dist=") for a in sources)
    if not given and getattr(config.option, "dist", "no") == "load":
        config.option.dist = "worksteal"


def wants_gpu(config) -> bool:
    markexpr = config.getoption("markexpr") or ""
    return "gpu" in markexpr and "not gpu" not in markexpr


@pytest.hookimpl(optionalhook=True)  # xdist's hook: without xdist, pytest must not refuse it
def pytest_xdist_auto_num_workers(config):
    """`-n auto` under `-m gpu`: one worker per visible GPU (each takes one: `pin_xdist_worker`),
    not one per core, whose workers would share the GPUs and skip the timing tests; elsewhere
    xdist's own count (None)."""
    from runners.devices import visible_gpus

    if not wants_gpu(config):
        return None
    return len(visible_gpus()) or None


def pytest_configure(config):
    pin_xdist_worker()  # first: the accelerator guard below starts CUDA
    steal_work(config)
    if wants_gpu(config):
        found, why = accelerators()
        if not found:
            pytest.exit("pytest -m gpu: no accelerator backend on this machine, refusing to pass "
                        "empty. Looked for: " + "; ".join(why), returncode=3)


def long_first(items) -> None:
    """Under pytest-xdist, the long tests (tests/long_tests.json, measured: scripts/long_tests.py)
    first, longest first; the rest keep their order. Left where they fall (the Mamba tests end
    the gate), the long ones sit at the end of a worker's queue, and a worker that runs out of
    work steals them in one piece while the others idle; first, they are under way at once and
    only short tests remain to balance at the end. Every worker sorts alike (xdist requires the
    same order), and without -n the order is the files'."""
    import json
    from pathlib import Path

    table = Path(__file__).with_name("long_tests.json")
    seconds = json.loads(table.read_text()) if table.is_file() else {}
    items.sort(key=lambda item: -seconds.get(item.nodeid, 0.0))  # stable


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        long_first(items)
    # Tests needing a backend that is absent skip with the backend's own reason.
    from gpu_impls import backend

    for item in items:
        if SHARED_GPU and item.get_closest_marker("timing"):
            item.add_marker(pytest.mark.skip(reason=SHARED_GPU))
        for name in ("cuda", "mlx", "metal"):
            if item.get_closest_marker(name):
                ok, reason = backend(name).available()
                if not ok:
                    item.add_marker(pytest.mark.skip(reason=reason))
