"""kparity implementations, one package per backend: cuda, torch, mlx, metal.

Every module of a backend package except `backend.py` may define impls and `register` them; the
registry imports them all (no framework is imported until an impl runs). Plugins (`--plugin
MODULE`) register more impls, e.g. a kernel repo's own, or the test-only mutants.
"""

from __future__ import annotations

import importlib
import pkgutil

from gpu_impls.backend import Backend
from gpu_impls.impl import Impl

BACKENDS = ("cuda", "torch", "mlx", "metal")
_IMPLS: dict[str, Impl] = {}
_PLUGIN_FILES: set[str] = set()  # .py plugins already executed in this process
_loaded = False


def register(*impls: Impl) -> None:
    for impl in impls:
        if impl.id in _IMPLS:
            raise ValueError(f"impl {impl.id} registered twice")
        _IMPLS[impl.id] = impl


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for backend in BACKENDS:
        pkg = importlib.import_module(f"{__name__}.{backend}")
        for mod in pkgutil.iter_modules(pkg.__path__):
            if mod.name != "backend" and not mod.name.startswith("_"):
                importlib.import_module(f"{pkg.__name__}.{mod.name}")


def impls() -> dict[str, Impl]:
    _load_all()
    return dict(_IMPLS)


def backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise KeyError(name)
    return importlib.import_module(f"{__name__}.{name}.backend").BACKEND


def load_plugin(module: str) -> None:
    """Import a module (dotted name, or a .py path) that registers ops or impls: a kernel repo's
    own, or the test-only mutants (`--plugin tests/mutants.py`)."""
    import importlib.util
    import os

    _load_all()
    if module.endswith(".py") or os.sep in module:
        if not os.path.isfile(module):
            raise ImportError(f"no such file: {module}")
        path = os.path.realpath(module)
        if path in _PLUGIN_FILES:  # once per process: `kparity nightly` runs several verbs
            return
        name = "kparity_plugin_" + os.path.splitext(os.path.basename(module))[0]
        spec = importlib.util.spec_from_file_location(name, module)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _PLUGIN_FILES.add(path)
    else:
        importlib.import_module(module)  # Python imports a module once
