"""`kparity cache info` (where the oracle / nvcc cache is, its size against its cap, what each
namespace holds) and `kparity cache clear [--namespace NAME]` (`oracle/diskcache.py`)."""

from __future__ import annotations

import os
import time

from rich.markup import escape
from rich.table import Table

from verbs.console import console
from verbs.usage import UsageError, unknown

ORDER = 5  # housekeeping: last in `kparity --help`
GROUP = "housekeeping"  # its heading in `kparity --help`

# What the namespaces that kparity writes hold (a plugin's own shows without a description).
HOLDS = {"oracle": "oracle outputs: exact, reference, bounds (runners/oracle_cache.py)",
         "nvcc": "nvcc compile verdicts (gpu_impls/cuda/nvcc_check.py)",
         "models": "the model gate's GGUF files (models/gguf_file.py)"}


def add_parsers(sub) -> None:
    p = sub.add_parser("cache", help="the oracle / nvcc cache on disk: info, clear")
    p.add_argument("action", choices=("info", "clear"),
                   help="info: where the cache is, its size against its cap (KPARITY_CACHE_MB), "
                        "entries and size per namespace, the oldest and newest entry; clear: "
                        "remove its entries (every namespace, or --namespace's)")
    p.add_argument("--namespace", metavar="NAME",
                   help="with clear: only this namespace's entries (oracle, nvcc)")


def cmd_cache(args) -> int:
    from oracle import diskcache

    root = diskcache.cache_root()
    if args.namespace is not None and args.action != "clear":
        raise UsageError("--namespace goes with `kparity cache clear`; `kparity cache info` "
                         "shows every namespace")
    if root is None:
        console.print("kparity cache: off (KPARITY_CACHE=off): nothing is read or written"
                      + (", nothing to clear" if args.action == "clear" else "")
                      + "; unset KPARITY_CACHE to use it", soft_wrap=True)
        return 0
    if args.action == "clear":
        return clear(root, args.namespace)
    try:
        cap = diskcache.cap_bytes()
    except diskcache.CacheConfigError as e:
        raise UsageError(str(e)) from None
    return info(root, cap)


def _where_from() -> str:
    if os.environ.get("KPARITY_CACHE", "").strip():
        return "$KPARITY_CACHE"
    if os.environ.get("XDG_CACHE_HOME"):
        return "$XDG_CACHE_HOME/kparity"
    return "the default, ~/.cache/kparity; $KPARITY_CACHE moves it"


def age(mtime: float | None, now: float) -> str:
    if mtime is None:
        return "-"
    s = max(0.0, now - mtime)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.0f} {unit}"
    return f"{s:.0f} s"


def info(root, cap: int) -> int:
    from oracle import diskcache

    used = diskcache.usage(root)
    total = sum(u.bytes for u in used.values())
    mb = os.environ.get("KPARITY_CACHE_MB", "").strip()
    console.print(escape(f"kparity cache {root} ({_where_from()})"), soft_wrap=True)
    console.print(escape(f"size {diskcache.size_of_cap(total, cap)} cap "
                         f"({100 * total / cap:.1f} %; "
                         + (f"KPARITY_CACHE_MB={mb}" if mb else
                            f"the default {diskcache.DEFAULT_MB} MiB; KPARITY_CACHE_MB sets it")
                         + "): past the cap the least recently used entries go"), soft_wrap=True)
    if not os.path.isdir(root):
        console.print("empty: not created yet (the first `kparity check` or nvcc compile "
                      "makes it)")
        return 0
    if not any(u.entries or u.temps for u in used.values()):
        console.print("empty: no entries")
        return 0
    now = time.time()
    table = Table(title="entries per namespace (age: since last used)")
    for col in ("namespace", "entries", "size", "oldest", "newest", "holds"):
        table.add_column(col, justify="right" if col in ("entries", "size") else "left")
    for name, u in sorted(used.items()):
        table.add_row(escape(name or "(top level)"), str(u.entries),
                      diskcache.human_size(u.bytes), age(u.oldest, now), age(u.newest, now),
                      HOLDS.get(name, ""))
    console.print(table)
    stale = sum(u.stale_temps for u in used.values())
    if stale:
        console.print(escape(
            f"{stale} stale temporary {'file' if stale == 1 else 'files'} ("
            f"{diskcache.human_size(sum(u.stale_bytes for u in used.values()))}) of writers "
            "that died: the next eviction or `kparity cache clear` removes them"),
            soft_wrap=True)
    return 0


def clear(root, namespace: str | None) -> int:
    from oracle import diskcache

    existing = sorted(name for name in diskcache.usage(root) if name)
    if namespace is not None and namespace not in existing:
        if not existing:
            raise UsageError(f"unknown namespace {namespace!r}: the cache at {root} holds none "
                             "(nothing to clear)")
        raise UsageError(f"{unknown('namespace', namespace, existing)}; or leave out "
                         "--namespace to clear them all")
    if not existing and not os.path.isdir(root):
        console.print(escape(f"kparity cache {root}: nothing to clear (not created yet)"),
                      soft_wrap=True)
        return 0
    files, freed = diskcache.clear(root, namespace)
    what = (f"namespace {namespace}" if namespace is not None
            else f"every namespace ({', '.join(existing) or 'none'})")
    console.print(escape(f"kparity cache {root}: cleared {what}: {files} "
                         f"{'file' if files == 1 else 'files'} removed, "
                         f"{diskcache.human_size(freed)} freed"), soft_wrap=True)
    return 0


VERBS = {"cache": cmd_cache}
