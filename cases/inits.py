"""Input generators ("inits"): how the case generator fills one input tensor.

A generator is `fn(shape, dtype, rng, case, drawn) -> values` for one tensor: float64 values
(the caller rounds them RNE to `dtype`), or an array already in the tensor's storage dtype, kept
bit for bit (codes). `drawn` holds the inputs drawn before it, read-only and already stored, so
a page table can follow the sequence lengths drawn before it. All of a case's tensors draw from
one `rng` seeded by the case id, in the order the op declares its inputs.

`TensorSpec.init` names a registered generator, or is such a function itself (a one-off).
Families register theirs next to their cases:

    @init("unit_keys")
    def unit_keys(shape, dtype, rng, case, drawn):
        k = rng.standard_normal(shape)
        return k / np.linalg.norm(k, axis=-1, keepdims=True)

A generator registered with `adversarial=True` takes the case's value distribution
(`cases/distributions.py`) as a sixth argument `dist`: the case's own where the tensor is
adversarial (`TensorSpec.adversarial`, which defaults to the init's registration), "normal"
where it is not. A one-off function gets `dist` only on a tensor that says `adversarial=True`.

| init         | values                                                                        |
|--------------|-------------------------------------------------------------------------------|
| `data`       | the case's distribution (adversarial)                                         |
| `activation` | `data` / sqrt(n), n the last axis (adversarial): a unit-order GEMV output     |
| `weight`     | 1 + N(0, 0.1^2); N(0, 0.1^2) when the op adds `weight_offset=1` (Gemma's 1+w) |
| `gate`       | N(0, 2^2): silu sees both tails                                               |
| `codes`      | uniform uint32 words: every code of every bit width uniform                   |
| `qscale`     | 0.004 U(0.5, 1.5), random sign: a group's scale at a typical weight's size    |
| `qbias`      | N(0, 0.03^2): a group's bias                                                  |
| `param:NAME` | the case's param NAME everywhere (an index the kernel reads from device)      |
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

import numpy as np

from cases.distributions import values as distribution_values
from oracle.dtypes import round_to, storage_dtype


@dataclass(frozen=True)
class Init:
    name: str
    fn: Callable
    adversarial: bool  # takes the case's value distribution (a sixth argument, `dist`)


_INITS: dict[str, Init] = {}


def init(name: str, adversarial: bool = False):
    """Decorator: register `fn(shape, dtype, rng, case, drawn[, dist])` as init `name`."""
    if ":" in name:
        raise ValueError(f"init name {name!r}: ':' is reserved for param:NAME")

    def wrap(fn):
        if name in _INITS:
            raise ValueError(f"init {name!r} registered twice")
        _INITS[name] = Init(name, fn, adversarial)
        return fn

    return wrap


def inits() -> dict[str, Init]:
    """Every registered init (the family modules' included)."""
    _load_families()
    return dict(_INITS)


def _load_families() -> None:
    """Families register inits in their case and oracle modules: import them all."""
    from cases.registry import sources
    from oracle import load_all

    load_all()
    sources()


def resolve(spec) -> Init:
    """The `Init` of a tensor's `init`: a registered name, `param:NAME` or a function."""
    if callable(spec):
        return Init(getattr(spec, "__name__", "<function>"), spec, False)
    if spec.startswith("param:"):
        return Init(spec, _param_fill(spec[len("param:"):]), False)
    if spec not in _INITS:
        _load_families()
    if spec not in _INITS:
        raise ValueError(f"unknown tensor init {spec!r}; registered: {', '.join(sorted(_INITS))}, "
                         "or param:NAME; register one with @cases.inits.init(name)")
    return _INITS[spec]


def call_init(spec, shape, dtype: str, rng: np.random.Generator, case, drawn, dist: str,
              adversarial: bool | None = None, where: str = "") -> np.ndarray:
    """Run init `spec` for one tensor; `adversarial` is the tensor's `TensorSpec.adversarial`
    (None: the init's own), deciding whether it gets `dist` or "normal"."""
    entry = resolve(spec)
    takes = entry.adversarial or (callable(spec) and adversarial is True)
    if adversarial is True and not takes:
        raise ValueError(f"{where or 'tensor'}: adversarial=True, but init {entry.name!r} takes "
                         "no value distribution; register it with @init(name, adversarial=True)")
    if not takes:
        return entry.fn(shape, dtype, rng, case, drawn)
    own = entry.adversarial if adversarial is None else adversarial
    return entry.fn(shape, dtype, rng, case, drawn, dist if own else "normal")


def draw_tensor(t, case, rng: np.random.Generator, drawn: dict) -> np.ndarray:
    """Input `t` (a `TensorSpec`) of `case`, drawn by its init and stored in its dtype. An op's
    own `make_inputs` may call it for the tensors it draws the usual way."""
    values = call_init(t.init, t.shape_of(case), t.dtype(case), rng, case,
                       MappingProxyType(drawn), case.dist, t.adversarial, f"{case.op}.{t.name}")
    return stored(t, case, values, f"init {resolve(t.init).name!r}")


def stored(t, case, values, source: str) -> np.ndarray:
    """`values` for tensor `t` in its storage dtype: float64 values rounded RNE in one step,
    an array already in the storage dtype kept as it is. The shape must be the tensor's."""
    dtype = t.dtype(case)
    shape = tuple(t.shape_of(case))
    values = np.asarray(values)
    if values.shape != shape:
        raise ValueError(f"{case.op}.{t.name}: {source} gave shape {values.shape}, the tensor's "
                         f"is {shape}")
    if values.dtype == storage_dtype(dtype):
        return values
    return round_to(values, dtype).astype(storage_dtype(dtype), copy=False)


# --- the built-in inits (module docstring) --------------------------------------------------------

@init("data", adversarial=True)
def data(shape, dtype, rng, case, drawn, dist):
    return distribution_values(dist, shape, dtype, rng)


@init("activation", adversarial=True)
def activation(shape, dtype, rng, case, drawn, dist):
    return distribution_values(dist, shape, dtype, rng) / np.sqrt(shape[-1])


@init("weight")
def weight(shape, dtype, rng, case, drawn):
    base = 0.0 if case.params.get("weight_offset", 0) else 1.0
    return base + 0.1 * rng.standard_normal(shape)


@init("gate")
def gate(shape, dtype, rng, case, drawn):
    return 2.0 * rng.standard_normal(shape)


@init("codes")
def codes(shape, dtype, rng, case, drawn):
    return rng.integers(0, 1 << 32, shape, dtype=np.uint64).astype(np.float64)


@init("qscale")
def qscale(shape, dtype, rng, case, drawn):
    return 0.004 * rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)


@init("qbias")
def qbias(shape, dtype, rng, case, drawn):
    return 0.03 * rng.standard_normal(shape)


def _param_fill(name: str):
    def fill(shape, dtype, rng, case, drawn):
        if name not in case.params:
            raise ValueError(f"init param:{name}: the case has no param {name!r}; its params: "
                             f"{', '.join(case.params) or 'none'}")
        return np.full(shape, case.params[name], dtype=np.float64)

    return fill


def draw(init: str, dist: str, shape: tuple[int, ...], dtype: str, rng: np.random.Generator,
         params: dict) -> np.ndarray:
    """float64 values of the registered init `init` for one tensor outside a case (tests,
    scripts): `dist` is the distribution it takes if it takes one, `params` the case params it
    may read. Inits that read more of the case (dims, the inputs drawn before) need a case:
    `draw_tensor`."""
    return call_init(init, shape, dtype, rng, _ParamsOnly(params, dist), {}, dist)


class _ParamsOnly:
    """What `draw` gives an init for its case: the params and the distribution, nothing else."""

    def __init__(self, params: dict, dist: str):
        self.params, self.dist = dict(params), dist
