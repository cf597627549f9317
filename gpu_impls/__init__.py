"""kparity implementations, one package per backend: cuda, torch, mlx, metal.

Every module of a backend package except `backend.py` may define impls and `register` them; the
registry imports them all (no framework is imported until an impl runs). Plugins register more
impls (and ops, cases, known issues), e.g. a kernel repo's own, or the test-only mutants:

- `--plugin MODULE` (`load_plugin`): a dotted module name, importable from the current directory
  too (the user's kernel repo), or a `.py` path. One that fails to load is an error (`PluginError`).
- The `kparity.plugins` entry point group (`load_entry_points`), declared in a kernel repo's own
  `pyproject.toml` and loaded with the builtin impls:

      [project.entry-points."kparity.plugins"]
      my_kernels = "my_kernels.kparity:register"   # a callable, called once; or a module

  One that fails (its import or its register function raises, or it registers an impl id that
  exists) is a `PluginWarning` naming it and what it raised; its impls are removed, and
  everything else still runs. `examples/kparity-example-plugin/` is a complete one.

`origin(impl_id)` says where an impl came from: "builtin", "plugin FILE_OR_MODULE", "entry point
NAME = VALUE (DIST)", or the module that called `register` directly.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings
from contextlib import contextmanager

from gpu_impls.backend import Backend
from gpu_impls.impl import Impl

BACKENDS = ("cuda", "torch", "mlx", "metal")
ENTRY_POINT_GROUP = "kparity.plugins"
_IMPLS: dict[str, Impl] = {}
_ORIGINS: dict[str, str] = {}  # impl id -> where it was registered from (`origin`)
_loading_origin: str | None = None  # the plugin being loaded now, if any
_PLUGIN_FILES: set[str] = set()  # .py plugins already executed in this process
_ENTRY_POINTS: set[str] = set()  # entry points already tried in this process ("name = value")
_loaded = False


class PluginError(Exception):
    """A plugin that could not load: the message names the plugin and what it raised."""


class PluginWarning(UserWarning):
    """An entry-point plugin that could not load; the rest of kparity still runs."""


def register(*impls: Impl) -> None:
    for impl in impls:
        if impl.id in _IMPLS:
            raise ValueError(f"impl {impl.id} registered twice (first by {_ORIGINS[impl.id]})")
        _IMPLS[impl.id] = impl
        _ORIGINS[impl.id] = _loading_origin or _caller_origin()


def _caller_origin() -> str:
    """The origin of a `register` call made outside any plugin loading: builtin for this
    package's modules, else the calling module's name (a test, a script)."""
    module = sys._getframe(2).f_globals.get("__name__", "?")
    return "builtin" if module.startswith(f"{__name__}.") else f"module {module}"


def origin(impl_id: str) -> str:
    """Where the impl came from (module docstring)."""
    _load_all()
    return _ORIGINS[impl_id]


@contextmanager
def _loading(what: str):
    """Register under origin `what`; if the body raises, drop the impls it registered (a
    half-loaded plugin runs nothing) and raise PluginError naming `what`, the exception and
    where it was raised."""
    global _loading_origin
    before, outer = set(_IMPLS), _loading_origin
    _loading_origin = what
    try:
        yield
    except Exception as e:
        for impl_id in set(_IMPLS) - before:
            del _IMPLS[impl_id], _ORIGINS[impl_id]
        kind = "cannot import" if isinstance(e, ImportError) else type(e).__name__
        raise PluginError(f"{what}: {kind}: {e}{_where(e)}") from e
    finally:
        _loading_origin = outer


def _where(e: BaseException) -> str:
    """' (at FILE:LINE)': the innermost frame of the plugin's own code (not the import
    machinery's, nor this loader's) where the exception was raised; '' when there is none."""
    import os
    import traceback

    machinery = (os.path.dirname(importlib.__file__), __file__, "<")
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith(machinery)]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    try:
        for backend in BACKENDS:
            pkg = importlib.import_module(f"{__name__}.{backend}")
            for mod in pkgutil.iter_modules(pkg.__path__):
                if mod.name != "backend" and not mod.name.startswith("_"):
                    importlib.import_module(f"{pkg.__name__}.{mod.name}")
    except BaseException:
        _loaded = False  # a module that does not import fails every listing, not just the first
        raise
    load_entry_points()


def load_entry_points() -> list[str]:
    """Load every `kparity.plugins` entry point not tried yet in this process: a module is
    imported; a callable is called (with no arguments) once imported. One that fails warns
    (`PluginWarning`) and the others still load. Returns the messages of those that failed."""
    from importlib.metadata import entry_points

    failed = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
        key = f"{ep.name} = {ep.value}"
        if key in _ENTRY_POINTS:
            continue
        _ENTRY_POINTS.add(key)
        dist = f" ({ep.dist.name} {ep.dist.version})" if getattr(ep, "dist", None) else ""
        try:
            with _loading(f"entry point {key}{dist}"):
                loaded = ep.load()
                if callable(loaded):  # a module is not callable: importing it registered
                    loaded()
        except PluginError as e:
            failed.append(str(e))
            warnings.warn(f"{e}; its impls are not registered, the rest runs", PluginWarning,
                          stacklevel=2)
    return failed


def impls() -> dict[str, Impl]:
    _load_all()
    return dict(_IMPLS)


def backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise KeyError(name)
    return importlib.import_module(f"{__name__}.{name}.backend").BACKEND


def load_plugin(module: str) -> None:
    """Load a plugin that registers ops or impls: a dotted module name (importable from the
    current directory too: the user's kernel repo) or a .py path, e.g. the test-only mutants
    (`--plugin tests.mutants` or `--plugin tests/mutants.py`). Raises PluginError naming the
    plugin and what it raised; its impls are then not registered."""
    import importlib.util
    import os

    _load_all()
    with _loading(f"plugin {module}"):
        if module.endswith(".py") or os.sep in module:
            if not os.path.isfile(module):
                raise FileNotFoundError(f"no such file: {module}")
            path = os.path.realpath(module)
            if path in _PLUGIN_FILES:  # once per process: `kparity nightly` runs several verbs
                return
            name = "kparity_plugin_" + os.path.splitext(os.path.basename(module))[0]
            spec = importlib.util.spec_from_file_location(name, module)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _PLUGIN_FILES.add(path)
        else:
            # `python -m` puts the current directory on sys.path, an installed console script
            # does not: a module of the user's own repo must import either way
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.append(os.getcwd())
            importlib.import_module(module)  # Python imports a module once
