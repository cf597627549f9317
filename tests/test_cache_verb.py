"""`kparity cache info|clear` (verbs/cache.py over oracle/diskcache.py's `usage` and `clear`),
and the size and hit rate on a sweep's cache line (`runners/oracle_cache.summary`). The LRU
eviction itself: tests/test_oracle_cache.py."""

from __future__ import annotations

import os
import re
import time
from collections import Counter

import pytest

from oracle import diskcache
from oracle.diskcache import TEMP_PREFIX, DiskCache
from runners import oracle_cache
from verbs.cli import main

DAY = 86400.0


def one_line(out: str) -> str:
    return " ".join(out.split())


def fill(root, oracle: int = 3, nvcc: int = 1, size: int = 1000) -> dict[str, list[str]]:
    """`oracle` and `nvcc` entries of `size` bytes under `root`; their keys."""
    keys = {}
    for namespace, n in (("oracle", oracle), ("nvcc", nvcc)):
        cache = DiskCache(root, namespace, cap=1 << 30)
        keys[namespace] = [f"{namespace}{i}".encode().hex().ljust(64, "0") for i in range(n)]
        for key in keys[namespace]:
            assert cache.put(key, b"x" * size)
    return keys


def files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("KPARITY_CACHE", str(tmp_path / "c"))
    monkeypatch.delenv("KPARITY_CACHE_MB", raising=False)
    return tmp_path / "c"


def test_info_on_a_cache_not_created_yet(root, capsys):
    assert main(["cache", "info"]) == 0
    out = one_line(capsys.readouterr().out)
    assert f"kparity cache {root} ($KPARITY_CACHE)" in out
    assert "size 0 B of 4.0 GiB cap (0.0 %; the default 4096 MiB" in out
    assert "empty: not created yet" in out and "namespace" not in out


def test_info_on_an_emptied_cache_says_empty(root, capsys):
    fill(root)
    diskcache.clear(root)
    assert main(["cache", "info"]) == 0
    assert "empty: no entries" in capsys.readouterr().out


def test_info_on_a_filled_cache(root, monkeypatch, capsys):
    keys = fill(root, oracle=3, nvcc=1, size=100_000)
    now = time.time()
    os.utime(DiskCache(root, "oracle", 1).path(keys["oracle"][0]), (now - 2 * DAY,) * 2)
    stale = root / "nvcc" / f"{TEMP_PREFIX}dead"
    stale.write_bytes(b"y" * 5000)
    os.utime(stale, (now - DAY,) * 2)
    monkeypatch.setenv("KPARITY_CACHE_MB", "1")
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    size = 4 * (100_000 + 24) + 5000  # entries with their magic and digest, the temp file
    assert f"size {size / 1024:.1f} KiB of 1.0 MiB cap ({100 * size / (1 << 20):.1f} %; " \
           "KPARITY_CACHE_MB=1)" in one_line(out)
    cells = [[c.strip() for c in ln.strip("│").split("│")] for ln in out.splitlines()
             if ln.startswith("│")]
    rows = {row[0]: row[1:5] for row in cells}  # entries, size, oldest, newest
    assert rows["oracle"] == ["3", "293.0 KiB", "2 d", "0 s"]
    assert rows["nvcc"] == ["1", "102.6 KiB", "0 s", "0 s"]  # with the stale temp file's bytes
    assert "1 stale temporary file (4.9 KiB) of writers that died" in one_line(out)


def test_clear_removes_every_namespace_but_a_live_writers_temp_file(root, capsys):
    fill(root, oracle=3, nvcc=2)
    live = root / "oracle" / f"{TEMP_PREFIX}writing"
    live.write_bytes(b"z" * 10)
    dead = root / "oracle" / f"{TEMP_PREFIX}dead"
    dead.write_bytes(b"z" * 10)
    os.utime(dead, (time.time() - DAY,) * 2)
    assert main(["cache", "clear"]) == 0
    assert (f"kparity cache {root}: cleared every namespace (nvcc, oracle): 6 files removed, "
            f"{(5 * 1024 + 10) / 1024:.1f} KiB freed") in one_line(capsys.readouterr().out)
    assert files(root) == [f"oracle/{TEMP_PREFIX}writing"]
    assert not (root / "nvcc").exists()  # emptied folders go
    assert main(["cache", "clear"]) == 0
    assert "cleared every namespace (oracle): 0 files removed" in capsys.readouterr().out


def test_clear_one_namespace_keeps_the_others(root, capsys):
    keys = fill(root, oracle=3, nvcc=2)
    assert main(["cache", "clear", "--namespace", "nvcc"]) == 0
    assert "cleared namespace nvcc: 2 files removed" in one_line(capsys.readouterr().out)
    assert sorted(os.listdir(root)) == ["oracle"]
    oracle = DiskCache(root, "oracle", cap=1 << 30)
    assert all(oracle.get(k) == b"x" * 1000 for k in keys["oracle"])


def test_clear_an_unknown_namespace_exits_2_listing_the_existing_ones(root, capsys):
    fill(root)
    before = files(root)
    assert main(["cache", "clear", "--namespace", "orcale"]) == 2
    out = one_line(capsys.readouterr().out)
    assert "unknown namespace 'orcale' Valid namespaces (closest first): oracle, nvcc" in out
    assert "leave out --namespace to clear them all" in out
    assert files(root) == before
    assert main(["cache", "info", "--namespace", "oracle"]) == 2  # clear's option only
    assert "goes with `kparity cache clear`" in capsys.readouterr().out


@pytest.mark.parametrize("action", ["info", "clear"])
def test_off_says_so_and_exits_0(tmp_path, monkeypatch, capsys, action):
    monkeypatch.setenv("KPARITY_CACHE", "off")
    monkeypatch.setenv("HOME", str(tmp_path))  # were it on: an empty default cache here
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert main(["cache", action]) == 0
    assert "kparity cache: off (KPARITY_CACHE=off)" in one_line(capsys.readouterr().out)


def test_a_bad_cap_is_exit_2_naming_the_variable(root, monkeypatch, capsys):
    monkeypatch.setenv("KPARITY_CACHE_MB", "lots")
    assert main(["cache", "info"]) == 2
    assert "KPARITY_CACHE_MB='lots'" in capsys.readouterr().out


def test_a_put_remakes_a_folder_that_a_clear_removed_under_it(tmp_path, monkeypatch):
    """A clear beside a writer: the folder goes between the writer's mkdir and its temporary
    file; the write still lands."""
    cache = DiskCache(tmp_path, "oracle", cap=1 << 30)
    key = "ab" * 32
    real = diskcache.tempfile.mkstemp
    calls = []

    def racing_mkstemp(**kw):
        if not calls:
            diskcache.clear(tmp_path)  # the folder just made is empty: removed
        calls.append(kw)
        return real(**kw)

    monkeypatch.setattr(diskcache.tempfile, "mkstemp", racing_mkstemp)
    assert cache.put(key, b"payload")
    assert len(calls) == 2 and cache.get(key) == b"payload" and cache.write_errors == 0


def test_the_sweep_line_has_the_hit_rate_and_the_size_against_the_cap(root, monkeypatch):
    fill(root, oracle=2, nvcc=0, size=1000)
    monkeypatch.setenv("KPARITY_CACHE_MB", "2")
    line = oracle_cache.summary(Counter(hit=3, miss=1))
    assert line == f"oracle cache {root}: 3 hits (75 %), 1 computed; 2.0 KiB of 2.0 MiB"
    monkeypatch.delenv("KPARITY_CACHE_MB")
    line = oracle_cache.summary(Counter(hit=999, stale=1))
    assert re.search(r": 999 hits \(99 %\), 1 computed, 1 stale .*; 2\.0 KiB of 4\.0 GiB$", line)
    assert "\n" not in line
    monkeypatch.setenv("KPARITY_CACHE", "off")
    assert oracle_cache.summary(Counter(off=4)) == "oracle cache: off (KPARITY_CACHE=off)"
