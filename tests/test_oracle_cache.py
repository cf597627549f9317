"""The oracle cache (`runners/oracle_cache.py` over `oracle/diskcache.py`): hits are bit-identical
to computing, a damaged or stale entry is recomputed (never trusted, never an exception), the
size cap evicts the least recently used entries, concurrent writers and readers are safe, and
the cache changes no verdict."""

from __future__ import annotations

import json
import multiprocessing
import os

import numpy as np
import pytest

import gpu_impls
from cases.generate import plan
from cases.model import Case, make_inputs
from oracle.diskcache import MAGIC, DiskCache
from oracle.numerics import DEFAULT
from runners import oracle_cache
from runners.correctness import check
from runners.isolation import check_noting_cache
from runners.oracle_cache import CACHE_KEY, pack, reference_and_bounds, unpack

GEMV = Case.make("dequant_gemv", {"out": 16, "in": 256, "bits": 4, "group_size": 64}, "bf16")
NORM = Case.make("rms_norm", {"rows": 3, "n": 64}, "f16", "tiny")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KPARITY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KPARITY_CACHE_MB", raising=False)
    return oracle_cache.current_cache()


def assert_same(a, b):
    """Equal bit for bit, of the same type, dtype, shape and memory order; b writable."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert (a.flags.c_contiguous, a.flags.f_contiguous) == \
            (b.flags.c_contiguous, b.flags.f_contiguous)
        assert a.tobytes(order="A") == b.tobytes(order="A") and b.flags.writeable
    else:
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def lookup(case, inputs=None, ftz=False):
    inputs = make_inputs(case) if inputs is None else inputs
    return reference_and_bounds(case, inputs, DEFAULT.on("cuda"), ftz=ftz)


@pytest.mark.parametrize("case", [GEMV, NORM], ids=["gemv", "norm"])
@pytest.mark.parametrize("ftz", [False, True])
def test_a_miss_then_a_hit_bit_identical_to_computing(cache, case, ftz):
    computed = reference_and_bounds(case, make_inputs(case), DEFAULT.on("cuda"), ftz=ftz,
                                    cache=None)
    first = lookup(case, ftz=ftz)
    second = lookup(case, ftz=ftz)
    assert (computed[3], first[3], second[3]) == ("off", "miss", "hit")
    for a, b, c in zip(computed[:3], first[:3], second[:3]):
        assert_same(a, b)
        assert_same(a, c)


def test_ftz_numerics_and_inputs_of_another_case_are_other_entries(cache):
    assert lookup(NORM)[3] == "miss"
    assert lookup(NORM, ftz=True)[3] == "miss"  # the oracle under flush-to-zero: its own entry
    other = DEFAULT.on("mlx")  # another function-ULP table: the same reference, other bounds
    assert reference_and_bounds(NORM, make_inputs(NORM), other, ftz=False)[3] == "miss"
    assert reference_and_bounds(NORM, make_inputs(NORM), other, ftz=False)[3] == "hit"


def test_pack_round_trips_every_kind_of_value():
    import ml_dtypes

    values = {"f_order": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
              "bf16": np.array([1.5, -0.0, np.nan], dtype=ml_dtypes.bfloat16),
              "zero_d": np.array(2.5), "numpy": np.float64(3.25), "py": 0.0, "int": 7,
              "flag": True, "empty": np.zeros((0, 5), np.float32),
              "ids": np.array([[3, 1]], np.int32)}
    header, groups = unpack(pack({"inputs": "x"}, {"g": values}))
    assert header["inputs"] == "x"
    assert_same(values, groups["g"])
    assert pack({}, {"g": {"obj": np.array([None])}}) is None  # not storable: not cached
    assert pack({}, {"g": {"nested": {"a": 1}}}) is None


def _entry_files(cache) -> list:
    return sorted(p for p in cache.dir.rglob("*") if p.is_file())


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "bad_payload"])
def test_a_damaged_entry_is_a_miss_and_is_rewritten(cache, damage):
    good = lookup(GEMV)
    for path in _entry_files(cache):
        data = path.read_bytes()
        if damage == "truncated":
            path.write_bytes(data[:len(data) // 2])
        elif damage == "garbage":  # same length, the values' last bytes flipped
            path.write_bytes(data[:-16] + bytes(b ^ 0xFF for b in data[-16:]))
        elif damage == "empty":
            path.write_bytes(b"")
        else:  # a valid digest over a payload that does not parse
            import hashlib

            payload = b"\x05" * 40
            path.write_bytes(MAGIC + hashlib.blake2b(payload, digest_size=16).digest() + payload)
    again = lookup(GEMV)
    assert again[3] == "corrupt"
    for a, b in zip(good[:3], again[:3]):
        assert_same(a, b)
    assert lookup(GEMV)[3] == "hit"  # rewritten whole


def test_an_entry_of_other_inputs_is_never_used(cache):
    """Same case, inputs that differ (a changed input generator): the entry is recomputed on
    the current inputs and overwritten."""
    inputs = make_inputs(GEMV)
    assert lookup(GEMV, inputs)[3] == "miss"
    changed = {**inputs, "x": (inputs["x"].astype(np.float64) * 2).astype(inputs["x"].dtype)}
    expected = reference_and_bounds(GEMV, changed, DEFAULT.on("cuda"), ftz=False, cache=None)
    got = lookup(GEMV, changed)
    assert got[3] == "stale"
    for a, b in zip(expected[:3], got[:3]):
        assert_same(a, b)
    assert lookup(GEMV, changed)[3] == "hit"
    assert lookup(GEMV, inputs)[3] == "stale"


def test_off_computes_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("KPARITY_CACHE", "off")
    assert oracle_cache.current_cache() is None
    assert lookup(GEMV)[3] == "off"
    monkeypatch.setenv("KPARITY_CACHE", str(tmp_path / "c"))
    assert lookup(GEMV)[3] == "miss"


def test_eviction_at_the_cap_removes_the_least_recently_used(tmp_path):
    cache = DiskCache(tmp_path, "t", cap=4 * 1100)  # four 1000-byte entries (and headers) fit
    keys = [f"{i:02x}" * 32 for i in range(5)]
    for t, key in enumerate(keys[:4]):
        assert cache.put(key, bytes([t]) * 1000)
        os.utime(cache.path(key), (1000 + t, 1000 + t))  # written in this order
    assert cache.get(keys[0]) is not None  # used now: the newest
    assert cache.put(keys[4], b"\x04" * 1000)  # over the cap: down to 90 % of it
    assert [cache.get(k) is not None for k in keys] == [True, False, False, True, True]
    assert cache.scan_size() <= 0.9 * cache.cap


def test_eviction_tolerates_files_that_vanish(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path, "t", cap=10_000)
    for i in range(3):
        cache.put(f"{i:02x}" * 32, b"x" * 100)
    files = cache._files()
    for path, _, _ in files:
        path.unlink()  # another process evicted them after our scan
    monkeypatch.setattr(cache, "_files", lambda: files)
    cache.cap = 1
    cache.evict()  # no exception


def _write_many(root: str, key: str, payload: bytes, start, rounds: int) -> None:
    cache = DiskCache(root, "t", cap=1 << 30)
    start.wait()
    for _ in range(rounds):
        assert cache.put(key, payload)


def _read_many(root: str, key: str, payload: bytes, start, rounds: int, bad) -> None:
    cache = DiskCache(root, "t", cap=1 << 30)
    start.wait()
    for _ in range(rounds):
        got = cache.get(key)
        if got is not None and got != payload:
            bad.value += 1
    bad.value += cache.corrupt


def test_two_processes_writing_one_entry_at_once_both_succeed(tmp_path):
    ctx = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    payload = os.urandom(1 << 20)
    key = "ab" * 32
    start, bad = ctx.Barrier(3), ctx.Value("i", 0)
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), key, payload, start, 40))
             for _ in range(2)]
    procs.append(ctx.Process(target=_read_many,
                             args=(str(tmp_path), key, payload, start, 200, bad)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert bad.value == 0  # the reader never saw a partial or mixed entry
    assert DiskCache(tmp_path, "t", cap=1 << 30).get(key) == payload
    assert [p.name for p in (tmp_path / "t").rglob("*") if p.is_file()] == [key]  # no temps


def _comparable(rows: list[dict]) -> list[str]:
    """Each row as JSON without its timing and cache outcome (NaN metrics compare equal)."""
    return [json.dumps({k: v for k, v in r.items() if k not in ("seconds", CACHE_KEY)},
                       sort_keys=True) for r in rows]


def test_the_cache_changes_no_verdict(tmp_path, monkeypatch):
    """A small torch check: the same rows (statuses, messages, every metric) with the cache
    off, cold and warm."""
    impls = gpu_impls.impls()
    work = [w for impl_id, preset in (("torch:rms_norm", "qwen3-0.6b"),
                                      ("torch:dequant_linear", "int4-g64"))
            for w in plan([impls[impl_id]], presets=[preset], dtypes=["bf16"])][::3]
    torch = gpu_impls.backend("torch")
    monkeypatch.setenv("KPARITY_CACHE", "off")
    off = [check(w, torch) for w in work]
    monkeypatch.setenv("KPARITY_CACHE", str(tmp_path / "c"))
    cold = [check_noting_cache(w, torch, "") for w in work]
    warm = [check_noting_cache(w, torch, "") for w in work]
    assert {r[CACHE_KEY] for r in cold if r["expect"] == "valid"} == {"miss"}
    assert {r[CACHE_KEY] for r in warm if r["expect"] == "valid"} == {"hit"}
    assert len(work) >= 4 and _comparable(off) == _comparable(cold) == _comparable(warm)


def test_check_prints_the_cache_line_and_refuses_a_bad_cap(tmp_path, monkeypatch, capsys):
    from verbs.cli import main

    monkeypatch.setenv("KPARITY_CACHE", str(tmp_path / "c"))
    argv = ["--store", str(tmp_path / "s"), "check", "--impl", "torch:rms_norm", "--preset",
            "qwen3-0.6b", "--dtype", "f32"]
    assert main(argv) == 0
    assert f"oracle cache {tmp_path / 'c'}: 0 hits (0 %), " in capsys.readouterr().out
    assert main(argv) == 0
    assert " hits (100 %), 0 computed; " in capsys.readouterr().out
    monkeypatch.setenv("KPARITY_CACHE_MB", "lots")
    assert main(argv) == 2
    assert "KPARITY_CACHE_MB='lots'" in capsys.readouterr().out


def test_prefetch_computes_ahead_what_the_check_then_finds(cache, monkeypatch):
    """The pool's entries are the ones the check looks up: after `wait`, a hit."""
    monkeypatch.setattr(oracle_cache, "PREFETCH_MIN", 1)
    impl = gpu_impls.impls()["torch:dequant_linear"]
    work = [w for w in plan([impl], presets=["int4-g64"], dtypes=["f16"])
            if w.expect == "valid"][:2]
    torch = gpu_impls.backend("torch")
    with oracle_cache.Prefetch(work, gpu_impls.backend, workers=1) as ahead:
        assert ahead.workers == 1
        assert [ahead.wait(w) for w in work] == ["miss", "miss"]
    assert [check_noting_cache(w, torch, "")[CACHE_KEY] for w in work] == ["hit", "hit"]
    with oracle_cache.Prefetch(work, gpu_impls.backend, workers=1) as ahead:
        assert ahead.workers == 0  # nothing missing: no pool


def _two_dequant_cases():
    impl = gpu_impls.impls()["torch:dequant_linear"]
    return [w for w in plan([impl], presets=["int4-g64"], dtypes=["f16"])
            if w.expect == "valid"][:2]


def test_prefetch_starts_where_this_process_starts(cache, monkeypatch):
    """`start`: the pool's first task is the work item there (an xdist worker's own stretch
    first), the ones before it come last."""
    monkeypatch.setattr(oracle_cache, "PREFETCH_MIN", 1)
    work = _two_dequant_cases()
    for start, first in ((0, work[0]), (1, work[1])):
        with oracle_cache.Prefetch(work, gpu_impls.backend, workers=1, start=start) as ahead:
            keys = list(ahead.futures)
            assert keys[0] == oracle_cache._task_key(
                first.case, first.impl.numerics.on("torch"), False)
            assert len(keys) == 2


class _NeverReady:
    """A pool task that never finishes (the pool stuck on something else)."""

    def done(self):
        return False

    def result(self, timeout=None):
        import time
        from concurrent.futures import TimeoutError as FutureTimeout

        time.sleep(timeout)
        raise FutureTimeout


def test_wait_takes_an_entry_another_process_wrote(cache, monkeypatch):
    """A worker whose own pool has not reached a case takes the entries as soon as another
    process (another xdist worker's pool) wrote them; absent, it waits out the timeout."""
    import runners.limits

    monkeypatch.setattr(oracle_cache, "PREFETCH_MIN", 1)
    monkeypatch.setattr(runners.limits, "case_timeout", lambda case, first_of_shape: 1.0)
    work = _two_dequant_cases()
    with oracle_cache.Prefetch(work, gpu_impls.backend, workers=1) as ahead:
        ahead.close()  # nothing of the pool's own
        for key in ahead.futures:
            ahead.futures[key] = _NeverReady()
        assert ahead.wait(work[1]) is None and ahead.outcomes["late"] == 1
        check_noting_cache(work[0], gpu_impls.backend("torch"), "")  # "another process"
        assert ahead.wait(work[0]) == "miss"


def test_take_pending_computes_what_the_pool_has_not_started(cache, monkeypatch):
    """With `take_pending` (the xdist gate, whose order is not the pool's), `wait` on an entry
    still queued returns at once and the pool drops it; one it has started is waited for.
    Without (a sweep in the pool's order), a queued entry is waited for until the pool does it."""
    import threading
    from concurrent.futures import Future

    import runners.limits

    monkeypatch.setattr(oracle_cache, "PREFETCH_MIN", 1)
    monkeypatch.setattr(runners.limits, "case_timeout", lambda case, first_of_shape: 2.0)
    work = _two_dequant_cases()
    for take, expected in ((True, None), (False, "miss")):
        with oracle_cache.Prefetch(work, gpu_impls.backend, workers=1,
                                   take_pending=take) as ahead:
            ahead.close()  # the futures below stand for the pool's
            queued, started = Future(), Future()
            started.set_running_or_notify_cancel()
            started.set_result("miss")
            keys = list(ahead.futures)
            ahead.futures[keys[0]], ahead.futures[keys[1]] = started, queued
            # without: the pool reaches the queued entry while the check waits (still pending
            # when `wait` starts, so a cancel there would succeed); with: it never does, and
            # a `wait` that did not take it would sit out the 2 s timeout and return None
            # without cancelling it
            late = threading.Timer(0.5, lambda: queued.set_running_or_notify_cancel()
                                   and queued.set_result("miss"))
            if not take:
                late.start()
            try:
                assert ahead.wait(work[1]) == expected
            finally:
                late.cancel()
                if not take:
                    late.join()
            assert queued.cancelled() is take and ahead.outcomes["taken"] == int(take)
            assert ahead.wait(work[0]) == "miss"  # started: waited for, either way


def test_pool_workers_leave_ctrl_c_to_the_sweep():
    """Ctrl-C reaches the whole process group; the prefetch pool's workers ignore it (the sweep
    terminates them), so none dies mid-task holding the pool's queue lock."""
    import signal

    with oracle_cache.spawn_pool(1) as pool:
        assert pool.submit(signal.getsignal, signal.SIGINT).result() == signal.SIG_IGN


def test_a_pool_process_killed_while_idle_does_not_hang_the_sweeps_end(cache, monkeypatch):
    """`kill -9` of a pool process that was waiting for a task (it had computed all of them):
    multiprocessing.Pool's terminate then waited for good on the queue lock the dead process
    held, and the sweep never ended. The pool now stops at once, and a broken pool's entries
    are the check's to compute (`wait`: None)."""
    import signal
    import threading
    import time

    monkeypatch.setattr(oracle_cache, "PREFETCH_MIN", 1)
    work = _two_dequant_cases()
    ahead = oracle_cache.Prefetch(work, gpu_impls.backend, workers=1)
    try:
        assert ahead.wait(work[0]) == "miss"
        for future in ahead.futures.values():
            future.result(120)  # all computed: the process now waits for a task
        [process] = multiprocessing.active_children()
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
        time.sleep(0.5)  # the pool notices
    finally:
        stopping = threading.Thread(target=ahead.close, daemon=True)
        stopping.start()
        stopping.join(60)
    assert not stopping.is_alive(), "the pool's close hung after one of its processes died"
    assert multiprocessing.active_children() == []


def test_pool_processes_start_with_their_share_of_blas_threads(monkeypatch):
    """One pool process per core, each starting a BLAS thread per core, would oversubscribe the
    host cores-fold; the processes get cores // size threads each (fewer where the user set
    fewer), and this process keeps its own setting."""
    from runners import threads

    monkeypatch.setattr(threads, "cores", lambda: 32)
    for var in threads.THREAD_VARS:  # an xdist worker has its share set (tests/conftest.py)
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "7")
    monkeypatch.setenv("MKL_NUM_THREADS", "64")
    with oracle_cache.spawn_pool(2) as pool:
        seen = list(pool.map(os.getenv, ["OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                         "OMP_NUM_THREADS"]))
    assert seen == ["7", "16", "16"]
    assert os.environ["OPENBLAS_NUM_THREADS"] == "7" and "OMP_NUM_THREADS" not in os.environ


def test_the_summary_says_how_long_the_sweep_waited_for_the_pool():
    """A sweep paced by its oracle pool (the host's CPUs), not its devices, says so."""
    from collections import Counter
    from types import SimpleNamespace

    pool = SimpleNamespace(workers=31, outcomes=Counter(miss=40), waited=12.4, waiters={1})
    line = oracle_cache.summary(Counter(hit=2, miss=40), pool)
    assert "40 computed (40 of them ahead in 31 processes; the sweep waited 12 s for them)" in line
    pool.waiters = {1, 2}  # --devices: one thread per device waits
    assert ("the sweep waited 12 s for them, summed over 2 device threads)"
            in oracle_cache.summary(Counter(hit=2, miss=40), pool))
    pool.waited = 0.1
    assert "waited" not in oracle_cache.summary(Counter(hit=2, miss=40), pool)
