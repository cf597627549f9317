"""Compile every CUDA kernel with nvcc, offline.

    python -m gpu_impls.cuda.nvcc_check [--arch sm_90]

No GPU and no CuPy needed. For each `.cu` in `kernels/`, a temporary translation unit includes
the source and takes the address of every kernel template the wrapper modules list in their
`KERNELS` (instantiated for F32, F16 and BF16), so the device code of every instance is really
generated; then once per test-mutant define that the source or a local header it includes
mentions outside comments (a define nothing reads cannot change the object code), with the first
template-argument tuple of each kernel only, in bf16 only: the define's code is compiled,
without the whole configuration matrix again (cold, that matrix per define took 2m53s of a CI
run's ~8 minutes; all three dtypes per define, 110 s of a 9-minute CI). A `KERNELS` entry is
`(source, kernel)`, or `(source, kernel, template_args)` for a kernel with more template
parameters after the trait: `template_args` lists the argument tuples to instantiate (e.g.
`[(4, 256), (3, 1024)]` -> `kernel<F32, 4, 256>`, ...), as `_module.kernel` compiles them. One
line per file; exit status 1 on any failure (nvcc's error printed), or on a `.cu` file no
wrapper lists.

Every compile that succeeded is remembered by content in the kparity cache (`oracle/diskcache.py`:
`$KPARITY_CACHE`, default ~/.cache/kparity; `KPARITY_CACHE=off`: none), keyed by the unit's text,
the text of every local header it includes (transitively), the define, the arch, the flags and
`nvcc --version`: a second run with nothing changed compiles nothing. A failed compile is not
remembered: it is what a developer is fixing (one nvcc to rerun, not the whole matrix), and nvcc
also fails for reasons outside the key (killed for memory, the hang guard, a full disk), which a
remembered failure would keep red after the cause is gone. The time an nvcc may take is not part
of any verdict: the only limit is a hang guard per nvcc process, `KPARITY_NVCC_TIMEOUT` seconds
(default 3600), named in the failure where it fires.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from gpu_impls.cuda._module import KERNEL_DIR, TRAIT, name_expression
from gpu_impls.cuda.listed import Kernel, listed_kernels
from oracle.diskcache import CacheConfigError, digest, open_cache, positive_env

MUTANT_DEFINES = ("KPARITY_MUTANT_DROP_EPS", "KPARITY_MUTANT_ROUND_BEFORE_WEIGHT",
                  "KPARITY_MUTANT_SKIP_LANE", "KPARITY_MUTANT_NIBBLE_ORDER",
                  "KPARITY_MUTANT_GROUP_OFF_BY_ONE", "KPARITY_MUTANT_DROP_BIAS",
                  "KPARITY_MUTANT_SKIP_LAST_GROUP", "KPARITY_MUTANT_M_DEPENDENT_SUM",
                  # attention (kernels/ffai_attention.cuh)
                  "KPARITY_MUTANT_GQA_MOD", "KPARITY_MUTANT_WINDOW_OFF_BY_ONE",
                  "KPARITY_MUTANT_DROP_SINK", "KPARITY_MUTANT_NO_RESCALE",
                  "KPARITY_MUTANT_ROPE_PAIRING_ADJACENT", "KPARITY_MUTANT_LLAMA3_NO_SMOOTH",
                  "KPARITY_MUTANT_SWIGLU_NO_CLAMP", "KPARITY_MUTANT_KV_SLOT_OFF_BY_ONE",
                  # Gated DeltaNet (kernels/gdn_chunk_o.cu, kernels/gdn_step.cu)
                  "KPARITY_MUTANT_EXCLUSIVE_MASK", "KPARITY_MUTANT_DECAY_AFTER_UPDATE",
                  "KPARITY_MUTANT_DECAY_SIGN",  # kernels/gdn_intra.cu (kkt)
                  "KPARITY_MUTANT_UNSCALED_STATE",  # kernels/gdn_chunk_h.cu
                  # Mamba-2 (kernels/ssm_step.cu, kernels/conv1d.cu)
                  "KPARITY_MUTANT_SOFTPLUS_TWICE", "KPARITY_MUTANT_CONV_DOUBLE_SHIFT",
                  "KPARITY_MUTANT_CONV_STATE_SKIPS_LAST",
                  # Mamba-2's chunked SSD (kernels/kp_ssd_chunked.cu)
                  "KPARITY_MUTANT_GROUP_MODULO", "KPARITY_MUTANT_DROP_D_SKIP",
                  "KPARITY_MUTANT_ATOMIC_SCATTER_ADD",  # kernels/moe_route.cu
                  "KPARITY_MUTANT_TILE_FIRST_ROW",  # kernels/kp_moe_gemm.cu
                  # FP4 quantize (kernels/kp_fp4_quantize.cu)
                  "KPARITY_MUTANT_FP4_TIES_AWAY", "KPARITY_MUTANT_FP4_UNSCALED_BLOCK_MAX",
                  # timing diagnostics (scripts/kp_variants.py)
                  "KPARITY_DIAG_LOAD_ONLY", "KPARITY_DIAG_NO_GROUP_LOADS",
                  "KPARITY_DIAG_NO_X_LOADS", "KPARITY_DIAG_LATE_DEPENDENTS",
                  "KPARITY_DIAG_SUBTRACT",  # tests/test_gpu.py, scripts/kp_variants.py
                  "KPARITY_DIAG_TRACE")  # scripts/mma_trace.py
VARIANT_DTYPE = "bf16"  # the one dtype a define's variant instantiates
FLAGS = ("-std=c++17",)
HANG_GUARD_S = 3600.0  # per nvcc process (KPARITY_NVCC_TIMEOUT): a hang, not a slow machine
CACHE_FORMAT = 1


def instantiation_unit(source: str, kernels: list[Kernel], dtypes=None) -> str:
    refs = "\n".join(f"    (void*)&{name_expression(name, dtype, args)},"
                     for name, arg_sets in kernels for dtype in (dtypes or TRAIT)
                     for args in arg_sets)
    return (f'#include "{source}"\n'
            "// Taking each instance's address makes nvcc generate its device code.\n"
            f"void* kparity_instances[] = {{\n{refs}\n}};\n")


def local_includes(text: str, include_dir: Path = KERNEL_DIR) -> dict[str, str]:
    """{name: text} of every `#include "name"` that `text` reaches in `include_dir`,
    transitively (a name not found there is nvcc's to resolve: a system header)."""
    found, todo = {}, re.findall(r'#include\s+"([^"]+)"', text)
    while todo:
        name = todo.pop()
        path = include_dir / name
        if name in found or not path.is_file():
            continue
        found[name] = path.read_text()
        todo += re.findall(r'#include\s+"([^"]+)"', found[name])
    return found


COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def defines_for(path: Path) -> tuple[str, ...]:
    """The MUTANT_DEFINES that `path` or the headers it includes from KERNEL_DIR (transitively)
    mention outside comments: only these can change what nvcc generates for it."""
    text = path.read_text() if path.exists() else ""
    text += "".join(local_includes(text, path.parent).values())
    code = COMMENTS.sub("", text)
    return tuple(d for d in MUTANT_DEFINES if d in code)


class Compiled(NamedTuple):
    ok: bool
    log: str  # nvcc's output (warnings, errors), or why it did not finish
    ptx: str | None = None  # with ptx=True and ok: the PTX
    cached: bool = False  # the verdict (and PTX) came from the cache


def compile_unit(unit: str, arch: str, define: str | None = None, ptx: bool = False,
                 include_dir: Path = KERNEL_DIR) -> Compiled:
    """nvcc on the translation unit `unit` (text; its `#include "..."` resolved in
    `include_dir`): the device code for `arch` (`-cubin`: front end, then ptxas with its
    register and shared-memory checks), or with `ptx` its PTX; `define` adds -D. No host pass:
    CuPy compiles these files with NVRTC, which has none either, and `-c`'s host compile was
    half the time of a small unit (1.7 s against 0.6 s for clipped_swiglu.cu's variant).
    A success is looked up in and stored to the cache (module docstring)."""
    options = [*FLAGS, *([f"-D{define}"] if define else []), f"-arch={arch}",
               "--ptx" if ptx else "-cubin"]
    cmd = ["nvcc", *options, "-I", str(include_dir)]
    cache = open_cache("nvcc")
    key = None
    if cache is not None:  # the headers by content: where they live is not part of the key
        headers = local_includes(unit, include_dir)
        key = digest(f"nvcc v{CACHE_FORMAT}", nvcc_version(), " ".join(options), unit,
                     *(f"{name}\n{text}" for name, text in sorted(headers.items())))
        hit = _cached(cache, key, ptx)
        if hit is not None:
            return hit
    result = _run_nvcc(cmd, unit, ptx)
    if cache is not None and result.ok:
        cache.put(key, json.dumps({"ok": True, "log": result.log, "ptx": result.ptx}).encode())
    return result


def _cached(cache, key: str, ptx: bool) -> Compiled | None:
    payload = cache.get(key)
    if payload is None:
        return None
    try:
        entry = json.loads(payload)
        if entry["ok"] is True and (not ptx or isinstance(entry["ptx"], str)):
            return Compiled(True, entry["log"], entry["ptx"], cached=True)
    except (ValueError, KeyError, TypeError):
        pass
    return None  # unreadable: compile again (and overwrite it)


def _run_nvcc(cmd: list[str], unit: str, ptx: bool) -> Compiled:
    guard = hang_guard_s()
    with tempfile.TemporaryDirectory(prefix="kparity-nvcc-") as tmp:
        source, out = Path(tmp) / "unit.cu", Path(tmp) / "unit.ptx"
        source.write_text(unit)
        try:
            proc = subprocess.run([*cmd, "-o", str(out) if ptx else os.devnull, str(source)],
                                  capture_output=True, text=True, timeout=guard)
        except subprocess.TimeoutExpired:
            return Compiled(False, f"nvcc ran past the hang guard, {guard:g} s for this one "
                                   f"nvcc process (KPARITY_NVCC_TIMEOUT): killed. On a machine "
                                   f"this busy, raise KPARITY_NVCC_TIMEOUT")
        except OSError as e:  # no nvcc, not executable
            return Compiled(False, f"nvcc did not start: {e}")
        log = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            return Compiled(False, log or f"nvcc exited with status {proc.returncode}")
        return Compiled(True, log, out.read_text() if ptx else None)


def hang_guard_s() -> float:
    return positive_env("KPARITY_NVCC_TIMEOUT", HANG_GUARD_S,
                        "seconds one nvcc process may run before it is taken for hung")


def nvcc_version() -> str:
    """`nvcc --version` of the nvcc on PATH (part of every cache key)."""
    path = shutil.which("nvcc")
    if path is None:
        return "no nvcc"
    stat = os.stat(path)
    return _version_of(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=None)
def _version_of(path: str, mtime_ns: int, size: int) -> str:
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{path}: {e}"
    return f"{path}\n{proc.stdout}{proc.stderr}"


# Names nvcc's implicit host headers (<math.h>, <cfloat>) define but NVRTC, CuPy's compiler,
# does not: a kernel using one passes nvcc here and fails to compile on the GPU machine (seen:
# INFINITY in kp_sdpa_decode.cu). Spell them without headers (`__int_as_float(0x7f800000)`).
NVRTC_MISSING = ("INFINITY", "NAN", "HUGE_VAL", "HUGE_VALF", "M_PI", "FLT_MAX", "FLT_MIN",
                 "FLT_EPSILON", "DBL_MAX")


def nvrtc_missing(text: str) -> list[str]:
    """The `NVRTC_MISSING` names `text` uses outside comments."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)
    return [n for n in NVRTC_MISSING if re.search(rf"\b{n}\b", code)]


def check_file(path: Path, kernels: list[Kernel], arch: str,
               pool: ThreadPoolExecutor | None = None) -> tuple[bool, str]:
    """Compile `path`'s unit once per variant (no define, then each mutant define it reads), on
    `pool` where given (nvcc runs as a subprocess, so threads compile in parallel)."""
    full = instantiation_unit(path.name, kernels)
    # a define's variant: each kernel's first configuration in bf16 (the dtype whose loads and
    # stores convert), not the whole matrix: the define's code is compiled, once
    first = instantiation_unit(path.name, [(name, args[:1]) for name, args in kernels],
                               dtypes=(VARIANT_DTYPE,))
    defines = (None, *defines_for(path))
    units = [full if d is None else first for d in defines]
    if pool is None:
        results = [compile_unit(u, arch, d) for u, d in zip(units, defines)]
    else:
        results = [f.result() for f in [pool.submit(compile_unit, u, arch, d)
                                        for u, d in zip(units, defines)]]
    errors = [f"  [{define or 'no defines'}]\n{r.log}"
              for define, r in zip(defines, results) if not r.ok]
    texts = {path.name: path.read_text(), **local_includes(path.read_text(), path.parent)}
    errors += [f"  {name} uses {', '.join(missing)}: NVRTC (CuPy's compiler) has no math.h or "
               "cfloat; nvcc here does, so it compiled (`NVRTC_MISSING`)"
               for name, text in texts.items() if (missing := nvrtc_missing(text))]
    names = ", ".join(name if args == ((),) else f"{name} ({len(args)} configs)"
                      for name, args in kernels)
    cached = sum(r.cached for r in results)
    head = (f"{'ok  ' if not errors else 'FAIL'} {path.name}: {names} x "
            f"{'/'.join(TRAIT.values())} x {len(defines)} variants"
            + (f" ({cached} cached)" if cached else ""))
    return not errors, "\n".join([head, *errors])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compile every CUDA kernel with nvcc.")
    parser.add_argument("--arch", default="sm_90", help="nvcc -arch (bf16 cvt needs sm_80+)")
    args = parser.parse_args(argv)
    try:
        hang_guard_s(), open_cache("nvcc")  # a bad setting stops here, not in every compile
    except CacheConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

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
