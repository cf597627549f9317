"""`kparity check --ray ADDRESS|auto|local`: the sweep's (impl, case) pairs run as Ray tasks on the
hosts of a cluster, their rows streaming back to this process, the run's only writer.

The driver (this process) deals the work into batches of one impl's cases and submits each as a
task needing one GPU where the impl's backend runs on an accelerator (`needs_gpu`), else one CPU.
A task rebuilds its Work items from (impl id, case JSON, expect, invariant), as an isolation
worker does (the same --plugin modules loaded first), and runs each through the serial sweep's
own per-item path (`runners.item.run_one`: --repeat, the known-issues ledger) with the runner the
serial sweep would pick for that batch (`runners.isolation.case_runner`): under `--isolate
auto` that is a worker process per task on an accelerator (a hung case becomes a `timeout` row,
a crashed one a `crash` row, as on one host), in the Ray worker itself on a CPU backend. The
task answers with the rows of each item's runs; here the sweep's own `one` (`runner_for`'s
executor protocol) replays them into the item's row, with the run's id.

What is guaranteed:
- one row per (impl, case), as many as the single-process run has: rows come back as tasks
  finish (`ray.wait`), and the driver hands them to the sweep, which writes the run's parts;
- a task whose Ray worker dies (segfault, `os._exit`, OOM kill, a lost node) is rerun by Ray
  (`--ray-retries`, 2); a batch that still kills its worker is split in halves and resubmitted,
  down to single cases, and a case that alone keeps killing its worker becomes a `crash` row
  saying so; the other cases of its batch get their rows;
- an exception in a task (a device left unusable after a crash, a plugin that fails on a host)
  stops the sweep; the rows so far are in the store, and `check --resume RUN_ID` runs the rest.

Every host needs the same kparity (and the --plugin modules, at the same paths: file plugins
are passed as absolute paths) and the backends' frameworks installed; KPARITY_* environment
variables (the oracle cache's settings) are passed on to the tasks. Ray is an optional extra
(`pip install 'kparity[ray]'`); only this module imports it, inside its functions.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager

# A task's batch: at most this many cases, and small enough that each slot (a GPU or a CPU) gets
# about TASKS_PER_SLOT tasks, so a slow batch does not leave the others idle at the end.
BATCH_MAX = 16
TASKS_PER_SLOT = 4
RETRIES = 2  # --ray-retries: how often Ray reruns a task whose worker died
LOCAL_CPUS = 2  # --ray local: a stand-in cluster on this machine (tests, a laptop)
# Backends whose kernels always run on an accelerator; torch and mlx are asked (`needs_gpu`).
ACCELERATOR_BACKENDS = ("cuda", "metal")


def available() -> bool:
    """Whether Ray can be imported here (without importing it: that takes a second)."""
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def needs_gpu(backend: str) -> bool:
    """Whether a batch of this backend's impls needs a GPU: cuda and metal always; torch and MLX
    when they run on an accelerator as the driver sees it (torch with CUDA, MLX on a GPU). A
    CPU-only driver of a GPU cluster therefore sends torch and MLX batches to CPUs: run the
    driver on a host like the workers (`ray job submit`, or a GPU head node)."""
    if backend in ACCELERATOR_BACKENDS:
        return True
    from gpu_impls import backend as backend_named

    return bool(backend_named(backend).accelerator)


@contextmanager
def ray_rows(args):
    """`runners.sweep.runner_for`'s executor for --ray: yields `rows(work, one)`; on exit
    (the sweep's end, --maxfail, an exception, Ctrl-C) every iterator it made is closed: the
    tasks still out are cancelled, a Ray session it started ends."""
    from runners.limits import BadInput

    if getattr(args, "devices", None):
        raise BadInput(f"--ray {args.ray} and --devices: give one of them; on a Ray cluster "
                         "each task takes one GPU of its host")
    made = []

    def rows(work: list, one):
        made.append(_rows(args, work, one))
        return made[-1]

    try:
        yield rows
    finally:
        for it in made:
            it.close()


def _rows(args, work: list, one):
    """(Work, row) for every item of `work`, in the order their tasks finish (module
    docstring). A task answers with the raw rows of each item's runs (`_run_batch`); `one`
    turns them into the item's row here, replaying them as its `run_case`, so --repeat and the
    ledger are judged as in any sweep, and the row carries the sweep's run id."""
    from gpu_impls import known_issues

    if not work:  # a resumed run with nothing left: no cluster is joined
        return
    ray = _import_ray()
    started = _connect(ray, args.ray)
    pending = {}  # ObjectRef -> (the indices of `work` in its batch, when it was submitted)
    try:
        gpu = {b: needs_gpu(b) for b in {w.impl.backend for w in work}}
        resources = ray.cluster_resources()
        _check_feasible(gpu, resources, args.ray)
        # run_work's ledger (a check applies it): the tasks skip never-launch cases too
        spec = _spec(args, known_issues.ledger())
        task = ray.remote(_run_batch)
        retries = RETRIES if getattr(args, "ray_retries", None) is None else args.ray_retries
        env = {k: v for k, v in os.environ.items() if k.startswith("KPARITY_")}

        def submit(batch: list[int]) -> None:
            needs = {"num_gpus": 1} if gpu[work[batch[0]].impl.backend] else {"num_cpus": 1}
            ref = task.options(max_retries=retries, runtime_env={"env_vars": env},
                               **needs).remote(spec, [_item(work[i]) for i in batch])
            pending[ref] = (batch, time.perf_counter())

        def answered(ref):
            """(w, row) for each item of a finished task; a batch whose worker died: split."""
            batch, submitted = pending.pop(ref)
            try:
                ran = ray.get(ref)
            except ray.exceptions.RayTaskError as e:  # our code raised in the task
                _raise_from_task(e)
            except ray.exceptions.RayError as e:  # the worker died, retries spent
                if len(batch) > 1:  # which case killed it? halves, each with its retries
                    half = len(batch) // 2
                    submit(batch[:half])
                    submit(batch[half:])
                    return []
                w = work[batch[0]]
                ran = [[_died_row(w, e, retries, time.perf_counter() - submitted)]]
            return [(work[i], one(work[i], _replay(runs))) for i, runs in
                    zip(batch, ran, strict=True)]

        for batch in batches(work, gpu, resources):
            submit(batch)
        try:
            while pending:
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                yield from answered(ref)
        except KeyboardInterrupt:  # hand back the rows already computed, then stop
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            for ref in done:
                yield from answered(ref)
            raise
    finally:
        for ref in pending:  # stopped early: nothing keeps running for a sweep that ended
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


def _replay(runs: list[dict]):
    """`run_case(w, run_id)` answering with a task's rows of one item, in their order."""
    left = iter(runs)

    def run_case(w, run_id: str) -> dict:
        row = next(left, None)
        if row is None:  # run_one asked for a run the task did not make: the same code
            raise RuntimeError(f"{w.impl.id} case {w.case.id}: more runs asked than the Ray "
                               f"task made ({len(runs)}); driver and workers differ?")
        return {**row, "run_id": run_id}

    return run_case


def batches(work: list, gpu: dict[str, bool], resources: dict) -> list[list[int]]:
    """Indices of `work`, one impl's cases per batch (one backend, one runner), in work order;
    each at most BATCH_MAX long and short enough that every slot of its kind (the cluster's
    GPUs or CPUs) gets about TASKS_PER_SLOT batches."""
    by_impl: dict[str, list[int]] = {}
    for i, w in enumerate(work):
        by_impl.setdefault(w.impl.id, []).append(i)
    out = []
    for items in by_impl.values():
        kind = "GPU" if gpu[work[items[0]].impl.backend] else "CPU"
        same_kind = sum(len(v) for v in by_impl.values()
                        if gpu[work[v[0]].impl.backend] == (kind == "GPU"))
        slots = max(1, int(resources.get(kind, 1)))
        size = min(BATCH_MAX, max(1, math.ceil(same_kind / (TASKS_PER_SLOT * slots))))
        out += [items[k:k + size] for k in range(0, len(items), size)]
    return out


def _import_ray():
    from runners.limits import BadInput

    try:
        import ray
    except ImportError as e:
        raise BadInput(f"--ray needs Ray ({e}): pip install 'kparity[ray]'") from None
    return ray


def _connect(ray, where: str) -> bool:
    """Join the cluster `where` names (`local`: start one here); whether this call started the
    session (and so ends it). A process that has Ray initialised already (a notebook, a test)
    uses its session, whatever `where` says."""
    import logging

    from runners.limits import BadInput

    if ray.is_initialized():
        return False
    quiet = dict(logging_level=logging.WARNING, log_to_driver=False)
    try:
        if where == "local":
            ray.init(num_cpus=LOCAL_CPUS, include_dashboard=False, **quiet)
        else:
            ray.init(address=where, **quiet)
    except ConnectionError as e:
        raise BadInput(f"--ray {where}: no Ray cluster reached ({e}). Start one (`ray start "
                         "--head` on one host, `ray start --address HEAD:6379` on the others) "
                         "and give its address, or `auto` on one of its hosts; `--ray local` "
                         "starts one here") from None
    return True


def _check_feasible(gpu: dict[str, bool], resources: dict, where: str) -> None:
    """A GPU batch on a cluster without GPUs would wait forever: bad input, said at once."""
    from runners.limits import BadInput

    want = sorted(b for b, g in gpu.items() if g)
    if want and not resources.get("GPU"):
        has = ", ".join(f"{k} {resources[k]:g}" for k in ("CPU", "GPU") if k in resources)
        raise BadInput(
            f"--ray {where}: the {', '.join(want)} impls need a GPU each, and the Ray cluster "
            f"has none ({has or 'no resources'}). "
            "Start its workers on GPU hosts (`ray start --num-gpus N` declares an Apple GPU), "
            "or leave those impls out (--backend)")


def _spec(args, ledger) -> dict:
    """What every task needs besides its items: how the serial sweep would run them."""
    plugins = [os.path.abspath(p) if os.path.isfile(p) else p
               for p in getattr(args, "plugin", None) or []]
    return {"plugins": plugins, "isolate": getattr(args, "isolate", None) or "auto",
            "case_timeout": getattr(args, "case_timeout", None),
            "repeat": getattr(args, "repeat", None) or 1, "ledger": list(ledger)}


def _item(w) -> tuple:
    """A Work item as plain data, rebuilt by the task (`_run_batch`)."""
    return (w.impl.id, w.case.to_json(), w.expect, w.invariant,
            None if w.base is None else w.base.to_json())


def _run_batch(spec: dict, items: list[tuple]) -> list[list[dict]]:
    """On a Ray worker: for each item of the batch, the rows of the runs the serial sweep's
    `run_one` makes of it (--repeat, the ledger), on the runner it would pick (`case_runner`:
    --isolate), with the same plugins loaded. The driver's `one` replays them (`_replay`)."""
    from types import SimpleNamespace

    import gpu_impls
    from cases.generate import Work
    from cases.model import Case
    from runners.isolation import case_runner
    from runners.item import run_one

    for module in spec["plugins"]:  # once per worker process: load_plugin remembers
        gpu_impls.load_plugin(module)
    impls = gpu_impls.impls()
    work = [Work(impls[impl], Case.from_json(case), expect, invariant,
                 None if base is None else Case.from_json(base))
            for impl, case, expect, invariant, base in items]
    args = SimpleNamespace(isolate=spec["isolate"], plugin=spec["plugins"],
                           case_timeout=spec["case_timeout"])
    where = _where()
    out = []
    with case_runner(args, work) as run_case:
        for w in work:
            runs = []

            def recorded(w, run_id, runs=runs):
                row = {**run_case(w, run_id), **where}
                runs.append(dict(row))  # as it came: run_one's merging may change its own
                return row

            run_one(w, "", recorded, spec["repeat"], spec["ledger"])
            out.append(runs)
    return out


def _where() -> dict:
    """In a Ray task: the columns saying where its rows ran: `host`, and `device_index`, the
    GPU of that host Ray gave the task, as Ray numbers that host's GPUs (the entries of its
    CUDA_VISIBLE_DEVICES where the node started with one; None on a CPU task or where the
    entry is a UUID)."""
    import socket

    import ray

    gpus = ray.get_gpu_ids()
    index = str(gpus[0]) if gpus else ""
    return {"host": socket.gethostname(),
            "device_index": int(index) if index.isdigit() else None}


def _died_row(w, error: Exception, retries: int, seconds: float) -> dict:
    """The `crash` row of a case that alone killed its Ray worker on every try (its run id is
    set by `_replay`)."""
    from runners.isolation import row_without_result

    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return row_without_result(
        w, "", "crash",
        "the Ray worker died running this case, "
        + (f"on each of its {retries + 1} tries" if retries
           else "on its only try (--ray-retries 0)")
        + f" ({type(error).__name__}: {first[:300]}); "
        "the rest of its batch ran in other tasks", seconds)


def _raise_from_task(e: Exception):
    """An exception in a task's own code: a DeviceUnusable stays one (the CLI's `stopped:`
    line, --resume); anything else is raised with the task's traceback in its text."""
    from runners.limits import DeviceUnusable

    cause = getattr(e, "cause", None)
    if isinstance(cause, DeviceUnusable):
        raise DeviceUnusable(f"on a Ray worker: {cause}") from None
    raise e
