"""The op: a named computation, its NumPy oracle, and the facts every runner needs.

An op is declared once, as an `OpSpec`, next to its oracle. Runners, the store and the CLI only
ever talk to `OpSpec`: they never know which op they are running.

Conventions shared by every oracle:

* Inputs arrive already rounded to their storage dtype (the case dtype `T` for activations).
* The oracle computes in float64 and returns the *pre-store* value of each output, i.e. the exact
  value the kernel contract asks for just before the final store rounds it to the output dtype.
  Rounding points that the contract places *inside* the computation are reproduced by the oracle;
  the final store rounding is applied by `OpSpec.reference`, from the output's declared dtype.
* The tolerance is an element-wise bound on |impl - exact| per output. An op states it one of
  two ways: `kernel(arith, inputs, case)`, the admissible kernel's f32 computation written once
  against an arithmetic (`oracle/numerics.py`), from which `bounds` derives the rigorous bound
  for the impl's declared numerics (and the property test the worst admissible kernel); or a
  hand-derived `tolerance(inputs, exact, case)`, or `tolerance(inputs, exact, case, numerics)`
  given the impl's declared `oracle.numerics.Numerics` (its function ULPs). The docstring of
  each op says which roundings its kernel model charges.
"""

from __future__ import annotations

import dataclasses

import functools
import inspect
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from oracle.dtypes import DTYPES, is_dtype, round_to, storage_dtype


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, shape as a function of the case dims, dtype role.

    `role` says which dtype the tensor has in a case: "T", the case's activation dtype; a dtype
    name (`oracle.dtypes.DTYPES`: "f32", "u32", "i32", "e4m3"...), that dtype in every case; or
    a role the op declares in `OpSpec.roles` (e.g. "kv"), whose dtype is the case's
    `dtypes[role]` if given, else the op's default for it (`Case.dtype_of`).

    `init` says how the case generator fills an input: a generator registered by name in
    `cases/inits.py` ("data" draws from the case's value distribution, "weight" a norm weight
    around 1, or around 0 with `weight_offset=1`, "gate" a gate activation, ...), or a function
    `init(shape, dtype, rng, case, drawn) -> values` for a one-off. `adversarial` says whether
    the case's value distribution (outlier_rows, nonfinite, tiny...) applies to the tensor:
    None leaves it to the init (True for "data" and "activation"); False keeps e.g. a page table
    or a router's ids clean in every case.

    `shape(dims)`, or `shape(dims, params)` where a shape depends on a param (per-sequence
    lengths: `lambda d, p: (sum(p["new_lens"]), d["d"])`); call it through `shape_of(case)`.

    An output with `aliases="<input>"` is that input's buffer, updated in place (a KV-cache
    append, a recurrent state): the runner hands the impl the input's device buffer as the
    output, poisons only the elements `writes(case, inputs)` names (a boolean mask of the
    output's shape, or any NumPy index into it; None: every element) and requires every other
    element to keep the input's bits. `reads_written=True`: the op reads the old values where it
    writes (a state update), so the runner leaves them unpoisoned. The oracle returns the whole
    updated tensor.
    """

    name: str
    shape: Callable[..., tuple[int, ...]]
    role: str = "T"
    init: str | Callable = "data"
    # An output that is a vector of logits (out = vocab): its check also records argmax
    # agreement, the oracle's top-1 / top-2 margin and top-5 overlap (`oracle/metrics.py`).
    # Shorthand for `comparator=Logits()`.
    logits: bool = False
    adversarial: bool | None = None
    # How the check judges this output (`oracle/comparators.py`: `Bounded()`, `Logits()`,
    # `Exact()`, `TopKSet(...)`, ...). None: the element-wise bound, `Bounded()`.
    comparator: object | None = None
    aliases: str = ""
    writes: Callable[[object, dict], object] | None = None
    reads_written: bool = False

    def __post_init__(self):
        if self.logits and self.comparator is not None:
            raise ValueError(f"tensor {self.name}: logits=True is comparator=Logits(); give one")

    def dtype(self, case) -> str:
        """The tensor's dtype in `case` (a `Case`). A bare case dtype string is still taken for
        the roles that need nothing else ("T" and fixed dtypes)."""
        if not isinstance(case, str):
            return case.dtype_of(self.role)
        if self.role == "T":
            return case
        if is_dtype(self.role):
            return self.role
        raise ValueError(f"tensor {self.name}: role {self.role!r} is a per-case dtype role "
                         f"(OpSpec.roles): pass the case, t.dtype(case), not its dtype string")

    def shape_for(self, dims: Mapping[str, int], params: Mapping[str, object]
                  ) -> tuple[int, ...]:
        """The shape at these dims (and params, for a shape that reads them)."""
        if _arity(self.shape) >= 2:
            return tuple(self.shape(dims, params))
        return tuple(self.shape(dims))

    def shape_of(self, case) -> tuple[int, ...]:
        return self.shape_for(case.dims, case.params)


@functools.lru_cache(maxsize=None)
def _arity(fn) -> int:
    """Positional parameters of a shape function: 1 (dims) or 2 (dims, params). Cached: the
    tier selection asks for every gate case's shapes, and `inspect.signature` is slow."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: the classic one-argument form
        return 1
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


@dataclass(frozen=True)
class BatchDim:
    """The op is a batch of independent problems along dim `dim`: each tensor named in `inputs`
    and `outputs` carries the batch as its leading axis, row i of every output depends only on
    row i of those inputs, and the other inputs are shared by every row. What batch invariance
    (`Impl.batch_invariant`) is checked over: row i of a batch of `dim` rows must equal the
    batch-of-1 result on row i alone, bit for bit."""

    dim: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def model_offset(y, exact) -> np.ndarray:
    """|v - exact|, where the kernel model's float64 center v (the bound is around it) is not
    the oracle's exact value: |impl - exact| <= |impl - v| + |v - exact|. Float64 noise almost
    everywhere (F64_SLACK's size); not where the model's formula leaves float64's range and the
    oracle's does not: silu(-719.5) as g / (1 + e^719.5) is 0 in float64, the oracle's
    g · sigmoid(g) is -1e-310, and an f16 kernel's correct 0 failed a bound of 0."""
    if exact is None:  # a caller that asks for this output's bound without its exact value
        return 0.0
    v, x = np.broadcast_arrays(np.asarray(getattr(y, "v", y), dtype=np.float64),
                               np.asarray(exact, dtype=np.float64))
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(v) & np.isfinite(x), np.abs(v - x), 0.0)


@dataclass(frozen=True)
class OpSpec:
    """A named op. `oracle` returns float64 pre-store outputs; see the module docstring."""

    name: str
    family: str
    dims: tuple[str, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    oracle: Callable[[dict, object], dict]
    tolerance: Callable[[dict, dict, object], dict] | None
    bytes: Callable[[object], int]
    flops: Callable[[object], int]
    params: Mapping[str, object] = field(default_factory=dict)
    version: int = 1
    doc: str = ""
    # Set: the op is a batch of independent rows along this dim (see BatchDim).
    batch: BatchDim | None = None
    # Set: `plant(inputs, case)` edits the drawn inputs to plant a structure the case's
    # distribution names (e.g. two logits within one output ulp for `near_tie`).
    plant: Callable[[dict, object], dict] | None = None
    # Set: `loss(inputs, case)` returns level-2 references (e.g. x @ W unquantized) or None;
    # the check reports the outputs' distance to them, never gates on it.
    loss: Callable[[dict, object], dict | None] | None = None
    # True where the contract lets a kernel reassociate a sum so that an oracle ±inf may come
    # out NaN (inf - inf; e.g. a GEMV's split s * sum(q x) + b * sum(x)): such an output may be
    # NaN or the oracle's infinity. NaN stays NaN and finite stays finite either way.
    inf_may_be_nan: bool = False
    # Set: the admissible kernel's computation (`oracle/numerics.py`): `kernel(arith, inputs,
    # case)` returns each output's pre-store value in that arithmetic.
    kernel: Callable[[object, dict, object], dict] | None = None
    # Dtype roles beyond "T" and fixed dtypes, each with its default: a dtype name or "T" (e.g.
    # {"kv": "T"}: the KV cache in the activation dtype unless the case says {"kv": "e4m3"}).
    roles: Mapping[str, str] = field(default_factory=dict)
    # Set: `make_inputs(case, raw)` derives every input (name -> float64 values, rounded to the
    # tensor's dtype, or an array already in its storage dtype, kept as is) from `raw`, the
    # tensors of `raw_inputs` drawn by the case layer's inits (`cases.model.make_inputs`, in
    # order, one generator; `plant` still applies after): e.g. a pipeline stage's inputs as the
    # stages before it store them (`oracle/gdn_chunked.py`).
    make_inputs: Callable[[object, dict], dict] | None = None
    raw_inputs: tuple = ()
    # Set: the op is this `oracle.pipeline.Pipeline` (stages of registered ops), whose staged
    # impls the runner checks stage by stage.
    pipeline: object | None = None
    # The values a param may take where they are a finite set, e.g. {"rounding": ("once",
    # "normed")}; `ftz` (every op's flush-to-zero flag) is (0, 1) unless declared. A case file's
    # params are checked against these, and against the type of the param's default.
    param_values: Mapping[str, tuple] = field(default_factory=dict)
    # Params that name a rounding convention (a correctness contract, not a cost; each among
    # `param_values`), e.g. ("rounding",): `bench` and `ab` time an impl that refuses a bench
    # case's convention on the same case under one it admits, and say which
    # (`cases.generate.admitted_variant`).
    conventions: tuple[str, ...] = ()
    # The input that the op before this one in a decode step writes (its activation: x of a
    # norm or a GEMV, never a weight). The `chain` timing mode (`runners/timing.py`) precedes
    # each timed call with an ordinary kernel rewriting this input, as that op would; "" (none
    # declared): `chain` falls back to `graph_rot` and says so.
    chain_input: str = ""
    # Set: `domain(case)` raises ValueError naming why the op has no meaning for the case, for
    # dims and params that each pass alone but not together (a sequence longer than the cache,
    # an odd rotary dim). A case file's case is refused at load with that message; the fuzzed
    # cases of `cases/strategies.py` keep to the domain.
    domain: Callable[[object], None] | None = None

    def domain_error(self, case) -> str:
        """Why `case` lies outside the op's domain (`domain`), or ""."""
        if self.domain is None:
            return ""
        try:
            self.domain(case)
        except ValueError as e:
            return str(e)
        return ""

    def __post_init__(self):
        self._check_roles()
        if self.chain_input and self.chain_input not in {t.name for t in self.inputs}:
            raise ValueError(f"op {self.name}: chain_input {self.chain_input!r} is not an input; "
                             "inputs: " + ", ".join(t.name for t in self.inputs))
        if "ftz" in self.params and "ftz" not in self.param_values:
            object.__setattr__(self, "param_values", {**self.param_values, "ftz": (0, 1)})
        for name in self.conventions:
            if name not in self.param_values:
                raise ValueError(f"op {self.name}: convention {name!r} needs its values in "
                                 "param_values")
        for name, values in self.param_values.items():
            if name not in self.params or self.params[name] not in values:
                raise ValueError(f"op {self.name}: param_values[{name!r}] = {values!r}: the "
                                 f"param must be in params with its default among the values")
        if self.tolerance is None:
            if self.kernel is None:
                raise ValueError(f"op {self.name}: give a kernel model or a tolerance")
            object.__setattr__(self, "tolerance", lambda inputs, exact, case, numerics=None:
                               self.bounds(inputs, exact, case, numerics))
        inputs = {t.name: t for t in self.inputs}
        for t in self.inputs:
            if t.aliases or t.writes is not None:
                raise ValueError(f"op {self.name}: input {t.name!r} declares aliases/writes; "
                                 "an in-place update is declared on the output")
        for t in self.outputs:
            if t.writes is not None and not t.aliases:
                raise ValueError(f"op {self.name}: output {t.name!r} has `writes` but aliases no "
                                 "input (a fresh output is written whole)")
            if t.aliases and (t.aliases not in inputs or inputs[t.aliases].role != t.role):
                raise ValueError(
                    f"op {self.name}: output {t.name!r} aliases {t.aliases!r}, which is not an "
                    f"input of the same dtype role {t.role!r}; inputs: "
                    + ", ".join(f"{n} ({i.role})" for n, i in inputs.items()))

    def _check_roles(self):
        for role, default in self.roles.items():
            if role == "T" or is_dtype(role):
                raise ValueError(f"op {self.name}: role {role!r} in roles is "
                                 f"{'the activation role' if role == 'T' else 'a dtype name'}; "
                                 "name a role for what the tensor is (e.g. 'kv', 'weights')")
            if default != "T" and not is_dtype(default):
                raise ValueError(f"op {self.name}: roles[{role!r}] = {default!r}: the default "
                                 f"must be 'T' or a dtype ({', '.join(DTYPES)})")
        for t in self.inputs + self.outputs:
            if t.role != "T" and not is_dtype(t.role) and t.role not in self.roles:
                raise ValueError(f"op {self.name}: tensor {t.name} has dtype role {t.role!r}; "
                                 f"valid: 'T', a dtype ({', '.join(DTYPES)}) or a role of "
                                 f"OpSpec.roles ({', '.join(self.roles) or 'none declared'})")

    def output_dtype(self, name: str, case) -> str:
        return next(t for t in self.outputs if t.name == name).dtype(case)

    def written(self, name: str, case, inputs: dict) -> np.ndarray:
        """The boolean mask (the output's shape) of the elements output `name` writes: all of a
        fresh output; of an aliased one, what its `writes(case, inputs)` names."""
        t = next(t for t in self.outputs if t.name == name)
        shape = t.shape_of(case)
        if t.writes is None:
            return np.ones(shape, dtype=bool)
        where = t.writes(case, inputs)
        if isinstance(where, np.ndarray) and where.dtype == bool and where.shape == shape:
            return where
        mask = np.zeros(shape, dtype=bool)
        mask[where] = True
        return mask

    def reference(self, inputs: dict, case) -> tuple[dict, dict]:
        """(exact float64 outputs, outputs rounded to their storage dtype)."""
        with np.errstate(invalid="ignore"):  # NaN/inf inputs propagate: that is the contract
            exact = self.oracle(inputs, case)
        rounded = {t.name: round_to(exact[t.name], t.dtype(case)) for t in self.outputs}
        for t in self.outputs:
            if t.aliases:  # the oracle's own region must be the one the op declares
                kept = ~self.written(t.name, case, inputs)
                old = np.asarray(inputs[t.aliases]).astype(np.float64)[kept]
                if not np.array_equal(np.asarray(exact[t.name])[kept], old, equal_nan=True):
                    raise ValueError(f"op {self.name}: the oracle changes {t.name!r} outside the "
                                     f"elements its `writes` declares")
        return exact, rounded

    def bounds(self, inputs: dict, exact: dict, case, numerics=None) -> dict:
        """Per output, the bound on |impl - exact| for an impl declaring `numerics`
        (`oracle.numerics.Numerics`; None: the default, every order admitted). An aliased
        output's bound is 0 outside the elements it writes: the rest must be the input, exactly."""
        from oracle.numerics import DEFAULT, Bounds, model_for

        if self.kernel is None:  # a hand tolerance; one taking a 4th argument gets `numerics`
            extra = (numerics,) if _arity(self.tolerance) >= 4 else ()
            bounds = self.tolerance(inputs, exact, case, *extra)
        elif numerics is not None and numerics.one_answer and not case.params.get("ftz"):
            bounds = self._one_answer_bounds(inputs, exact, case, numerics)
        else:
            arith = Bounds(model_for(case, numerics or DEFAULT))
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                values = self.kernel(arith, inputs, case)
                bounds = {t.name: arith.store(values[t.name], t.dtype(case))
                          + model_offset(values[t.name], exact.get(t.name))
                          for t in self.outputs}
        for t in self.outputs:
            if t.aliases:
                bounds[t.name] = np.where(self.written(t.name, case, inputs), bounds[t.name], 0.0)
        return bounds

    def _one_answer_bounds(self, inputs: dict, exact: dict, case, numerics) -> dict:
        """The bounds of an impl declaring `Numerics.one_answer`: its kernel model emulated
        (`oracle/emulated.py`), each output held to that one answer."""
        from oracle.emulated import Emulated, Undetermined, one_answer_bound
        from oracle.numerics import model_for

        try:
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                values = self.kernel(Emulated(model_for(case, numerics)), inputs, case)
        except Undetermined as e:
            raise ValueError(f"op {self.name}: an impl declares one answer ({numerics}) but "
                             f"its kernel model leaves open {e}; declare it, or drop "
                             "one_answer") from None
        return {t.name: one_answer_bound(values[t.name], exact.get(t.name), t.dtype(case))
                for t in self.outputs}

    def sum_sites(self, case, inputs: dict, numerics=None) -> set:
        """The sums whose declared order the bound on `case` reads for an impl declaring
        `numerics` (default: none): their site names (None: a sum the op's model leaves
        unnamed). Empty: no sum an impl could declare (`ops --matrix` shows "-")."""
        from oracle.numerics import DEFAULT, Numerics

        read = set()

        class Watched(Numerics):
            def order(self, site):
                read.add(site)
                return super().order(site)

        given = numerics or DEFAULT
        watched = Watched(**{f.name: getattr(given, f.name) for f in dataclasses.fields(Numerics)})
        self.bounds(inputs, self.reference(inputs, case)[0], case, watched)
        return read

    def io_bytes(self, case) -> int:
        """Each input read once, each output written once."""
        total = 0
        for t in self.inputs + self.outputs:
            n = int(np.prod(t.shape_of(case), dtype=np.int64))
            total += n * storage_dtype(t.dtype(case)).itemsize
        return total


_REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"op {spec.name!r} registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def registry() -> dict[str, OpSpec]:
    from oracle import load_all

    load_all()
    return dict(_REGISTRY)


def get_op(name: str) -> OpSpec:
    spec = _REGISTRY.get(name)  # every `case.spec` asks: no copy of the registry for a known op
    if spec is None:
        spec = registry().get(name)
    if spec is None:
        raise KeyError(name)
    return spec
