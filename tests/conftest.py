"""pytest setup: markers, the no-accelerator guard for `-m gpu`, hypothesis profiles.

`pytest -m gpu` on a machine without an accelerator must fail loudly, not pass empty: the guard
exits with status 3 and says which backends were looked for and why each is missing. Under
`-n auto` one xdist worker per GPU, each taking its own (`pin_xdist_worker`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runners.threads import limited

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One BLAS / OpenMP thread per xdist worker, set before numpy and torch load and count them
    # (`runners/threads.py`): the workers and their oracle pools already fill the cores, and a
    # worker's second thread only waits on its first whenever the host is oversubscribed (the
    # cold GPU gate: 8 workers, their pools, the prebuild). Measured on 2 cores under 6 busy
    # processes: the float64 oracle of a gdn_chunked case 5.9 s with one thread, 23 s with two.
    # On the H100 host under `-n 8`, two threads a worker, the GDN pipeline tests, which compute
    # theirs in the worker, took 44-159 s each (405 s over 4); one thread, 103 s over 10 (the
    # cold commit tier, 2026-12-07, benchmarks/README.md "Tiers"). A smaller count set by hand
    # is kept.
    os.environ.update(limited(1))

from cases import strategies  # noqa: E402, F401  (registers the hypothesis profiles)
from hypothesis import settings  # noqa: E402

settings.load_profile(os.environ.get("KPARITY_HYPOTHESIS_PROFILE", "ci"))  # nightly: see below


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


GPU_FILES = "test_gpu*.py"  # where every `gpu`-marked test lives (tests/test_layers.py holds it)


def pytest_ignore_collect(collection_path, config):
    """Under `-m gpu` (without an `or` that could select other tests), the test files of this
    folder other than GPU_FILES are not imported: none holds a gpu test, and importing and
    assertion-rewriting the ~100 CPU test modules cost every xdist worker seconds of its
    collection (11.7 s for the whole suite on the 2-core CPU, 2.1 s for the GPU files)."""
    if (wants_gpu(config) and " or " not in (config.getoption("markexpr") or "")
            and collection_path.suffix == ".py" and collection_path.name.startswith("test_")
            and collection_path.parent == Path(__file__).parent
            and not collection_path.match(GPU_FILES)):
        return True
    return None


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


def pytest_addoption(parser):
    from cases.tiers import TIERS

    parser.addoption("--tier", choices=TIERS, default=None,
                     help="commit (default): the tests marked nightly are deselected and the "
                          "gate runs each impl's commit-tier cases (cases/tiers.py); nightly: "
                          "everything, every gate case, hypothesis' nightly profile. `-m "
                          "nightly` implies it")
    parser.addoption("--kparity-since", metavar="REF", default=None,
                     help="deselect the tests of impls whose code (impl, kernel, oracle, cases) "
                          "did not change since git ref REF (runners/since.py)")


def since_selection(config):
    """`--kparity-since REF`'s `runners.since.Selection` (once per process), or None."""
    ref = config.getoption("kparity_since", None)
    if ref and not hasattr(config, "_kparity_since"):
        from runners.since import SinceError, select_since

        try:
            config._kparity_since = select_since(ref, flag="--kparity-since")
        except SinceError as e:
            raise pytest.UsageError(str(e)) from None
    return getattr(config, "_kparity_since", None)


def pytest_report_header(config):
    selection = since_selection(config)
    return selection.lines() if selection is not None else None


def since_deselect(config, items) -> None:
    """Under --kparity-since, the tests parametrized with an impl (a `Work`'s, an `Impl`, an
    impl id) that the selection leaves out are deselected; the others all run."""
    selection = since_selection(config)
    if selection is None:
        return
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {}).values()
        ids = (getattr(getattr(v, "impl", v), "id", v) for v in params)
        named = {i for i in ids if isinstance(i, str) and i in selection.impl_ops}
        (drop if named and not named & selection.impl_ids else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def start_prebuild(config) -> None:
    """`pytest -m gpu -n N` over whole files (no -k, no node ids), in the xdist controller, where
    CUDA is here: every listed CUDA kernel compiled ahead
    in the background on the cores but one (gpu_impls/cuda/prebuild.py), while the workers start
    and collect; a test that needs a module being compiled waits for it instead of compiling it
    again. KPARITY_PREBUILD=0 turns it off."""
    if (os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("KPARITY_PREBUILD") == "0"
            or not getattr(config.option, "numprocesses", None)
            or config.getoption("keyword", "") or any("::" in a for a in config.args)
            or config.getoption("collectonly", False)):
        return
    from gpu_impls import backend

    if not backend("cuda").available()[0]:
        return
    from gpu_impls.cuda.prebuild import start_background

    config._kparity_prebuild = start_background(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))


def pytest_unconfigure(config):
    prebuild = getattr(config, "_kparity_prebuild", None)
    if prebuild is not None:
        from gpu_impls.cuda.prebuild import stop

        stop(prebuild)


def pytest_configure(config):
    pin_xdist_worker()  # first: the accelerator guard below starts CUDA
    if tier(config) == "nightly" and "KPARITY_HYPOTHESIS_PROFILE" not in os.environ:
        settings.load_profile("nightly")
    steal_work(config)
    if wants_gpu(config):
        found, why = accelerators()
        if not found:
            pytest.exit("pytest -m gpu: no accelerator backend on this machine, refusing to pass "
                        "empty. Looked for: " + "; ".join(why), returncode=3)
        start_prebuild(config)
    # The plugins (`kparity.plugins` entry points) load before collection: a test module that
    # lists the registry's ops, families or impls at import lists the ops they register too. An
    # impl module that does not import is left to fail the tests that list the impls.
    import gpu_impls

    try:
        gpu_impls.impls()
    except Exception:
        pass


def long_first(items) -> None:
    """Under pytest-xdist, the long tests (tests/long_tests.json, measured: scripts/long_tests.py)
    first, longest first; the rest keep their order. Left where they fall (the Mamba tests end
    the gate), the long ones would end a worker's queue and be stolen whole at the end while
    the others idle. Every worker sorts alike (xdist requires the same order); without -n the
    order is the files'.

    What xdist's `worksteal` then does with it (scripts/simulate_worksteal.py models it,
    `xdist_chunks`): it hands the W workers W contiguous stretches of this list, so the long tests
    all start in the first worker's stretch, and a worker that runs out steals the last half
    of the longest queue, the long ones only once that queue is short. The first worker thus
    runs many of the torch.compile tests one after another in one process, paying Dynamo's and
    Inductor's start (about 11 s alone on the H100 host) once. Dealing the long tests to every
    stretch instead (one call on the H100, 2026-12-08) put four cold tests over 20 s against
    this order's three: each worker that got a compiled impl paid that start again
    (benchmarks/HISTORY.md)."""
    import json
    from pathlib import Path

    from scripts.long_tests import stable_node_id

    table = Path(__file__).with_name("long_tests.json")
    seconds = json.loads(table.read_text()) if table.is_file() else {}
    items.sort(key=lambda item: -seconds.get(stable_node_id(item.nodeid), 0.0))  # stable


def tier(config) -> str:
    """The run's tier: --tier, else nightly where the -m expression names it, else commit."""
    given = config.getoption("tier", None)
    if given:
        return given
    return "nightly" if "nightly" in (config.getoption("markexpr", "") or "") else "commit"


# A gate case this cheap (elements + flops, `cases.tiers.case_cost`) stays in the commit tier's
# seed-tolerance guards whatever it covers: a guard binds at the longest reductions, which the
# cheap 1-2k-term cases reach, while the model-sized presets above it cost seconds each.
GUARD_COST = 1 << 18


@pytest.fixture
def tier_cases(pytestconfig):
    """The run's tier applied to the gate cases a CPU test walks (the seed-tolerance guards):
    commit, their `commit_subset` (every dtype, distribution, param value and edge) and every
    case within GUARD_COST; nightly, all of them."""
    from cases.tiers import case_cost, commit_subset

    def pick(cases) -> list:
        cases = list(cases)
        if tier(pytestconfig) == "nightly":
            return cases
        kept = {c.id for c in commit_subset(cases)}
        return [c for c in cases if c.id in kept or case_cost(c) <= GUARD_COST]
    return pick


def tier_deselect(config, items) -> None:
    """In the commit tier, the tests marked `nightly` are deselected (counted in pytest's
    summary line as deselected)."""
    if tier(config) == "nightly":
        return
    drop = [item for item in items if item.get_closest_marker("nightly")]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if not item.get_closest_marker("nightly")]


def pytest_collection_modifyitems(config, items):
    tier_deselect(config, items)
    since_deselect(config, items)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        long_first(items)
    # Tests needing a backend that is absent skip with the backend's own reason.
    from gpu_impls import backend

    availability = {}  # asked once per backend, not per test (CUDA's asks the driver)
    for item in items:
        if SHARED_GPU and item.get_closest_marker("timing"):
            item.add_marker(pytest.mark.skip(reason=SHARED_GPU))
        for name in ("cuda", "mlx", "metal"):
            if item.get_closest_marker(name):
                if name not in availability:
                    availability[name] = backend(name).available()
                ok, reason = availability[name]
                if not ok:
                    item.add_marker(pytest.mark.skip(reason=reason))
