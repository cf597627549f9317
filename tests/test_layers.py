"""The packages import downward only: oracle -> cases -> gpu_impls -> runners -> results -> models
-> verbs.

Each package may import the ones before it in LAYERS, never one after it, so a newcomer can read
them bottom up and no package needs another that needs it back. Every import statement counts,
those inside functions included (a lazy import is still a dependency). What the verb modules
share (verbs/console.py, usage.py, selection.py) imports no verb module, only one another (the
CLI discovers the verbs; they never need each other's internals through it). Pure AST: nothing is
imported, so this runs in milliseconds.
"""

from __future__ import annotations

import ast
import graphlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("oracle", "cases", "gpu_impls", "runners", "results", "models", "verbs")
SHARED_MODULES = ("verbs.console", "verbs.usage", "verbs.selection")
SHARED = {Path(m.replace(".", "/") + ".py") for m in SHARED_MODULES}


def import_names(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """(line, what the statement may name, the likeliest first) per imported name, relative
    imports resolved: `import a.b` names a.b; `from a.b import c`, the module a.b.c if c is
    one, else a.b; `from . import x`, the package's module x."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, (alias.name,)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, *([node.module] if node.module else [])))
            found += [(node.lineno, (f"{module}.{alias.name}",) if node.module is None
                       else (f"{module}.{alias.name}", module)) for alias in node.names]
    return found


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted module) of every import in the file, relative ones resolved."""
    found = []
    for line, names in import_names(path):
        if (line, names[-1]) not in found:  # `from m import a, b`: m once
            found.append((line, names[-1]))
    return found


def upward_imports() -> list[str]:
    bad = []
    for layer, package in enumerate(LAYERS):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT)
            for line, module in imported(path):
                top = module.split(".")[0]
                if top in LAYERS and LAYERS.index(top) > layer:
                    below = ", ".join(f"{p}/" for p in LAYERS[:layer]) or "no other package"
                    bad.append(f"{where}:{line} imports {module}: {package}/ may import "
                               f"{below} ({' -> '.join(LAYERS)})")
                if where in SHARED and top == "verbs" and not module.startswith(SHARED_MODULES):
                    bad.append(f"{where}:{line} imports {module}: {where} is shared by the "
                               "verb modules and imports none of them")
    return bad


def test_packages_import_only_downward():
    bad = upward_imports()
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_the_scan_sees_imports_inside_functions(tmp_path, monkeypatch):
    """The checker itself: a lazy relative import in a function is found and resolved."""
    pkg = tmp_path / "oracle"
    pkg.mkdir()
    (pkg / "x.py").write_text("def f():\n    from ..runners.y import z\n    import verbs.cli\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert imported(pkg / "x.py") == [(2, "runners.y"), (3, "verbs.cli")]


def module_file(module: str) -> Path | None:
    """The file of a dotted module of this tree (a package: its __init__.py), else None."""
    base = ROOT / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.relative_to(ROOT)
    return None


def import_graph() -> dict[Path, set[Path]]:
    """file -> the files of this tree it imports (`import_names`' first that is a file; a
    package: its __init__.py), every import statement counted."""
    graph = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            here = path.relative_to(ROOT)
            files = (next(filter(None, map(module_file, names)), None)
                     for _, names in import_names(path))
            graph[here] = {f for f in files if f is not None and f != here}
    return graph


def cycle(graph: dict[Path, set[Path]]) -> list[Path]:
    """One import cycle of `graph` (its files, the first again at the end), or [] if none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return list(e.args[1])
    return []


def test_no_file_imports_a_file_that_imports_it_back():
    """0 import cycles between files (issue 51): a module and everything it needs can be read
    without coming back to it. Lazy imports count, package __init__ files too."""
    found = cycle(import_graph())
    assert not found, "an import cycle: " + " -> ".join(map(str, found))


def test_the_cycle_finder_finds_a_cycle():
    a, b, c = Path("a.py"), Path("b.py"), Path("c.py")
    assert set(cycle({a: {b}, b: {c}, c: {a}})) == {a, b, c}
    assert cycle({a: {b}, b: {c}, c: set()}) == []


def test_every_gpu_test_lives_in_a_gpu_file():
    """`pytest -m gpu` imports only tests/test_gpu*.py (tests/conftest.py,
    `pytest_ignore_collect`): a gpu-marked test anywhere else would never run there."""
    import fnmatch

    from tests.conftest import GPU_FILES

    strays = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        if fnmatch.fnmatch(path.name, GPU_FILES):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr == "gpu"
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"):
                strays.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not strays, ("gpu-marked tests outside tests/" + GPU_FILES + " (move them into one, "
                        "or `pytest -m gpu` skips them): " + ", ".join(strays))
