"""runners/threads.py: a spawned process starts with its share of the host's BLAS / OpenMP
threads, and the spawning process keeps its own environment."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

from runners import threads

# as this process started (the autouse fixture below removes them for each test)
STARTED_WITH = {var: os.environ.get(var) for var in threads.THREAD_VARS}


@pytest.fixture(autouse=True)
def no_thread_settings(monkeypatch):
    """No count set by hand (an xdist worker has its share set: `tests/conftest.py`)."""
    for var in threads.THREAD_VARS:
        monkeypatch.delenv(var, raising=False)


def _child_env(conn) -> None:
    conn.send({var: os.environ.get(var) for var in threads.THREAD_VARS})


def _spawned_env(n) -> dict:
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    with threads.spawning_with(n):
        proc = ctx.Process(target=_child_env, args=(theirs,))
        proc.start()
    env = ours.recv()
    proc.join()
    return env


def test_a_child_starts_with_the_threads_given_and_the_parent_keeps_its_own(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert set(_spawned_env(3).values()) == {"3"}
    assert set(_spawned_env(8).values()) == {"8", "5"}  # fewer set by hand: kept
    assert os.environ["OMP_NUM_THREADS"] == "5" and "OPENBLAS_NUM_THREADS" not in os.environ
    assert _spawned_env(None)["OMP_NUM_THREADS"] == "5"  # None: inherited


def test_share_splits_the_cores_and_never_gives_none(monkeypatch):
    monkeypatch.setattr(threads, "cores", lambda: 32)
    assert [threads.share(n) for n in (1, 2, 31, 64)] == [32, 16, 1, 1]


def test_spawns_from_several_threads_each_see_their_own_setting():
    """--devices starts workers from one thread per device: each child must see the count it
    was started with, never a value another thread restored meanwhile."""
    seen = {}

    def spawn(n):
        seen[n] = _spawned_env(n)["OMP_NUM_THREADS"]

    workers = [threading.Thread(target=spawn, args=(n,)) for n in (2, 3, 4, 6)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert seen == {2: "2", 3: "3", 4: "4", 6: "6"}


def test_inductor_compile_workers_never_exceed_inductors_own_cap():
    """Inductor starts min(32, cores) compile workers by itself: a whole 64-core share must
    not raise that, a smaller share lowers it."""
    assert threads.limited(64)["TORCHINDUCTOR_COMPILE_THREADS"] == "32"
    assert threads.limited(64)["OMP_NUM_THREADS"] == "64"
    assert threads.limited(16)["TORCHINDUCTOR_COMPILE_THREADS"] == "16"


def test_a_process_of_the_shared_context_starts_with_the_share_whenever_it_starts():
    """A process may start from another thread, long after the context was made (a device's
    thread under --devices), through its context's `Process`: with SharedSpawnContext each start
    gets the share, not the sweep's environment (which keeps its own)."""
    ctx = threads.SharedSpawnContext(3)
    got = {}

    def start_later():
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=_child_env, args=(theirs,))
        proc.start()
        got.update(ours.recv())
        proc.join()
    later = threading.Thread(target=start_later)  # as a device's thread would
    later.start()
    later.join(120)
    assert set(got.values()) == {"3"}
    assert "OMP_NUM_THREADS" not in os.environ


def test_the_oracle_pool_starts_its_processes_within_their_share(monkeypatch):
    from runners import oracle_cache

    monkeypatch.setattr(threads, "cores", lambda: 8)
    monkeypatch.setattr(oracle_cache, "share", threads.share)
    pool = oracle_cache.spawn_pool(2)
    try:
        ctx = pool._mp_context
        assert isinstance(ctx, threads.SharedSpawnContext) and ctx.threads == 4
    finally:
        pool.shutdown()
    # 4 xdist workers' pools of 2 on 8 cores: one thread each, not the 4 a pool alone takes
    pool = oracle_cache.spawn_pool(2, peers=4)
    try:
        assert pool._mp_context.threads == 1
    finally:
        pool.shutdown()


def test_an_xdist_worker_runs_one_blas_thread():
    """tests/conftest.py: under pytest-xdist this process starts with one thread (its pool and
    the other workers take the rest of the cores)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("not an xdist worker")
    assert STARTED_WITH["OMP_NUM_THREADS"] == STARTED_WITH["OPENBLAS_NUM_THREADS"] == "1"
