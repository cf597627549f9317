"""The launch layer: `.cu` sources in `kernels/` compiled with NVRTC (through CuPy) at first use.

Every kernel is a template on a storage trait (`F32`, `F16`, `BF16` in `kernels/common.cuh`),
optionally followed by more compile-time template arguments (`template_args`, e.g. the items and
threads per row of `kp_rms_norm<T, ITEMS, TPR>`); `defines` are extra `-D` macros: empty for the
real kernels, `KPARITY_MUTANT_...` for the test mutants.

What one NVRTC run compiles: the instances a wrapper module lists (`KERNELS`, the list
`nvcc_check` compiles offline) are compiled a batch at a time, up to BATCH instances of one file
and dtype per module (`batches`): one parse of the source for a dozen instances, where one run
per instance parsed it a dozen times (nvcc, kp_rms_norm.cu: 0.43 s for one instance, 10.1 s for
all 297 at once). An instance no list names, and every mutant, is compiled alone. Each compile
holds a lock file per module (beside CuPy's cache, `_compile_lock`), so processes that need the
same module (pytest-xdist's workers, the gate's prebuild, `gpu_impls/cuda/prebuild.py`) compile
it once: the others wait and then load it from CuPy's disk cache. Modules are cached per process.

CuPy is imported inside `kernel` only, so importing this module (and registering impls) works on
machines without it. CuPy caches compiled modules on disk, keyed by the source text and the
options but not by included headers; the source is therefore prefixed with a hash of every
`kernels/*.cuh`, so that editing a header recompiles every kernel, and a batch's source ends
with the list of its instances.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import os
import time
from pathlib import Path

import numpy as np

from gpu_impls.contract import Launch

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
TRAIT = {"f32": "F32", "f16": "F16", "bf16": "BF16"}


def _source(source_file: str) -> str:
    headers = hashlib.sha256(b"".join(h.read_bytes()
                                      for h in sorted(KERNEL_DIR.glob("*.cuh")))).hexdigest()
    return f"// headers {headers[:16]}\n" + (KERNEL_DIR / source_file).read_text()


def name_expression(name: str, dtype: str, template_args: tuple = ()) -> str:
    """`name<TRAIT, arg, ...>`: the instance to compile (`nvcc_check` spells it the same way)."""
    return f"{name}<{', '.join((TRAIT[dtype], *map(str, template_args)))}>"


BATCH = 12  # listed instances of one file and dtype per NVRTC run (`batches`)


@functools.lru_cache(maxsize=None)
def batches(source_file: str, dtype: str) -> tuple[tuple[str, ...], ...]:
    """The instances of `source_file` in `dtype` that the wrapper modules list (`KERNELS`, as
    `listed.listed_kernels` reads them), sorted, in batches of at most BATCH."""
    from gpu_impls.cuda.listed import listed_kernels

    names = sorted({name_expression(name, dtype, args)
                    for name, arg_tuples in listed_kernels().get(source_file, [])
                    for args in arg_tuples})
    return tuple(tuple(names[i:i + BATCH]) for i in range(0, len(names), BATCH))


def _cache_dir() -> Path:
    """CuPy's kernel cache (CUPY_CACHE_DIR, default ~/.cupy/kernel_cache)."""
    given = os.environ.get("CUPY_CACHE_DIR")
    return Path(given) if given else Path.home() / ".cupy" / "kernel_cache"


@contextlib.contextmanager
def _compile_lock(key: str):
    """An exclusive lock on the module `key` across processes, while one compiles it (none where
    the cache folder cannot be written: each process then compiles alone, as before)."""
    import fcntl

    try:
        folder = _cache_dir() / "kparity-locks"
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.lock", "a")
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _compiled(source_file: str, defines: tuple, names: tuple[str, ...]):
    """A `cupy.RawModule` of `names` (name expressions) from `kernels/source_file`, compiled
    (or loaded from CuPy's disk cache) under the module's lock."""
    import cupy

    code = _source(source_file)
    if len(names) > 1:
        code += "\n// instances: " + " ".join(names) + "\n"
    options = ("-std=c++17", f"-I{KERNEL_DIR}", *(f"-D{d}" for d in defines))
    start = time.perf_counter()
    with _compile_lock("\n".join((code, *options, *names))):
        compiled = cupy.RawModule(code=code, options=options, name_expressions=list(names))
        compiled.get_function(names[0])  # CuPy compiles (or loads) at the first lookup
    log = os.environ.get("KPARITY_COMPILE_LOG")
    if log:  # one line per module: pid, seconds to compile or load it, what it holds
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {time.perf_counter() - start:.3f} {source_file} "
                    f"{len(names)} {names[0]} {' '.join(defines)}\n")
    return compiled


@functools.lru_cache(maxsize=None)
def batch_module(source_file: str, batch: tuple[str, ...]):
    """The module of one batch of listed instances (`batches`)."""
    return _compiled(source_file, (), batch)


@functools.lru_cache(maxsize=None)
def module(source_file: str, name: str, dtype: str, defines: tuple = (),
           template_args: tuple = ()):
    """The `cupy.RawModule` holding `name<TRAIT[dtype], *template_args>` from
    `kernels/source_file`: its batch's where a wrapper lists it, else its own."""
    wanted = name_expression(name, dtype, template_args)
    if not defines:
        for batch in batches(source_file, dtype):
            if wanted in batch:
                return batch_module(source_file, batch)
    return _compiled(source_file, defines, (wanted,))


@functools.lru_cache(maxsize=None)
def kernel(source_file: str, name: str, dtype: str, defines: tuple = (),
           template_args: tuple = ()):
    """The `cupy.RawKernel` for `name<TRAIT[dtype], *template_args>` from `kernels/source_file`."""
    return module(source_file, name, dtype, defines, template_args).get_function(
        name_expression(name, dtype, template_args))


# --- one thread per element ----------------------------------------------------------------------

ELEMENT_BLOCK = 256  # threads per block of a kernel that gives each element a thread


def per_element_launch(count: int, extra: dict) -> Launch:
    """A 1-D grid of `ELEMENT_BLOCK`-thread blocks, a thread per element of `count` (at least
    one block); `extra`: the launch's derived values."""
    return Launch(grid=(max(1, -(-count // ELEMENT_BLOCK)), 1, 1), block=(ELEMENT_BLOCK, 1, 1),
                  extra=extra)


def rows_by_n_geometry(dims, params):
    """A contract's geometry for a kernel with a thread per element of a [rows, n] tensor: the
    derived `count` = rows * n, launched by `per_element_launch`."""
    count = dims["rows"] * dims["n"]
    return {"count": count}, per_element_launch(count, {"count": count})


# --- launching, optionally as a programmatic dependent launch ----------------------------------

CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # cuda.h, CUlaunchAttributeID
SHARED_WITHOUT_OPT_IN = 48 * 1024  # dynamic shared bytes a kernel may take without opting in


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, a 64-byte union
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("value_pad", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_CTYPE = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.int32): ctypes.c_int32,
          np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.int64): ctypes.c_int64,
          np.dtype(np.float64): ctypes.c_double}


@functools.lru_cache(maxsize=None)
def _cu_launch_kernel_ex():
    fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p]
    return fn


def _kernel_arg(a):
    if hasattr(a, "data") and hasattr(a.data, "ptr"):  # a CuPy array: its device pointer
        return ctypes.c_void_p(a.data.ptr)
    if isinstance(a, np.generic) and a.dtype in _CTYPE:
        return _CTYPE[a.dtype](a.item())
    raise TypeError(f"kernel argument {a!r}: pass a CuPy array or one of "
                    f"{sorted(str(d) for d in _CTYPE)} as a NumPy scalar")


def launch(k, grid: tuple, block: tuple, args: tuple, pdl: bool = False,
           shared_bytes: int = 0) -> None:
    """Launch the `cupy.RawKernel` k on the current stream, with `shared_bytes` of dynamic
    shared memory (over 48 KiB with its static shared memory, the kernel is first opted in).

    pdl=True makes it a programmatic dependent launch (sm_90+, `cuLaunchKernelEx` with
    PROGRAMMATIC_STREAM_SERIALIZATION): its blocks may start once every block of the kernel
    before it in the stream has run `griddepcontrol.launch_dependents` (or exited), instead of
    after that kernel has finished. Only a kernel written for it may be launched so: it must run
    `griddepcontrol.wait` (kp_pdl_wait() in common.cuh), which returns once the kernels before
    it have completed and their writes are visible, before its first load of anything another
    kernel may write and before its first store. Stream capture keeps the relation as a
    programmatic edge of the CUDA graph. Without pdl (or before sm_90) both instructions are
    no-ops and the launch is the ordinary one."""
    # the opt-in counts the kernel's static shared memory too (48 KiB of dynamic beside 8 KiB
    # static fails to launch without it)
    if (shared_bytes and shared_bytes + k.shared_size_bytes > SHARED_WITHOUT_OPT_IN
            and k.max_dynamic_shared_size_bytes < shared_bytes):
        k.max_dynamic_shared_size_bytes = shared_bytes  # cuFuncSetAttribute, once per size
    if not pdl:
        k(grid, block, args, shared_mem=shared_bytes)
        return
    import cupy

    values = [_kernel_arg(a) for a in args]  # kept alive until the call returns
    params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
    attr = _LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
    config = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block),
                           shared_bytes, ctypes.c_void_p(cupy.cuda.get_current_stream().ptr),
                           ctypes.pointer(attr), 1)
    status = _cu_launch_kernel_ex()(ctypes.byref(config), ctypes.c_void_p(k.kernel.ptr),
                                    params, None)
    if status != 0:
        raise RuntimeError(f"cuLaunchKernelEx (programmatic dependent launch) of {k.name} "
                           f"returned CUresult {status}; launch it with pdl=False")


# --- impls built from a maker, so that test mutants can recompile them with defines -----------

MAKERS: dict[str, tuple[object, object]] = {}


def cuda_impl(name: str, op: str, contract, make, doc: str, **fields):
    """Impl `cuda:name` whose run is `make()`; `make(defines)` rebuilds it with `-D` macros.
    `fields`: further `Impl` fields (e.g. `exact_peer`)."""
    from gpu_impls.impl import Impl

    impl = Impl(op=op, backend="cuda", name=name, run=make(), contract=contract, doc=doc,
                **fields)
    MAKERS[impl.id] = (impl, make)
    return impl


def variant(impl_id: str, name: str, defines: tuple = (), geometry=None, doc: str = "",
            **knobs):
    """A copy of `impl_id` (same op) named `name`: its kernels compiled with `defines` (-D
    macros) and, given `geometry`, its contract's geometry replaced by `geometry(..., **knobs)`.
    For choosing a launch on a GPU (scripts/kp_*variants.py) and for the test mutants."""
    impl, make = MAKERS[impl_id]
    contract = (impl.contract if geometry is None
                else dataclasses.replace(impl.contract, geometry=functools.partial(geometry,
                                                                                  **knobs)))
    what = " ".join([*(f"-D{d}" for d in defines), *(f"{k}={v}" for k, v in knobs.items())])
    return dataclasses.replace(impl, name=name, run=make(tuple(defines)), contract=contract,
                               doc=doc or f"{impl_id} [{what}]")


def mutant(impl_id: str, name: str, define: str):
    """A copy of `impl_id` (same op and contract) named `name`, its kernels compiled with
    `-D{define}`: a test mutant (KPARITY_MUTANT_*) or a timing diagnostic (KPARITY_DIAG_*)."""
    return variant(impl_id, name, (define,), doc=f"{impl_id} compiled with -D{define}")
