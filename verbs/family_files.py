"""`kparity ops --family NAME --files`: where one family lives, for a reader.

The design keeps a family's parts by layer (oracle/, cases/, gpu_impls/<backend>/, kernels,
tests/); this lists them in one place, read from the code itself: the modules that define each
op's oracle and kernel model, the module of its gate-case source, each impl's module, the CUDA
sources those modules list in `KERNELS` (with the local headers they include) and the test files
that name one of the family's ops.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _file_of(obj) -> str | None:
    """The repository-relative file that defines `obj` (a function or module), or None."""
    try:
        path = Path(inspect.getsourcefile(obj) or "")
    except TypeError:
        return None
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path) if str(path) else None


def family_files(family: str, impls: dict) -> dict[str, list[str]]:
    """{part: [files]} for `family`: "ops", "oracle", "cases", one "impls (backend)" per
    backend, "kernels" and "tests". ValueError naming the families where none has that name."""
    from cases.registry import sources
    from gpu_impls.cuda._module import KERNEL_DIR
    from gpu_impls.cuda.nvcc_check import local_includes
    from oracle.spec import registry

    ops = sorted(name for name, spec in registry().items() if spec.family == family)
    if not ops:
        known = sorted({spec.family for spec in registry().values()})
        raise ValueError(f"--family {family!r}: no op has it; families: {', '.join(known)}")
    specs = [registry()[op] for op in ops]
    parts: dict[str, set[str]] = {"ops": set(ops), "oracle": set(), "cases": set(),
                                  "kernels": set(), "tests": set()}
    for spec in specs:
        for fn in (spec.oracle, spec.kernel):
            if fn is not None and (where := _file_of(fn)):
                parts["oracle"].add(where)
    for op in ops:
        if op in sources() and (where := _file_of(sources()[op])):
            parts["cases"].add(where)
    for impl in impls.values():
        if impl.op not in ops:
            continue
        module = sys.modules.get(getattr(impl.run, "__module__", ""), None)
        where = _file_of(module) if module else _file_of(impl.run)
        if where:
            parts.setdefault(f"impls ({impl.backend})", set()).add(where)
        for source, *_ in getattr(module, "KERNELS", ()):
            parts["kernels"].add(str((KERNEL_DIR / source).relative_to(ROOT)))
            for header in local_includes((KERNEL_DIR / source).read_text()):
                parts["kernels"].add(str((KERNEL_DIR / header).relative_to(ROOT)))
    named = re.compile(r"[\"'](" + "|".join(map(re.escape, ops)) + r")[\"'\[]")
    for path in sorted((ROOT / "tests").glob("*.py")):
        if named.search(path.read_text(errors="replace")):
            parts["tests"].add(str(path.relative_to(ROOT)))
    return {part: sorted(files) for part, files in parts.items()}
