"""Oracle outputs cached on disk (`oracle/diskcache.py`), and computed ahead in a process pool.

What a check takes from the oracle for one case is a pure function of the case and the oracle's
code: the exact outputs and the rounded reference (`OpSpec.reference`), and the bounds
(`OpSpec.bounds`), which also depend on the impl's declared numerics on its backend. So two
entries per case: `ref` (exact and reference), keyed by the case, and `bounds`, keyed by the
case and the numerics (every impl that declares the same numerics shares it). The bounds
dominate the cost (a torch GEMV check: 36 s of bounds, 7 s of reference in a 60 s sweep).

A key is the hash of: the case the inputs were drawn from (`Case.key()`: op, dims, dtype, dist,
seed, params, `OpSpec.version`), the case the oracle ran on (the same with `ftz=1` on a backend
that flushes subnormals), the oracle's code (`fingerprint`), and for inputs that are not the
case's own (a pipeline stage fed by the kernel before it) their hash. Each entry also stores the
hash of the inputs it was computed from; an entry whose hash differs from the current inputs'
(an input generator that changed) is never used: it is recomputed and overwritten, and counted
`stale`. A truncated or damaged entry is a miss (`corrupt`).

The oracle's code (`fingerprint`): `OpSpec.version`, the text of every file under `oracle/`, the
text of each file that defines one of the op's oracle, kernel model, tolerance, input maker,
plant or `writes` (with each function's name and line), and the numpy and ml_dtypes versions.
An oracle that reads code anywhere else must bump `OpSpec.version` when that code changes (or
run with KPARITY_CACHE=off).

Loaded values are bit-identical to computed ones: same dtypes (ml_dtypes included), shapes and
memory order, writable arrays, Python and NumPy scalars restored as such; a value that cannot be
stored that way (an object array, a nested structure) is not cached.

`Prefetch` computes the missing entries of a work list in a pool of processes (one per core
but one) while the caller runs the work in order, waiting for each item's entry before it runs
(`kparity check`'s sweep, the GPU gate's fixture in tests/test_gpu.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import os
import signal
import threading
import time
from collections import Counter
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import numpy as np

from oracle.diskcache import (CacheConfigError, DiskCache, cache_root, digest, open_cache,
                              size_of_cap)
from runners.threads import SharedSpawnContext, cores, share, tether_to_parent

NAMESPACE = "oracle"
FORMAT = 1  # of an entry's payload; a change makes every old key a miss
# Outcomes of one lookup, worst first: a row's outcome is the worst of its two entries'.
OUTCOMES = ("stale", "corrupt", "miss", "uncacheable", "hit", "off")
# A sweep computes ahead in a pool only when at least this many entries are missing: below it,
# starting the pool's processes costs more than it saves.
PREFETCH_MIN = 64
# How often `Prefetch.wait` looks on disk for an entry another process may have written.
POLL_S = 0.05

# The key a sweep's runner adds to a row for the cache's outcome on it (`take_outcome`); not a
# store column: `run_work` pops it.
CACHE_KEY = "_oracle_cache"

_seen: list[str] = []  # outcomes of this process's lookups since the last `take_outcome`
_fingerprints: dict[int, tuple[object, str]] = {}


def current_cache() -> DiskCache | None:
    """This process's cache under the current environment (None: KPARITY_CACHE=off)."""
    return open_cache(NAMESPACE)


def describe_cache() -> str:
    root = cache_root()
    return "off (KPARITY_CACHE=off)" if root is None else str(root)


# --- keys --------------------------------------------------------------------------------------

def fingerprint(spec) -> str:
    """A hash of the code that computes `spec`'s oracle outputs and bounds (module docstring)."""
    known = _fingerprints.get(id(spec))
    if known is not None and known[0] is spec:
        return known[1]
    import ml_dtypes

    parts = [f"{spec.name} v{spec.version} numpy {np.__version__} ml_dtypes "
             f"{ml_dtypes.__version__}", _oracle_package_digest()]
    files = set()
    functions = [spec.oracle, spec.kernel, spec.tolerance, spec.make_inputs, spec.plant,
                 *(t.writes for t in spec.outputs)]
    for fn in functions:
        where = _defined_at(fn)
        if where is not None:
            files.add(where[0])
            parts.append(f"{where[1]}:{where[2]}")
    parts += [_file_text(path) for path in sorted(files)]
    if spec.pipeline is not None:
        parts += [fingerprint(stage.spec) for stage in spec.pipeline.stages]
    value = digest(*parts)
    _fingerprints[id(spec)] = (spec, value)
    return value


@functools.lru_cache(maxsize=None)
def _oracle_package_digest() -> str:
    """Every file of `oracle/` (the spec machinery, numerics, dtypes, each family's oracles)."""
    folder = Path(__file__).resolve().parent.parent / "oracle"
    return digest(*(_file_text(str(path)) for path in sorted(folder.glob("*.py"))))


def _file_text(path: str) -> str:
    """The file's name and text (not where the checkout lives: two checkouts share entries)."""
    try:
        return f"{Path(path).name}\n" + Path(path).read_text()
    except OSError:
        return f"{path}: unreadable"


def _defined_at(fn) -> tuple[str, str, int] | None:
    """(source file, qualified name, first line) of a function, a bound method, a partial or a
    callable object; None where there is no Python source (None, a builtin)."""
    if fn is None:
        return None
    fn = getattr(fn, "func", fn)  # functools.partial
    fn = getattr(fn, "__func__", fn)  # a bound method
    if not inspect.isfunction(fn):
        fn = getattr(type(fn), "__call__", None)
    try:
        return (inspect.getsourcefile(fn), fn.__qualname__, fn.__code__.co_firstlineno)
    except (TypeError, AttributeError):
        return None


def inputs_hash(inputs: dict) -> str:
    """A hash of the inputs' names, dtypes, shapes and bytes."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(inputs):
        value = np.asarray(inputs[name])
        h.update(f"{name}|{_dtype_name(value.dtype)}|{value.shape}|".encode())
        h.update(np.ascontiguousarray(value).view(np.uint8))
    return h.hexdigest()


def numerics_key(numerics) -> str:
    if dataclasses.is_dataclass(numerics):
        return json.dumps(dataclasses.asdict(numerics), sort_keys=True, default=str)
    return repr(numerics)


def entry_keys(case, oracle_case, numerics, given_inputs: str | None) -> tuple[str, str]:
    """(key of the `ref` entry, key of the `bounds` entry)."""
    base = json.dumps({"format": FORMAT, "inputs_of": case.key(),
                       "oracle_case": oracle_case.key(), "code": fingerprint(case.spec),
                       "given_inputs": given_inputs}, sort_keys=True, default=str)
    return digest("ref", base), digest("bounds", base, numerics_key(numerics))


# --- lookups -----------------------------------------------------------------------------------

def reference_and_bounds(case, inputs: dict, numerics, ftz: bool, own_inputs: bool = True,
                         cache: DiskCache | None | bool = True):
    """(exact, reference, bounds, outcome) for `case` on `inputs` (its own, drawn by
    `make_inputs(case)`, unless `own_inputs` is False), the oracle run under flush-to-zero
    semantics where `ftz` and the op has the param, the bounds for `numerics`. `cache=True`:
    the current cache (`current_cache`); None or False: none. `outcome` is one of OUTCOMES."""
    spec = case.spec
    oracle_case = _oracle_case(case, ftz, numerics)
    if cache is True:
        cache = current_cache()
    if not cache:
        exact, ref = spec.reference(inputs, oracle_case)
        _seen.append("off")
        return exact, ref, spec.bounds(inputs, exact, oracle_case, numerics), "off"
    hashed = inputs_hash(inputs)
    ref_key, bounds_key = entry_keys(case, oracle_case, numerics,
                                     None if own_inputs else hashed)
    got, ref_outcome = _load(cache, ref_key, hashed)
    if got is None:
        exact, ref = spec.reference(inputs, oracle_case)
        ref_outcome = _store(cache, ref_key, hashed, {"exact": exact, "ref": ref}, ref_outcome)
    else:
        exact, ref = got.get("exact", {}), got.get("ref", {})  # a group of no values: absent
    got, bounds_outcome = _load(cache, bounds_key, hashed)
    if got is None:
        bounds = spec.bounds(inputs, exact, oracle_case, numerics)
        bounds_outcome = _store(cache, bounds_key, hashed, {"bounds": bounds}, bounds_outcome)
    else:
        bounds = got.get("bounds", {})
    outcome = worst(ref_outcome, bounds_outcome)
    _seen.append(outcome)
    return exact, ref, bounds, outcome


def _oracle_case(case, ftz: bool, numerics=None):
    """The case the oracle runs on: under flush-to-zero semantics on a backend that flushes
    subnormals, and under the overflow the impl declares (`Numerics.overflow`), where the op has
    the param."""
    if ftz and "ftz" in case.spec.params:
        case = case.replace(ftz=1)
    declared = getattr(numerics, "overflow", None)
    if declared and "overflow" in case.spec.params:
        case = case.replace(overflow=declared)
    return case


def worst(*outcomes: str) -> str:
    return min(outcomes, key=OUTCOMES.index)


def take_outcome() -> str | None:
    """The worst outcome of this process's lookups since the last call (None: there were none,
    e.g. a case its contract refused), and forget them: a runner calls it around one check."""
    outcome = worst(*_seen) if _seen else None
    _seen.clear()
    return outcome


def _load(cache: DiskCache, key: str, hashed: str) -> tuple[dict | None, str]:
    """(the entry's groups, "hit") or (None, why not: "miss", "corrupt", "stale")."""
    corrupt_before = cache.corrupt
    payload = cache.get(key)
    if payload is None:
        return None, "corrupt" if cache.corrupt > corrupt_before else "miss"
    unpacked = unpack(payload)
    if unpacked is None:
        return None, "corrupt"
    header, groups = unpacked
    if header.get("inputs") != hashed:
        return None, "stale"
    return groups, "hit"


def _store(cache: DiskCache, key: str, hashed: str, groups: dict, outcome: str) -> str:
    payload = pack({"inputs": hashed}, groups)
    if payload is None:
        return "uncacheable"
    cache.put(key, payload)
    return outcome


# --- the entry format --------------------------------------------------------------------------
# payload = 8-byte little-endian header length, the header (JSON: the caller's fields and one
# record per value), then each value's bytes in record order.

def pack(fields: dict, groups: dict[str, dict]) -> bytes | None:
    """`groups` ({group: {name: value}}) as a payload, or None where a value cannot be restored
    bit for bit (module docstring)."""
    records, blobs = [], []
    for group, values in groups.items():
        for name, value in values.items():
            kind = _kind(value)
            if kind is None:
                return None
            array = np.asarray(value)
            dtype = _dtype_name(array.dtype)
            if dtype is None:
                return None
            order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
            blob = array.tobytes(order=order)
            records.append({"group": group, "name": name, "kind": kind, "dtype": dtype,
                            "shape": list(array.shape), "order": order, "nbytes": len(blob)})
            blobs.append(blob)
    header = json.dumps({**fields, "values": records}).encode()
    return b"".join([len(header).to_bytes(8, "little"), header, *blobs])


def unpack(payload: bytes) -> tuple[dict, dict[str, dict]] | None:
    """(header, groups) from `pack`'s payload, or None where it does not parse."""
    try:
        size = int.from_bytes(payload[:8], "little")
        header = json.loads(payload[8:8 + size])
        offset, groups = 8 + size, {}
        for r in header["values"]:
            dtype = _dtype(r["dtype"])
            count = r["nbytes"] // dtype.itemsize
            if offset + r["nbytes"] > len(payload):
                return None
            flat = np.frombuffer(payload, dtype, count, offset).copy()  # owned, writable
            array = flat.reshape(r["shape"], order=r["order"])
            offset += r["nbytes"]
            groups.setdefault(r["group"], {})[r["name"]] = _restore(array, r["kind"])
        if offset != len(payload):
            return None
        return header, groups
    except (ValueError, KeyError, TypeError, AttributeError, json.JSONDecodeError):
        return None


def _kind(value) -> str | None:
    if isinstance(value, np.ndarray):
        return "array"
    if isinstance(value, np.generic):
        return "numpy"
    for kind in (bool, int, float):  # bool before int: True is an int too
        if type(value) is kind:
            return kind.__name__
    return None


def _restore(array: np.ndarray, kind: str):
    if kind == "array":
        return array
    if kind == "numpy":
        return array[()]
    return {"bool": bool, "int": int, "float": float}[kind](array.item())


def _dtype_name(dtype: np.dtype) -> str | None:
    """A dtype as text: NumPy's own (`dtype.str`) or an ml_dtypes type (`ml:bfloat16`); None for
    one that cannot round-trip (objects, structured)."""
    if dtype.type.__module__.startswith("ml_dtypes"):
        return f"ml:{dtype.name}"
    if dtype.kind in "OV" or dtype.fields is not None:
        return None
    return dtype.str


def _dtype(name: str) -> np.dtype:
    if name.startswith("ml:"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name[3:]))
    return np.dtype(name)


# --- computing ahead ---------------------------------------------------------------------------

def _task_key(case, numerics, ftz: bool) -> tuple:
    return case.to_json(), numerics_key(numerics), ftz


def warm(case_json: str, numerics, ftz: bool) -> str:
    """In a pool process: the entries of one case (its own inputs), computed where missing;
    the lookup's outcome."""
    from cases.model import Case, make_inputs

    _load_plugins_for(json.loads(case_json)["op"])
    case = Case.from_json(case_json)
    cache = current_cache()
    if cache is not None and _present(cache, case, numerics, ftz):  # another process's pool
        return "hit"
    return reference_and_bounds(case, make_inputs(case), numerics, ftz)[3]


_PLUGINS: list[str] = []  # the sweep's --plugin modules, loaded in a pool process on demand


def _load_plugins_for(op: str) -> None:
    """An op this process does not know yet comes from a plugin: load them (once)."""
    from oracle.spec import registry

    if op in registry():
        return
    import gpu_impls

    gpu_impls.impls()  # the `kparity.plugins` entry points
    for module in _PLUGINS:
        gpu_impls.load_plugin(module)


def _init_worker(plugins: list[str]) -> None:
    # Ctrl-C reaches the whole process group: the sweep handles it and stops the pool, so a
    # worker must not die of it mid-task (15 tracebacks); it started with Ctrl-C blocked
    # (`runners/threads.py`): ignored from here on, and one pressed meanwhile is dropped
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    tether_to_parent()  # a killed sweep leaves no pool process writing to a closed pipe
    _PLUGINS[:] = plugins


def spawn_pool(size: int, plugins: list[str] | None = None, peers: int = 1
               ) -> ProcessPoolExecutor:
    """`size` spawned processes (spawn: never a forked CUDA context), each starting with its
    share of the host's BLAS / OpenMP threads (`runners/threads.py`) among the `size * peers`
    pool processes on the host (`peers`: processes that each run such a pool, pytest-xdist's
    workers: with 8 workers' pools of 2 on 16 cores, each process took 8 threads, 128 in all,
    before `peers` counted them). A process that dies
    (killed, out of memory) breaks the pool: every task not done fails at once
    (BrokenProcessPool), which `Prefetch.wait` takes as "failed" (the check computes the entry
    itself), where multiprocessing.Pool hung on the queue lock the dead process held."""
    return ProcessPoolExecutor(size, mp_context=SharedSpawnContext(share(size * peers)),
                               initializer=_init_worker, initargs=(list(plugins or []),))


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and end the processes at once, mid-task included (what they
    compute is for cases the sweep will not reach); waits until they are gone.
    `ProcessPoolExecutor.terminate_workers` (Python 3.14) does the same."""
    processes = list((pool._processes or {}).values())  # noqa: SLF001  (no API before 3.14)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    pool.shutdown(wait=True)


def pool_size(peers: int = 1) -> int:
    """Processes for `Prefetch`: one per core this process may use, but one (the sweep's own);
    with `peers` processes that each run a pool on this host (pytest-xdist's workers), their
    share of the cores (`share`). KPARITY_CACHE_WORKERS overrides."""
    given = os.environ.get("KPARITY_CACHE_WORKERS", "").strip()
    if given:
        if not given.isdigit():
            raise CacheConfigError(f"KPARITY_CACHE_WORKERS={given!r}: the number of processes "
                                   "that compute oracle entries ahead of a sweep, 0 or more")
        return int(given)
    return share(peers) if peers > 1 else cores() - 1


class Prefetch:
    """Computes the missing cache entries of `work` (valid cases of unstaged impls) in a pool
    of processes, in the work's order; `wait(w)` blocks until `w`'s entries are done (or failed:
    the check then computes them itself and meets the same error). With the cache off, too few
    entries missing (PREFETCH_MIN) or one core, it starts nothing and `wait` returns at once.
    A context manager; on exit the pool stops (`close`)."""

    def __init__(self, work, backend_of, plugins: list[str] | None = None,
                 workers: int | None = None, start: int = 0, peers: int = 1,
                 take_pending: bool = False):
        """`backend_of(name)`: the backend object (only its `flushes_subnormals` is read).
        `start`: the index in `work` where this process's own run begins; the pool computes
        from there to the end, then the items before it. Several processes that split one
        work list (pytest-xdist's workers, each starting on its own stretch of the same list)
        so compute each other's entries last, not all the same ones first: `wait` also takes
        an entry another process wrote. `peers`: how many such processes run a pool on
        this host (`spawn_pool`). `take_pending`: `wait` on an entry the pool has not started
        returns at once (outcome "taken": the check computes it) where this process's order is
        not the pool's (an xdist worker: long tests first, stolen tests), so that it does not
        wait behind the entries queued before it (a 24 x 1536 GEMV case waited 76 s so in
        the nightly H100 gate); a sweep in the pool's order keeps waiting (its threads would
        compute in one process, under one GIL)."""
        self.futures: dict[tuple, Future] = {}
        self.take_pending = take_pending
        self.outcomes: Counter = Counter()
        self._counting = threading.Lock()  # wait() runs on every --devices thread
        self.workers = 0
        self.pool = None
        # Seconds the sweep's threads spent blocked in `wait`, summed over them (one thread
        # per device under --devices): near the wall time (per thread), the pool (the host's
        # CPUs), not the devices, set the sweep's pace.
        self.waited = 0.0
        self.waiters: set[int] = set()  # the threads that waited
        cache = current_cache()
        if cache is None:
            return
        tasks = {}
        start = min(max(start, 0), len(work))
        for w in [*work[start:], *work[:start]]:
            if w.expect != "valid" or w.impl.stages is not None:
                continue
            ftz = bool(backend_of(w.impl.backend).flushes_subnormals)
            numerics = w.impl.numerics_for(w.case)
            key = _task_key(w.case, numerics, ftz)
            if key not in tasks and not _present(cache, w.case, numerics, ftz):
                tasks[key] = (w.case.to_json(), numerics, ftz)
        size = min(workers if workers is not None else pool_size(), len(tasks))
        if len(tasks) < PREFETCH_MIN or size < 1:
            return
        self.pool = spawn_pool(size, plugins, peers)
        self.workers = size
        self.futures = {key: self.pool.submit(warm, *args) for key, args in tasks.items()}
        self._backend_of = backend_of
        self._cache = cache

    def wait(self, w) -> str | None:
        """Block until the pool is done with `w`'s entries; "miss", "stale" or "corrupt" where
        it computed them (the check then finds them: a hit that this run computed), else
        None."""
        if not self.futures or w.expect != "valid" or w.impl.stages is not None:
            return None
        ftz = bool(self._backend_of(w.impl.backend).flushes_subnormals)
        future = self.futures.pop(_task_key(w.case, w.impl.numerics_for(w.case), ftz),
                                  None)
        if future is None:
            return None
        if self.take_pending and future.cancel():  # not started: the check computes it now
            with self._counting:
                self.outcomes["taken"] += 1
            return None
        from runners.limits import case_timeout

        started = time.monotonic()
        try:  # a hung oracle (or a pool process that died) must not hang the sweep: the
            # check computes it, under its own timeout
            outcome = self._first_done(future, w, ftz, case_timeout(w.case, first_of_shape=True))
        except FutureTimeout:
            outcome = "late"
        except Exception:  # noqa: BLE001  (the check computes it and reports the error; a
            # process of the pool died: BrokenProcessPool)
            outcome = "failed"
        with self._counting:
            self.outcomes[outcome] += 1
            self.waited += time.monotonic() - started
            self.waiters.add(threading.get_ident())
        return outcome if outcome in ("miss", "stale", "corrupt") else None

    def _first_done(self, future, w, ftz: bool, timeout: float) -> str:
        """The pool's outcome for `w`, or "miss" as soon as both its entries are on disk
        (written by another process's pool: this run computed them all the same)."""
        numerics = w.impl.numerics_for(w.case)
        deadline = time.monotonic() + timeout
        while not future.done():
            if _present(self._cache, w.case, numerics, ftz):
                return "miss"
            if time.monotonic() >= deadline:
                raise FutureTimeout
            try:
                return future.result(POLL_S)
            except FutureTimeout:
                pass
        return future.result()

    def close(self) -> None:
        """Stop the pool: what it still computes is for cases the sweep did not reach."""
        if self.pool is not None:
            stop_pool(self.pool)
            self.pool = None

    def __enter__(self) -> "Prefetch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _present(cache: DiskCache, case, numerics, ftz: bool) -> bool:
    """Whether both entries of the case exist (not read: the check verifies them)."""
    keys = entry_keys(case, _oracle_case(case, ftz, numerics), numerics, None)
    return all(cache.path(k).exists() for k in keys)


def summary(outcomes: Counter, prefetch: Prefetch | None = None) -> str:
    """One line for a sweep's end: where the cache is, what it served (hits: the percent of
    the rows' lookups it served) and its size against its cap (a scan of the cache's files:
    pool processes wrote to it too)."""
    checked = sum(outcomes.values())
    if not checked:
        return ""
    if outcomes.get("off"):
        return "oracle cache: off (KPARITY_CACHE=off)"
    computed = sum(outcomes[k] for k in ("miss", "stale", "corrupt", "uncacheable"))
    parts = [f"{outcomes['hit']} hits ({100 * outcomes['hit'] // checked} %)",  # 100: all
             f"{computed} computed"]
    if prefetch is not None and prefetch.workers:
        ahead = sum(n for k, n in prefetch.outcomes.items() if k in ("miss", "stale", "corrupt"))
        parts[1] += (f" ({ahead} of them ahead in {prefetch.workers} "
                     f"{'process' if prefetch.workers == 1 else 'processes'}"
                     + (f"; the sweep waited {prefetch.waited:.0f} s for them"
                        + (f", summed over {len(prefetch.waiters)} device threads"
                           if len(prefetch.waiters) > 1 else "")
                        if prefetch.waited >= 0.5 else "") + ")")
    if outcomes["stale"]:
        parts.append(f"{outcomes['stale']} stale entries recomputed (their inputs changed)")
    if outcomes["corrupt"]:
        parts.append(f"{outcomes['corrupt']} unreadable entries recomputed")
    if outcomes["uncacheable"]:
        parts.append(f"{outcomes['uncacheable']} not storable")
    line = f"oracle cache {describe_cache()}: " + ", ".join(parts)
    try:
        cache = current_cache()
    except CacheConfigError:  # reported where the sweep opened it
        return line
    return line if cache is None else f"{line}; {size_of_cap(cache.scan_size(), cache.cap)}"
