"""Compile every CUDA kernel with nvcc, offline.

    python -m gpu_impls.cuda.nvcc_check [--arch sm_90]

No GPU and no CuPy needed. For each `.cu` in `kernels/`, a temporary translation unit includes
the source and takes the address of every kernel template the wrapper modules list in their
`KERNELS` (instantiated for F32, F16 and BF16), so the device code of every instance is really
generated; then the same again once per test-mutant define that the source or a local header it
includes mentions (a define nothing reads cannot change the object code). A `KERNELS` entry is
`(source, kernel)`, or `(source, kernel, template_args)` for a kernel with more template
parameters after the trait: `template_args` lists the argument tuples to instantiate (e.g.
`[(4, 256), (3, 1024)]` -> `kernel<F32, 4, 256>`, ...), as `_module.kernel` compiles them. One
line per file; exit status 1 on any failure (nvcc's error printed), or on a `.cu` file no
wrapper lists.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpu_impls.cuda._module import KERNEL_DIR, TRAIT, name_expression

MUTANT_DEFINES = ("KPARITY_MUTANT_DROP_EPS", "KPARITY_MUTANT_ROUND_BEFORE_WEIGHT",
                  "KPARITY_MUTANT_SKIP_LANE", "KPARITY_MUTANT_NIBBLE_ORDER",
                  "KPARITY_MUTANT_GROUP_OFF_BY_ONE", "KPARITY_MUTANT_DROP_BIAS",
                  "KPARITY_MUTANT_SKIP_LAST_GROUP", "KPARITY_MUTANT_M_DEPENDENT_SUM",
                  # timing diagnostics (scripts/kp_variants.py)
                  "KPARITY_DIAG_LOAD_ONLY", "KPARITY_DIAG_NO_GROUP_LOADS",
                  "KPARITY_DIAG_NO_X_LOADS", "KPARITY_DIAG_LATE_DEPENDENTS",
                  "KPARITY_DIAG_SUBTRACT",  # tests/test_gpu.py, scripts/kp_variants.py
                  "KPARITY_DIAG_TRACE")  # scripts/mma_trace.py
NOT_WRAPPERS = {"backend", "nvcc_check"}


Kernel = tuple[str, tuple[tuple, ...]]  # (name, template-argument tuples after the trait)


def listed_kernels() -> dict[str, list[Kernel]]:
    """source file -> (kernel name, extra template-argument tuples), from every wrapper module's
    `KERNELS` list; a 2-tuple entry has none (`((),)`: the trait alone)."""
    import gpu_impls.cuda as package

    out: dict[str, list[Kernel]] = {}
    for mod in pkgutil.iter_modules(package.__path__):
        if mod.name in NOT_WRAPPERS or mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{mod.name}")
        for source, name, *rest in getattr(module, "KERNELS", ()):
            args = tuple(tuple(a) for a in rest[0]) if rest else ((),)
            out.setdefault(source, []).append((name, args))
    return out


def instantiation_unit(source: str, kernels: list[Kernel]) -> str:
    refs = "\n".join(f"    (void*)&{name_expression(name, dtype, args)},"
                     for name, arg_sets in kernels for dtype in TRAIT for args in arg_sets)
    return (f'#include "{source}"\n'
            "// Taking each instance's address makes nvcc generate its device code.\n"
            f"void* kparity_instances[] = {{\n{refs}\n}};\n")


def defines_for(path: Path) -> tuple[str, ...]:
    """The MUTANT_DEFINES that `path` or the headers it includes from KERNEL_DIR (transitively)
    mention: only these can change what nvcc generates for it."""
    seen, todo, text = set(), [path], ""
    while todo:
        current = todo.pop()
        if current in seen or not current.exists():
            continue
        seen.add(current)
        source = current.read_text()
        text += source
        todo += [KERNEL_DIR / name for name in re.findall(r'#include\s+"([^"]+)"', source)]
    return tuple(d for d in MUTANT_DEFINES if d in text)


def compile_unit(unit: str, arch: str, define: str | None) -> tuple[bool, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".cu") as f:
        f.write(unit)
        f.flush()
        cmd = ["nvcc", "-std=c++17", f"-arch={arch}", "-I", str(KERNEL_DIR), "-c", "-o",
               "/dev/null", f.name]
        if define:
            cmd.insert(1, f"-D{define}")
        proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def check_file(path: Path, kernels: list[Kernel], arch: str,
               pool: ThreadPoolExecutor | None = None) -> tuple[bool, str]:
    """Compile `path`'s unit once per variant (no define, then each mutant define it reads), on
    `pool` where given (nvcc runs as a subprocess, so threads compile in parallel)."""
    unit = instantiation_unit(path.name, kernels)
    defines = (None, *defines_for(path))
    if pool is None:
        logs = [compile_unit(unit, arch, d) for d in defines]
    else:
        logs = [f.result() for f in [pool.submit(compile_unit, unit, arch, d) for d in defines]]
    errors = [f"  [{define or 'no defines'}]\n{log}"
              for define, (ok, log) in zip(defines, logs) if not ok]
    names = ", ".join(name if args == ((),) else f"{name} ({len(args)} configs)"
                      for name, args in kernels)
    head = (f"{'ok  ' if not errors else 'FAIL'} {path.name}: {names} x "
            f"{'/'.join(TRAIT.values())} x {len(defines)} variants")
    return not errors, "\n".join([head, *errors])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compile every CUDA kernel with nvcc.")
    parser.add_argument("--arch", default="sm_90", help="nvcc -arch (bf16 cvt needs sm_80+)")
    args = parser.parse_args(argv)

    listed = listed_kernels()
    sources = sorted(KERNEL_DIR.glob("*.cu"))
    # One nvcc per core; the files with the most instances are queued first (the long pole).
    order = sorted((p for p in sources if p.name in listed),
                   key=lambda p: -sum(len(a) for _, a in listed[p.name]))
    with ThreadPoolExecutor(os.cpu_count() or 1) as nvcc, \
            ThreadPoolExecutor(len(order) or 1) as files:
        futures = {p.name: files.submit(check_file, p, listed[p.name], args.arch, nvcc)
                   for p in order}
        results = [futures[p.name].result() if p.name in futures
                   else (False, f"FAIL {p.name}: no wrapper module lists it in KERNELS")
                   for p in sources]
    for _, text in results:
        print(text)
    missing = sorted(set(listed) - {p.name for p in sources})
    for name in missing:
        print(f"FAIL {name}: listed in KERNELS but not in {KERNEL_DIR}")
    return 0 if all(ok for ok, _ in results) and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
