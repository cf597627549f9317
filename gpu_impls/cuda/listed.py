"""The kernel instances the CUDA wrapper modules list: each module's `KERNELS`, entries
`(source, kernel)` or `(source, kernel, template_args)` (the argument tuples after the trait:
`[(4, 256), (3, 1024)]` -> `kernel<F32, 4, 256>`, ...). What `nvcc_check` compiles offline and
`_module` compiles in batches (`_module.batches`, `prebuild`)."""

from __future__ import annotations

import functools
import importlib
import pkgutil

# Modules of the package that wrap no kernel (importing them lists nothing).
NOT_WRAPPERS = {"backend", "nvcc_check", "listed", "prebuild"}

Kernel = tuple[str, tuple[tuple, ...]]  # (name, template-argument tuples after the trait)


@functools.lru_cache(maxsize=None)
def _listed() -> tuple[tuple[str, tuple[Kernel, ...]], ...]:
    import gpu_impls.cuda as package

    out: dict[str, list[Kernel]] = {}
    for mod in pkgutil.iter_modules(package.__path__):
        if mod.name in NOT_WRAPPERS or mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{mod.name}")
        for source, name, *rest in getattr(module, "KERNELS", ()):
            args = tuple(tuple(a) for a in rest[0]) if rest else ((),)
            out.setdefault(source, []).append((name, args))
    return tuple((source, tuple(kernels)) for source, kernels in out.items())


def listed_kernels() -> dict[str, list[Kernel]]:
    """source file -> (kernel name, extra template-argument tuples), from every wrapper module's
    `KERNELS` list; a 2-tuple entry has none (`((),)`: the trait alone)."""
    return {source: list(kernels) for source, kernels in _listed()}
