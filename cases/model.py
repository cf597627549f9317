"""The case: a frozen value (op, dims, dtype, value distribution, seed, params, role dtypes).

`case.id` is a content hash: the same case has the same id in every process, on every machine,
for as long as the op's oracle version is unchanged. `make_inputs(case)` is deterministic from it.

`dtype` is the activation dtype T. `dtypes` gives per-role dtypes for the roles the op declares
(`OpSpec.roles`), e.g. `{"kv": "e4m3"}` for an fp8 KV cache beside bf16 queries; a role the case
does not name takes the op's default. It is part of the id only when non-empty, so the id of a
case without role dtypes is what it was before they existed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace as dc_replace

import numpy as np

from oracle.dtypes import check_dtype, is_dtype
from oracle.spec import OpSpec, get_op


@dataclass(frozen=True)
class Case:
    op: str
    dim_items: tuple[tuple[str, int], ...]
    dtype: str
    dist: str = "normal"
    seed: int = 0
    param_items: tuple[tuple[str, object], ...] = ()
    # Where the case came from ("preset:qwen3-8b", "edge", "violates:<invariant>", "fuzz").
    # Metadata only: not part of the id, so one shape reached from two presets is one case.
    label: str = field(default="", compare=False)
    # Per-role dtypes that differ from the op's defaults, sorted (`Case.make` normalises them).
    dtype_items: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def make(op: str, dims: dict, dtype: str, dist: str = "normal", seed: int = 0,
             params: dict | None = None, label: str = "", dtypes: dict | None = None) -> "Case":
        check_dtype(dtype, f"case {op}: dtype")
        params = {k: _param(op, k, v) for k, v in (params or {}).items()}
        return Case(op, tuple(sorted((k, int(v)) for k, v in dims.items())), dtype, dist, seed,
                    tuple(sorted(params.items())), label,
                    _role_dtypes(op, dtype, dtypes or {}))

    @property
    def dims(self) -> dict[str, int]:
        return dict(self.dim_items)

    @property
    def spec(self) -> OpSpec:
        return get_op(self.op)

    @property
    def dtypes(self) -> dict[str, str]:
        """The case's own per-role dtypes (those that differ from the op's defaults)."""
        return dict(self.dtype_items)

    def dtype_of(self, role: str) -> str:
        """The dtype of role `role` in this case: "T" is the case dtype, a dtype name is itself,
        an op role (`OpSpec.roles`) is the case's `dtypes[role]`, else the op's default."""
        if role == "T":
            return self.dtype
        if is_dtype(role):
            return role
        if role in self.dtypes:
            return self.dtypes[role]
        roles = self.spec.roles
        if role not in roles:
            raise ValueError(f"case {self.op}: unknown dtype role {role!r}; "
                             f"{_valid_roles(self.spec)}")
        return self.dtype if roles[role] == "T" else roles[role]

    @property
    def params(self) -> dict[str, object]:
        """The op's default params overridden by the case's own."""
        return {**self.spec.params, **dict(self.param_items)}

    def key(self) -> dict:
        """The fields that define the case (and its id), JSON-ready. `dtypes` only when the case
        has any: ids of cases without them are unchanged."""
        key = {"op": self.op, "dims": self.dims, "dtype": self.dtype, "dist": self.dist,
               "seed": self.seed, "params": dict(self.param_items),
               "oracle_version": self.spec.version}
        if self.dtype_items:
            key["dtypes"] = self.dtypes
        return key

    @property
    def id(self) -> str:
        # Kept on the instance beside the oracle version it hashed (a sweep asks for a case's
        # id many times; JSON and SHA-256 each time cost seconds over a fuzz test's draws)
        version = self.spec.version
        held = self.__dict__.get("_id")
        if held is None or held[0] != version:
            blob = json.dumps(self.key(), sort_keys=True, separators=(",", ":"))
            held = version, hashlib.sha256(blob.encode()).hexdigest()[:12]
            object.__setattr__(self, "_id", held)
        return held[1]

    def to_json(self) -> str:
        return json.dumps({**self.key(), "label": self.label}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Case":
        d = json.loads(text)
        return Case.make(d["op"], d["dims"], d["dtype"], d["dist"], d["seed"], d["params"],
                         d.get("label", ""), d.get("dtypes"))

    def replace(self, label: str = "", dtypes: dict | None = None, **values) -> "Case":
        """A copy with some dims and/or params changed (names are routed by the op's dims),
        and/or some role dtypes (`dtypes`, over the case's own)."""
        dims = {k: v for k, v in values.items() if k in self.spec.dims}
        params = {k: v for k, v in values.items() if k not in self.spec.dims}
        return Case.make(self.op, {**self.dims, **dims}, self.dtype, self.dist, self.seed,
                         {**dict(self.param_items), **params}, label or self.label,
                         {**self.dtypes, **(dtypes or {})})

    def with_seed(self, seed: int) -> "Case":
        """A copy with another seed (so another id and fresh inputs), label kept. Not through
        `replace`, which routes every name to the dims or the params."""
        return dc_replace(self, seed=int(seed))

    def short(self) -> str:
        dims = ",".join(f"{k}={v}" for k, v in self.dim_items)
        seed = f" seed {self.seed}" if self.seed else ""  # 0, every generated case's, goes unsaid
        roles = "".join(f" {role}={dtype}" for role, dtype in self.dtype_items)
        return f"{self.op}[{dims}] {self.dtype}{roles} {self.dist}{seed}"


def _valid_roles(spec: OpSpec) -> str:
    if not spec.roles:
        return f"{spec.name} declares no dtype roles (OpSpec.roles): drop `dtypes`"
    roles = ", ".join(f"{role} (default {dtype})" for role, dtype in spec.roles.items())
    return f"{spec.name}'s roles: {roles}"


def _role_dtypes(op: str, dtype: str, dtypes: dict) -> tuple[tuple[str, str], ...]:
    """`dtypes` checked against the op's roles and the dtype registry, sorted, without the
    entries equal to the op's default (one content, one id)."""
    if not dtypes:
        return ()
    if not isinstance(dtypes, dict):
        raise ValueError(f"case {op}: dtypes must be a dict of role -> dtype, got {dtypes!r}")
    try:
        spec = get_op(op)
    except KeyError:
        raise ValueError(f"case {op}: unknown op, so its dtype roles are unknown") from None
    items = []
    for role, value in sorted(dtypes.items()):
        if role not in spec.roles:
            raise ValueError(f"case {op}: unknown dtype role {role!r} in dtypes; "
                             f"{_valid_roles(spec)}")
        check_dtype(value, f"case {op}: dtypes[{role!r}]")
        default = dtype if spec.roles[role] == "T" else spec.roles[role]
        if value != default:
            items.append((role, value))
    return tuple(items)


def _param(op: str, name: str, value):
    """A param as the case holds it: a scalar as given; a list or tuple (per-sequence lengths,
    positions) as a tuple of non-negative ints, so it hashes, and its id (a JSON list) is stable."""
    if not isinstance(value, (list, tuple)):
        return value
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"case of op {op}: param {name!r} = {list(value)!r}: a tuple param "
                             f"holds non-negative integers (per-sequence lengths, positions); "
                             f"element {i} is {v!r}")
    return tuple(int(v) for v in value)


def make_inputs(case: Case) -> dict[str, np.ndarray]:
    """Deterministic inputs for `case`, each in its storage dtype: each tensor's init in
    declaration order from one generator seeded by the case id (`cases/inits.py`), or, for an
    op with its own `make_inputs`, its `raw_inputs` drawn so and the inputs derived from them;
    then the op's `plant`."""
    from cases.inits import draw_tensor, stored

    rng = np.random.default_rng(int(case.id, 16))
    spec = case.spec
    if spec.make_inputs is not None:
        raw: dict = {}
        for t in spec.raw_inputs:
            raw[t.name] = draw_tensor(t, case, rng, raw)
        drawn = spec.make_inputs(case, raw)
        names = [t.name for t in spec.inputs]
        if set(drawn) != set(names):
            raise ValueError(f"op {case.op}: make_inputs returned {sorted(drawn)}, the op's "
                             f"inputs are {names}")
        inputs = {t.name: stored(t, case, drawn[t.name], "make_inputs") for t in spec.inputs}
    else:
        inputs = {}
        for t in spec.inputs:
            inputs[t.name] = draw_tensor(t, case, rng, inputs)
    if spec.plant is not None:
        inputs = spec.plant(inputs, case)
    return inputs
