"""Cases from a JSON file (`kparity check --cases FILE`): a list of objects

    {"op": "rms_norm", "dims": {"rows": 7, "n": 4096}, "dtype": "bf16",
     "dist": "normal", "seed": 0, "params": {"eps": 1e-6}, "label": "my-shape"}

`op`, `dims` and `dtype` are required; `dist` (default normal), `seed` (0), `params` (the op's
defaults), `dtypes` (per-role dtypes, for ops that declare roles: `{"kv": "e4m3"}`) and `label`
("file:<name>") are optional. A stored row's `case_json` (what a failing
case prints) is a valid entry as is: its `oracle_version` must be the op's current one, since
the same case under another oracle version is another case. A case with an empty output (a dim
at 0, e.g. rows = 0) is refused: its check compares nothing and cannot fail (issue 49; an empty
input with every output non-empty stays valid). Every field is checked before
anything runs, and so is the host memory the case needs (`host_bytes`: its arrays and the float64
oracle's, against what is available here);
a bad one is named with the file, the case's index and the field, and what would be valid. A
param's value must be one of the op's declared values (`OpSpec.param_values`, e.g. rounding
"once" or "normed") or else of its default's kind. `kparity check` also refuses, before it runs
anything, a case that no selected impl would check (`verbs.selection.case_file_work`).
"""

from __future__ import annotations

import difflib
import json
import math
import os
from pathlib import Path

from cases.distributions import DISTRIBUTIONS, PLANTED
from cases.model import Case
from oracle.dtypes import FLOAT_DTYPES, storage_dtype
from oracle.spec import registry

FIELDS = ("op", "dims", "dtype", "dist", "seed", "params", "dtypes", "label", "oracle_version")


class CaseFileError(ValueError):
    pass


CLOSEST_SHOWN = 5  # names a bad-name message lists at most; 400 impl names help no one
CLOSEST_WIDTH = 64  # in at most this many characters: its line fits 120 columns


def domain_field(case, message: str) -> str:
    """The field an op's domain refusal blames: the param or dim its message names as
    `name =` / `name=` (a param first: eps = 0, limit = -1), else "dims"."""
    import re

    for group, names in (("params", case.params), ("dims", dict(case.dim_items))):
        for name in names:
            if re.search(rf"\b{re.escape(name)} ?=", message):
                return f"{group}.{name}"
    return "dims"


def closest(given: str, valid, listed_by: str = "", width: int = CLOSEST_WIDTH) -> str:
    """The valid names, comma-separated, closest to `given` first, in about `width`
    characters (every bad-name message): all of them where they fit, else the closest few (at
    most CLOSEST_SHOWN, at least one) and a count of the rest, with the command that lists
    them all where given (`listed_by`, e.g. "`kparity ops`")."""
    valid = sorted(set(valid))
    if not valid:
        return "none"
    ranked = difflib.get_close_matches(str(given), valid, n=len(valid), cutoff=0.0)
    if len(", ".join(ranked)) <= width:
        return ", ".join(ranked)
    rest = f" ... (999 more{': ' + listed_by if listed_by else ''})"
    shown = ranked[:1]
    for name in ranked[1:CLOSEST_SHOWN]:
        if len(", ".join([*shown, name]) + rest) > width:
            break
        shown.append(name)
    more = len(ranked) - len(shown)
    return ", ".join(shown) + f" ... ({more} more{': ' + listed_by if listed_by else ''})"


def _case(where: str, raw, ops) -> Case:
    def bad(field: str, why: str) -> CaseFileError:
        return CaseFileError(f"{where}, field {field!r}: {why}")

    if not isinstance(raw, dict):
        raise CaseFileError(f"{where}: expected an object with {', '.join(FIELDS)}, "
                            f"got {type(raw).__name__}")
    for key in raw:
        if key not in FIELDS:
            raise bad(key, "unknown field\n  valid fields (closest first): "
                      + closest(key, FIELDS))
    for key in ("op", "dims", "dtype"):
        if key not in raw:
            raise bad(key, "missing (required: op, dims, dtype)")
    op = raw["op"]
    if op not in ops:
        raise bad("op", f"unknown op {op!r}\n  valid ops (closest first): "
                  + closest(op, ops, "`kparity ops`", width=90))
    spec = ops[op]
    dims = raw["dims"]
    if not isinstance(dims, dict):
        raise bad("dims", f"expected an object of {', '.join(spec.dims)}")
    for name in spec.dims:
        if name not in dims:
            raise bad(f"dims.{name}", f"missing: {op} needs {', '.join(spec.dims)}")
    for name, value in dims.items():
        if name not in spec.dims:
            raise bad(f"dims.{name}", f"{op} has no dim {name!r}; its dims: "
                      + ", ".join(spec.dims))
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad(f"dims.{name}", f"expected a non-negative integer, got {value!r}")
    if raw["dtype"] not in FLOAT_DTYPES:
        raise bad("dtype", f"unknown dtype {raw['dtype']!r}; valid: "
                  + closest(raw["dtype"], FLOAT_DTYPES))
    dist = raw.get("dist", "normal")
    dists = DISTRIBUTIONS + (PLANTED if spec.plant or spec.loss else ())
    if dist not in dists:
        raise bad("dist", f"unknown distribution {dist!r} for {op}\n  valid (closest first): "
                  + closest(dist, dists))
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise bad("seed", f"expected a non-negative integer, got {seed!r}")
    params = raw.get("params", {})
    if not isinstance(params, dict):
        raise bad("params", "expected an object")
    for name, value in params.items():
        if name not in spec.params:
            raise bad(f"params.{name}", f"{op} has no param {name!r}; its params (closest "
                      f"first): {closest(name, spec.params) or 'none'}")
        why = param_error(spec, name, value)
        if why:
            raise bad(f"params.{name}", why)
    version = raw.get("oracle_version", spec.version)
    if version != spec.version:
        raise bad("oracle_version", f"{version!r}, but {op}'s oracle is version {spec.version}: "
                  "the case was written for another oracle; drop the field to run it under "
                  "this one")
    label = raw.get("label", "")
    if not isinstance(label, str):
        raise bad("label", f"expected a string, got {label!r}")
    dtypes = raw.get("dtypes", {})
    if not isinstance(dtypes, dict):
        raise bad("dtypes", "expected an object of role -> dtype")
    try:
        case = Case.make(op, dims, raw["dtype"], dist, seed, params, label, dtypes)
    except ValueError as e:  # a role or a dtype the op does not know: Case.make names it
        raise bad("dtypes", str(e)) from None
    try:
        outside = case.spec.domain_error(case)
    except ZeroDivisionError:  # a domain that divides by a dim the case sets to 0
        zeros = [name for name, value in case.dim_items if value == 0]
        raise bad("dims", f"{case.short()}: {' and '.join(zeros) or 'a dim'} at 0 divides by "
                  "zero in the op's domain check: give each dim at least 1") from None
    if outside:
        raise bad(domain_field(case, outside), f"{case.short()} params {case.params}: {outside}")
    # after the domain: where the op's own domain refuses the case, its reason is the better one
    empty = empty_output_error(case)
    if empty:
        raise bad(*empty)
    need, have = host_bytes(case), available_host_bytes()
    if have is not None and need > have:
        raise bad("dims", f"{case.short()} needs about {need / 2**30:.1f} GiB of host memory "
                  f"(its inputs and outputs, and the float64 oracle of each), and "
                  f"{have / 2**30:.1f} GiB is available here: smaller dims, or `kparity bench` "
                  "(which times large cases without the float64 oracle)")
    return case


def _empty_outputs(spec, dims, params) -> list[tuple[str, tuple[int, ...]]]:
    """The op's outputs (name, shape) that have no element at these dims and params."""
    shapes = [(t.name, t.shape_for(dims, params)) for t in spec.outputs]
    return [(name, shape) for name, shape in shapes if math.prod(shape) == 0]


def empty_output_error(case: Case) -> tuple[str, str] | None:
    """(field, why) if some output of `case` has no element, else None (issue 49: no case that
    cannot fail). The rule: refuse when ANY output is empty, since a check over an empty output
    compares nothing and passes whatever the kernel does. An empty INPUT with every output
    non-empty stays valid: optional inputs are empty by design (attn_combine's `sinks` when
    off, moe_grouped_gemm's weights of the format not chosen, ssd's `z` without a gate), and a
    dim at 0 that empties no output (a reduction over in = 0, a group count that only divides
    an input) is the user's to choose. If raising every dim at 0 to 1 leaves an output empty, a
    param (a list of lengths) empties it and is named; else the dims to blame are those at 0
    that alone, with every other dim at 0 raised to 1, still empty an output."""
    spec, dims, params = case.spec, case.dims, case.params
    try:
        empty = _empty_outputs(spec, dims, params)
    except ArithmeticError:  # a shape that divides by a dim at 0: the domain check names it
        return None
    if not empty:
        return None
    shapes = "; ".join(f"{name}: shape {shape}" for name, shape in empty)
    which = ("every output is empty" if len(empty) == len(spec.outputs) else
             f"the output {empty[0][0]} is empty" if len(empty) == 1 else
             f"the outputs {', '.join(name for name, _ in empty)} are empty") + f" ({shapes})"
    zeros = [name for name, value in case.dim_items if value == 0]

    def empties(probe) -> bool:
        try:
            return bool(_empty_outputs(spec, {**dims, **probe}, params))
        except ArithmeticError:
            return False

    blamed = []
    if zeros and not empties(dict.fromkeys(zeros, 1)):  # else a param empties it too
        blamed = [name for name in zeros
                  if empties({z: 1 for z in zeros if z != name})] or zeros
    if not blamed:
        return "params", (f"{case.short()} params {case.params}: {which} and the check cannot "
                          "fail: the params that set its shape (lengths) must give it elements")
    names = " and ".join(blamed)
    at = " and ".join(f"{name} = 0" for name in blamed)
    field = f"dims.{blamed[0]}" if len(blamed) == 1 else "dims"
    return field, (f"{names} must be at least 1: with {at} {which} and the check cannot fail "
                   f"({case.short()})")


# Host bytes per element beyond the stored value: an input is drawn and held in float64 for
# the oracle; an output's oracle keeps exact and rounded float64 arrays and a float64 bound, and
# the harness holds the device output's host copy next to a guarded (poisoned) buffer.
ORACLE_BYTES_PER_INPUT = 8
ORACLE_BYTES_PER_OUTPUT = 3 * 8


def host_bytes(case: Case) -> int:
    """About how much host memory checking `case` takes: every input and output at its storage
    dtype plus the float64 arrays the oracle and the comparison hold (an estimate from the
    shapes, never below what the check allocates for the arrays themselves)."""
    spec, total = case.spec, 0
    for t in spec.inputs:
        n = math.prod(t.shape_of(case))
        total += n * (storage_dtype(t.dtype(case)).itemsize + ORACLE_BYTES_PER_INPUT)
    for t in spec.outputs:
        n = math.prod(t.shape_of(case))
        total += n * (2 * storage_dtype(t.dtype(case)).itemsize + ORACLE_BYTES_PER_OUTPUT)
    return total


def available_host_bytes() -> int | None:
    """Memory available to a new allocation here (Linux/macOS sysconf), None if unknown."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def param_error(spec, name: str, value) -> str:
    """Why `value` is not a value of the op's param `name`, or "": it must be one of the op's
    declared values (`OpSpec.param_values`) where it declares them, else of the kind of the
    param's default (a string, an integer, a finite number, a list of non-negative integers).
    Unchecked, a bad value runs silently as something else (rounding="twice" as "once")."""
    default = spec.params[name]
    if name in spec.param_values:
        values = spec.param_values[name]
        if value in values and isinstance(value, bool) == isinstance(default, bool):
            return ""
        return (f"{_json(value)} is not a value of {spec.name}'s {name}; valid (closest "
                f"first): {closest(_json(value), [_json(v) for v in values])}")
    if isinstance(default, bool):
        kind, ok = "true or false", isinstance(value, bool)
    elif isinstance(default, str):
        kind, ok = "a string", isinstance(value, str)
    elif isinstance(default, int):
        kind, ok = "an integer", isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        kind = "a finite number"
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value)
    elif isinstance(default, (tuple, list)):
        kind = "a list of non-negative integers"
        ok = isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    else:
        return ""
    return "" if ok else f"expected {kind} (the default is {_json(default)}), got {_json(value)}"


def _json(value) -> str:
    """A value as the case file spells it."""
    return json.dumps(value, default=str)


def load_cases(path: str | Path) -> list[Case]:
    """The file's cases, every field checked (CaseFileError names the first bad one)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CaseFileError(f"{path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise CaseFileError(f"{path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") \
            from None
    if not isinstance(data, list) or not data:
        raise CaseFileError(f"{path}: expected a non-empty JSON list of cases")
    ops = registry()
    cases = []
    for i, raw in enumerate(data):
        where = f"{path}: case {i}" + (f" ({raw['op']})" if isinstance(raw, dict) and
                                       isinstance(raw.get("op"), str) else "")
        case = _case(where, raw, ops)
        cases.append(case if case.label else Case.make(
            case.op, case.dims, case.dtype, case.dist, case.seed, dict(case.param_items),
            f"file:{path.name}", case.dtypes))
    return cases
