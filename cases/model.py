"""The case: a frozen value (op, dims, dtype, value distribution, seed, params).

`case.id` is a content hash: the same case has the same id in every process, on every machine,
for as long as the op's oracle version is unchanged. `make_inputs(case)` is deterministic from it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace as dc_replace

import numpy as np

from oracle.dtypes import round_to, storage_dtype
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

    @staticmethod
    def make(op: str, dims: dict, dtype: str, dist: str = "normal", seed: int = 0,
             params: dict | None = None, label: str = "") -> "Case":
        return Case(op, tuple(sorted((k, int(v)) for k, v in dims.items())), dtype, dist, seed,
                    tuple(sorted((params or {}).items())), label)

    @property
    def dims(self) -> dict[str, int]:
        return dict(self.dim_items)

    @property
    def spec(self) -> OpSpec:
        return get_op(self.op)

    @property
    def params(self) -> dict[str, object]:
        """The op's default params overridden by the case's own."""
        return {**self.spec.params, **dict(self.param_items)}

    def key(self) -> dict:
        """The fields that define the case (and its id), JSON-ready."""
        return {"op": self.op, "dims": self.dims, "dtype": self.dtype, "dist": self.dist,
                "seed": self.seed, "params": dict(self.param_items),
                "oracle_version": self.spec.version}

    @property
    def id(self) -> str:
        blob = json.dumps(self.key(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_json(self) -> str:
        return json.dumps({**self.key(), "label": self.label}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Case":
        d = json.loads(text)
        return Case.make(d["op"], d["dims"], d["dtype"], d["dist"], d["seed"], d["params"],
                         d.get("label", ""))

    def replace(self, label: str = "", **values) -> "Case":
        """A copy with some dims and/or params changed (names are routed by the op's dims)."""
        dims = {k: v for k, v in values.items() if k in self.spec.dims}
        params = {k: v for k, v in values.items() if k not in self.spec.dims}
        return Case.make(self.op, {**self.dims, **dims}, self.dtype, self.dist, self.seed,
                         {**dict(self.param_items), **params}, label or self.label)

    def with_seed(self, seed: int) -> "Case":
        """A copy with another seed (so another id and fresh inputs), label kept. Not through
        `replace`, which routes every name to the dims or the params."""
        return dc_replace(self, seed=int(seed))

    def short(self) -> str:
        dims = ",".join(f"{k}={v}" for k, v in self.dim_items)
        seed = f" seed {self.seed}" if self.seed else ""  # 0, every generated case's, goes unsaid
        return f"{self.op}[{dims}] {self.dtype} {self.dist}{seed}"


def make_inputs(case: Case) -> dict[str, np.ndarray]:
    """Deterministic inputs for `case`, each rounded to its storage dtype."""
    from cases.distributions import DATA_INITS, draw

    rng = np.random.default_rng(int(case.id, 16))
    inputs = {}
    for t in case.spec.inputs:
        dtype = t.dtype(case.dtype)
        shape = t.shape(case.dims)
        values = draw(t.init, case.dist if t.init in DATA_INITS else "normal", shape, dtype, rng,
                      case.params)
        inputs[t.name] = round_to(values, dtype).astype(storage_dtype(dtype), copy=False)
    if case.spec.plant is not None:
        inputs = case.spec.plant(inputs, case)
    return inputs
