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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("oracle", "cases", "gpu_impls", "runners", "results", "models", "verbs")
SHARED_MODULES = ("verbs.console", "verbs.usage", "verbs.selection")
SHARED = {Path(m.replace(".", "/") + ".py") for m in SHARED_MODULES}


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted module) of every import in the file, relative ones resolved."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, *([node.module] if node.module else [])))
            if node.module is None:  # `from . import x`: x is a module of the package
                found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, module))
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
    """file -> the files of this tree it imports (`from a.b import c`: a/b/c.py where c is a
    module, else a/b.py or a/b/__init__.py), every import statement counted."""
    graph = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = ast.parse(path.read_text(encoding="utf-8"), str(path))
            package_parts = path.relative_to(ROOT).with_suffix("").parts[:-1]
            targets = set()
            for node in ast.walk(source):
                if isinstance(node, ast.Import):
                    targets |= {module_file(a.name) for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    base = (package_parts[:len(package_parts) - node.level + 1]
                            if node.level else ())
                    module = ".".join((*base, *([node.module] if node.module else [])))
                    for alias in node.names:
                        targets.add(module_file(f"{module}.{alias.name}") or module_file(module))
            graph[path.relative_to(ROOT)] = {t for t in targets if t is not None} - {
                path.relative_to(ROOT)}
    return graph


def cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """The strongly connected components of more than one file (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_file_imports_a_file_that_imports_it_back():
    """0 import cycles between files (issue 51): a module and everything it needs can be read
    without coming back to it. Lazy imports count, package __init__ files too."""
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(map(str, c)) for c in found)


def test_the_cycle_finder_finds_a_cycle():
    a, b, c = Path("a.py"), Path("b.py"), Path("c.py")
    assert cycles({a: {b}, b: {c}, c: {a}}) == [[a, b, c]]
    assert cycles({a: {b}, b: {c}, c: set()}) == []
