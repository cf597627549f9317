"""Per-op case sources, registered by the family modules of this package: gate cases (small,
many: correctness) and bench cases (model-sized shapes: timing)."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable

_SOURCES: dict[str, Callable[[], list]] = {}
_BENCH: dict[str, Callable[[], list]] = {}
_loaded = False


def gate_cases(op: str):
    """Decorator: `fn()` returns the op's gate cases (a list of `Case`)."""

    def wrap(fn):
        _SOURCES[op] = fn
        return fn

    return wrap


def bench_cases(op: str):
    """Decorator: `fn()` returns the op's bench cases (labels `bench:<preset>`)."""

    def wrap(fn):
        _BENCH[op] = fn
        return fn

    return wrap


def bench_sources() -> dict[str, Callable[[], list]]:
    sources()
    return dict(_BENCH)


def sources() -> dict[str, Callable[[], list]]:
    global _loaded
    if not _loaded:
        _loaded = True
        import cases

        # every public module: the ones that register an op's cases are what count, so a new
        # module (an op's, or a helper's) needs no list kept beside it
        for mod in pkgutil.iter_modules(cases.__path__):
            if not mod.name.startswith("_"):
                importlib.import_module(f"cases.{mod.name}")
    return dict(_SOURCES)
