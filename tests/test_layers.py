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
