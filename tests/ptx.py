"""What nvcc's PTX says a kernel instance declares (its parameter kinds, `.maxntid`, static
shared memory) and what its source names its parameters (`source_params`), for the tests that
check a wrapper's launch against its kernel without a GPU."""

from __future__ import annotations

import functools
import re

from gpu_impls.cuda._module import KERNEL_DIR, TRAIT, name_expression


def _mangled(name: str, dtype: str, template_args: tuple) -> str:
    """The Itanium-mangled prefix of `name<TRAIT, int args...>`."""
    trait = TRAIT[dtype]
    return (f"_Z{len(name)}{name}I{len(trait)}{trait}"
            + "".join(f"Li{a}E" for a in template_args) + "E")


@functools.lru_cache(maxsize=None)
def entries(source: str, instances: tuple) -> dict:
    """{(name, dtype, template args): {"params": [u64/u32/f32 ...], "maxntid": int or None,
    "shared": static shared bytes}} of `instances` ((name, dtype, template args) each) in
    kernels/`source`, compiled for sm_90 in one unit (nvcc_check's cache keeps it)."""
    from gpu_impls.cuda.nvcc_check import compile_unit

    unit = (f'#include "{source}"\nvoid* kparity_instances[] = {{\n'
            + "".join(f"    (void*)&{name_expression(n, d, a)},\n" for n, d, a in instances)
            + "};\n")
    compiled = compile_unit(unit, "sm_90", ptx=True)
    assert compiled.ok, compiled.log
    bodies = re.split(r"\.visible \.entry ", compiled.ptx)[1:]
    out = {}
    for name, dtype, args in instances:
        prefix = _mangled(name, dtype, args)
        (body,) = [b for b in bodies if b.startswith(prefix)]
        ntid = re.search(r"\.maxntid (\d+)", body)
        out[(name, dtype, args)] = {
            "params": re.findall(r"\.param \.(\w+) \w+", body.split(")", 1)[0]),
            "maxntid": int(ntid.group(1)) if ntid else None,
            "shared": sum(int(n) for n in re.findall(
                r"^\s*\.shared \.align \d+ \.b8 \S+\[(\d+)\];", body, re.M))}
    return out


def source_params(source: str, name: str) -> list[str]:
    """The parameter names of `__global__` kernel `name` in kernels/`source`, in order."""
    text = (KERNEL_DIR / source).read_text()
    match = re.search(r"__global__[^;{]*?\b" + name + r"\(([^)]*)\)", text, re.S)
    assert match, name
    return [re.findall(r"\w+", p)[-1] for p in match.group(1).split(",")]
