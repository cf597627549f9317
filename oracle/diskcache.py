"""A content-addressed cache on disk: bytes under a hex key, size-capped, shared by processes.

Used for oracle outputs (`runners/oracle_cache.py`) and nvcc verdicts
(`gpu_impls/cuda/nvcc_check.py`); stdlib only, so every layer can import it.

Where: `$KPARITY_CACHE`, else `$XDG_CACHE_HOME/kparity`, else `~/.cache/kparity`: one place per
user, shared by `kparity check`, `pytest -m gpu` and CI (none of which has a store in common).
`KPARITY_CACHE=off` turns it off. `KPARITY_CACHE_MB` caps its size (default 4096 MiB): past the
cap the least recently used entries go (a hit touches its file's mtime; eviction removes the
oldest mtimes first, down to 90 % of the cap). The default holds the GPU gate of today's two
families with room to spare (its oracle entries on CUDA and torch: at most 1.4 GiB); a cap below
a sweep's working set evicts every entry before its next use, so raise it as families grow.

Safe under concurrent processes: an entry is written to a temporary file in its own folder and
renamed over its name (`os.replace`, atomic), so a reader sees a whole entry or none; two
writers of one key both succeed (the last rename wins; both wrote the same content). Every file
starts with a magic and a digest of the rest: a truncated or damaged entry reads as a miss
(`get` returns None, `corrupt` counts it), never as an exception. Eviction tolerates files that
another process removed or replaced meanwhile.

Housekeeping (`kparity cache info|clear`): `usage(root)` says what each namespace holds, `clear`
removes entries (all, or one namespace's) beside running processes: a live writer's temporary
file is kept, and a writer whose folder a clear removed under it makes the folder again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
import time
from pathlib import Path

MAGIC = b"KPCACHE1"
DIGEST = 16  # bytes of blake2b over the payload
DEFAULT_MB = 4096
TEMP_PREFIX = ".tmp-"
STALE_TEMP_S = 3600.0  # a temporary file this old belongs to a writer that died


class CacheConfigError(ValueError):
    """A cache environment variable that cannot be read: the message names it and the fix."""


def cache_root() -> Path | None:
    """The cache folder (module docstring), or None where `KPARITY_CACHE=off`."""
    given = os.environ.get("KPARITY_CACHE", "").strip()
    if given.lower() in ("off", "0", "none", "false"):
        return None
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kparity"


def positive_env(name: str, default: float, what: str) -> float:
    """The positive number in $`name`, or `default` where unset; anything else is a
    CacheConfigError naming the variable, `what` it means and the default."""
    given = os.environ.get(name, "").strip()
    if not given:
        return default
    try:
        value = float(given)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise CacheConfigError(f"{name}={given!r}: {what}, a positive number (default "
                               f"{default:g})")
    return value


def cap_bytes() -> int:
    mb = positive_env("KPARITY_CACHE_MB", DEFAULT_MB, "the cache's size cap in MiB "
                      "(KPARITY_CACHE=off turns the cache off)")
    return int(mb * (1 << 20))


_open: dict[tuple, "DiskCache"] = {}


def open_cache(namespace: str) -> "DiskCache | None":
    """The cache's `namespace` folder under `cache_root()` (one object per process and
    setting: it scans the folder's size once), or None where the cache is off."""
    root = cache_root()
    if root is None:
        return None
    where = (str(root), namespace, cap_bytes())
    if where not in _open:
        _open[where] = DiskCache(root, namespace, where[2])
    return _open[where]


def digest(*parts: bytes | str) -> str:
    """A hex key for content made of `parts` (each length-prefixed, so no two splits collide)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


class DiskCache:
    """Entries of one namespace under `root/namespace/<key[:2]>/<key>`; the size cap and the
    eviction cover everything under `root` (every namespace shares one budget)."""

    def __init__(self, root: Path, namespace: str, cap: int):
        self.root, self.dir, self.cap = Path(root), Path(root) / namespace, cap
        self.hits = self.misses = self.corrupt = self.write_errors = 0
        self._size: int | None = None  # bytes under root, as last scanned plus what we wrote

    def path(self, key: str) -> Path:
        return self.dir / key[:2] / key

    def get(self, key: str) -> bytes | None:
        """The payload stored under `key`, or None (missing, unreadable, truncated, damaged).
        A hit marks the entry as recently used."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            self.misses += 1
            return None
        head = len(MAGIC) + DIGEST
        payload = data[head:]
        if (len(data) < head or data[:len(MAGIC)] != MAGIC
                or hashlib.blake2b(payload, digest_size=DIGEST).digest() != data[len(MAGIC):head]):
            self.corrupt += 1
            self.misses += 1
            return None
        try:
            os.utime(path)  # the LRU clock: eviction removes the oldest mtimes first
        except OSError:
            pass  # evicted or replaced meanwhile: what we read is still whole
        self.hits += 1
        return payload

    def put(self, key: str, payload: bytes) -> bool:
        """Store `payload` under `key` atomically (module docstring); False where the folder
        cannot be written (the caller goes on without the cache)."""
        path = self.path(key)
        data = MAGIC + hashlib.blake2b(payload, digest_size=DIGEST).digest() + payload
        try:
            for attempt in (0, 1):
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
                    break
                except FileNotFoundError:  # a `clear` removed the folder after our mkdir
                    if attempt:
                        raise
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                _unlink(Path(tmp))
                raise
        except OSError:
            self.write_errors += 1
            return False
        if self._size is None:
            self._size = self.scan_size()
        else:
            self._size += len(data)
        if self._size > self.cap:
            self.evict()
        return True

    def scan_size(self) -> int:
        return sum(size for _, size, _ in self._files())

    def evict(self) -> None:
        """Remove the least recently used entries until everything under the root fits in 90 %
        of the cap (temporary files of writers that died long ago go first)."""
        files = sorted(self._files(), key=lambda f: f[2])
        total = sum(size for _, size, _ in files)
        target = int(self.cap * 0.9)
        now = time.time()
        for path, size, mtime in files:
            if path.name.startswith(TEMP_PREFIX) and now - mtime > STALE_TEMP_S:
                if _unlink(path):
                    total -= size
        for path, size, _ in files:
            if total <= target:
                break
            if not path.name.startswith(TEMP_PREFIX) and _unlink(path):
                total -= size
        self._size = total

    def _files(self) -> list[tuple[Path, int, float]]:
        """(path, size, mtime) of every file under the root; a file gone meanwhile is skipped."""
        return _walk(self.root)


@dataclasses.dataclass
class Usage:
    """What one namespace holds: its entries and their bytes, the oldest and the newest entry's
    mtime (its last use: the LRU clock), and temporary files (their bytes count in `bytes`),
    `stale_temps` of them of writers that died (STALE_TEMP_S)."""
    entries: int = 0
    bytes: int = 0
    oldest: float | None = None
    newest: float | None = None
    temps: int = 0
    stale_temps: int = 0
    stale_bytes: int = 0


def usage(root: Path | str) -> dict[str, Usage]:
    """{namespace: Usage} for every folder directly under `root` (files directly under it, which
    the cache never writes, under ""); {} where `root` does not exist."""
    root, now = Path(root), time.time()
    out: dict[str, Usage] = {}
    try:
        out.update((p.name, Usage()) for p in root.iterdir() if p.is_dir())
    except OSError:
        return out
    for path, size, mtime in _walk(root):
        parts = path.relative_to(root).parts
        u = out.setdefault(parts[0] if len(parts) > 1 else "", Usage())
        u.bytes += size
        if path.name.startswith(TEMP_PREFIX):
            u.temps += 1
            if now - mtime > STALE_TEMP_S:
                u.stale_temps += 1
                u.stale_bytes += size
            continue
        u.entries += 1
        u.oldest = mtime if u.oldest is None else min(u.oldest, mtime)
        u.newest = mtime if u.newest is None else max(u.newest, mtime)
    return out


def clear(root: Path | str, namespace: str | None = None) -> tuple[int, int]:
    """Remove every entry of `namespace` under `root` (None: of every namespace), the temporary
    files of writers that died (STALE_TEMP_S) and the folders left empty; (files removed, their
    bytes). Safe beside running processes: a live writer's temporary file stays (its rename
    then adds that entry back), a file another process removed first is skipped, a folder is
    removed only while empty, and `put` makes again a folder removed under it."""
    root = Path(root)
    if namespace is not None and (not namespace or Path(namespace).name != namespace
                                  or namespace in (".", "..")):
        raise ValueError(f"namespace {namespace!r}: a folder name directly under {root}")
    base = root if namespace is None else root / namespace
    removed = freed = 0
    now = time.time()
    for path, size, mtime in _walk(base):
        if path.name.startswith(TEMP_PREFIX) and now - mtime <= STALE_TEMP_S:
            continue  # a writer's, still writing
        if _unlink(path):
            removed += 1
            freed += size
    for folder, _, _ in os.walk(base, topdown=False):  # the deepest first
        if Path(folder) != root:
            try:
                os.rmdir(folder)
            except OSError:  # not empty (a writer's file), or removed first
                pass
    return removed, freed


def human_size(n: float) -> str:
    """Bytes as `812 B`, `3.4 KiB`, `120.0 MiB`, `1.2 GiB`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def size_of_cap(size: int, cap: int) -> str:
    """`1.2 of 4.0 GiB`, `14.0 MiB of 4.0 GiB`: a size against the cap."""
    have, most = human_size(size), human_size(cap)
    if have.split()[1] == most.split()[1]:
        have = have.split()[0]
    return f"{have} of {most}"


def _walk(root: Path) -> list[tuple[Path, int, float]]:
    """(path, size, mtime) of every file under `root`; a file gone meanwhile is skipped."""
    out = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            try:
                st = path.stat()
            except OSError:
                continue
            out.append((path, st.st_size, st.st_mtime))
    return out


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:  # another process removed it first
        return False
