"""Compile every CUDA kernel with nvcc, offline.

    python -m gpu_impls.cuda.nvcc_check [--arch sm_90]

No GPU and no CuPy needed. For each `.cu` in `kernels/`, a temporary translation unit includes
the source and takes the address of every kernel template the wrapper modules list in their
`KERNELS` (instantiated for F32, F16 and BF16), so the device code of every instance is really
generated; then the same again once per test-mutant define. One line per file; exit status 1 on
any failure (nvcc's error printed), or on a `.cu` file no wrapper lists.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpu_impls.cuda._module import KERNEL_DIR, TRAIT

MUTANT_DEFINES = ("KPARITY_MUTANT_DROP_EPS", "KPARITY_MUTANT_ROUND_BEFORE_WEIGHT",
                  "KPARITY_MUTANT_SKIP_LANE")
NOT_WRAPPERS = {"backend", "nvcc_check"}


def listed_kernels() -> dict[str, list[str]]:
    """source file -> kernel names, from every wrapper module's `KERNELS` list."""
    import gpu_impls.cuda as package

    out: dict[str, list[str]] = {}
    for mod in pkgutil.iter_modules(package.__path__):
        if mod.name in NOT_WRAPPERS or mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{mod.name}")
        for source, name in getattr(module, "KERNELS", ()):
            out.setdefault(source, []).append(name)
    return out


def instantiation_unit(source: str, names: list[str]) -> str:
    refs = "\n".join(f"    (void*)&{name}<{trait}>," for name in names for trait in TRAIT.values())
    return (f'#include "{source}"\n'
            "// Taking each instance's address makes nvcc generate its device code.\n"
            f"void* kparity_instances[] = {{\n{refs}\n}};\n")


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


def check_file(path: Path, names: list[str], arch: str) -> tuple[bool, str]:
    unit = instantiation_unit(path.name, names)
    errors = []
    for define in (None, *MUTANT_DEFINES):
        ok, log = compile_unit(unit, arch, define)
        if not ok:
            errors.append(f"  [{define or 'no defines'}]\n{log}")
    variants = 1 + len(MUTANT_DEFINES)
    head = (f"{'ok  ' if not errors else 'FAIL'} {path.name}: {', '.join(names)} x "
            f"{'/'.join(TRAIT.values())} x {variants} variants")
    return not errors, "\n".join([head, *errors])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compile every CUDA kernel with nvcc.")
    parser.add_argument("--arch", default="sm_90", help="nvcc -arch (bf16 cvt needs sm_80+)")
    args = parser.parse_args(argv)

    listed = listed_kernels()
    sources = sorted(KERNEL_DIR.glob("*.cu"))
    with ThreadPoolExecutor() as pool:
        results = list(pool.map(
            lambda p: check_file(p, listed[p.name], args.arch) if p.name in listed
            else (False, f"FAIL {p.name}: no wrapper module lists it in KERNELS"), sources))
    for _, text in results:
        print(text)
    missing = sorted(set(listed) - {p.name for p in sources})
    for name in missing:
        print(f"FAIL {name}: listed in KERNELS but not in {KERNEL_DIR}")
    return 0 if all(ok for ok, _ in results) and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
