"""The launch layer: `.cu` sources in `kernels/` compiled with NVRTC (through CuPy) at first use.

Every kernel is a template on a storage trait (`F32`, `F16`, `BF16` in `kernels/common.cuh`),
optionally followed by more compile-time template arguments (`template_args`, e.g. the items and
threads per row of `kp_rms_norm<T, ITEMS, TPR>`); one compiled instance per (source file, kernel,
dtype, defines, template_args), cached for the process. `defines` are extra `-D` macros: empty
for the real kernels, `KPARITY_MUTANT_...` for the test mutants.

CuPy is imported inside `kernel` only, so importing this module (and registering impls) works on
machines without it. CuPy also caches compiled modules on disk, keyed by the source text and the
options but not by included headers; the source is therefore prefixed with a hash of every
`kernels/*.cuh`, so that editing a header recompiles every kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
TRAIT = {"f32": "F32", "f16": "F16", "bf16": "BF16"}


def _source(source_file: str) -> str:
    headers = hashlib.sha256(b"".join(h.read_bytes()
                                      for h in sorted(KERNEL_DIR.glob("*.cuh")))).hexdigest()
    return f"// headers {headers[:16]}\n" + (KERNEL_DIR / source_file).read_text()


def name_expression(name: str, dtype: str, template_args: tuple = ()) -> str:
    """`name<TRAIT, arg, ...>`: the instance to compile (`nvcc_check` spells it the same way)."""
    return f"{name}<{', '.join((TRAIT[dtype], *map(str, template_args)))}>"


@functools.lru_cache(maxsize=None)
def kernel(source_file: str, name: str, dtype: str, defines: tuple = (),
           template_args: tuple = ()):
    """The `cupy.RawKernel` for `name<TRAIT[dtype], *template_args>` from `kernels/source_file`."""
    import cupy

    expression = name_expression(name, dtype, template_args)
    module = cupy.RawModule(
        code=_source(source_file),
        options=("-std=c++17", f"-I{KERNEL_DIR}", *(f"-D{d}" for d in defines)),
        name_expressions=[expression])
    return module.get_function(expression)


# --- impls built from a maker, so that test mutants can recompile them with defines -----------

_MAKERS: dict[str, tuple[object, object]] = {}


def cuda_impl(name: str, op: str, contract, make, doc: str, **fields):
    """Impl `cuda:name` whose run is `make()`; `make(defines)` rebuilds it with `-D` macros.
    `fields`: further `Impl` fields (e.g. `exact_peer`)."""
    from gpu_impls.impl import Impl

    impl = Impl(op=op, backend="cuda", name=name, run=make(), contract=contract, doc=doc,
                **fields)
    _MAKERS[impl.id] = (impl, make)
    return impl


def mutant(impl_id: str, name: str, define: str):
    """A test-only copy of `impl_id` (same op and contract) named `name`, its kernels compiled
    with `-D{define}` (KPARITY_MUTANT_DROP_EPS, _ROUND_BEFORE_WEIGHT or _SKIP_LANE)."""
    impl, make = _MAKERS[impl_id]
    return dataclasses.replace(impl, name=name, run=make((define,)),
                               doc=f"test mutant of {impl_id}, compiled with -D{define}")
