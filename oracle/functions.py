"""The elementwise functions a kernel model may call: one declaration each, open to every op.

A kernel model calls a function on an interval (`Val.call(name)`) and on the emulated kernel
(`Adverse.call(name)`, `oracle/numerics.py`); both read the declaration registered here under
that name. An op (or a plugin) that needs a function kparity does not know registers it from its
own module, e.g. logit soft-capping's tanh:

    register_function(Function("tanh", np.tanh, ulps=2.0, shape="increasing"))

and its kernel model calls `(x / c).call("tanh") * c`: no shared file changes.

What a declaration says:

- `exact`: the float64 form (the oracle's value, and the emulated kernel's before its error).
- `ulps`: the error of a backend's f32 version, in f32 ULPs at the result (`backend_ulps` for a
  backend that differs; an impl may declare its own, `Numerics.ulps`). Where it comes from
  belongs in the declaration's comment: a library's documented bound or a measurement.
- `shape` and `domain`: a function monotone on its open domain ("increasing" or "decreasing")
  maps the operand's interval [a - e, a + e] onto [f(a - e), f(a + e)] (or reversed): the
  propagated error is the farther end from f(a), exactly, and an interval that leaves the
  domain is unbounded. Then the function's own ULPs at the largest magnitude the result has.
- `interval` / `adverse`: a function whose bound says more than its monotone image gives its
  own forms (exp's overflow, sin's absolute error near its zeros): `interval(val) -> Val`,
  `adverse(kernel) -> Adverse`. A non-monotone function must give `interval`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

SHAPES = ("increasing", "decreasing", "custom")


@dataclass(frozen=True)
class Function:
    name: str
    exact: Callable[[np.ndarray], np.ndarray]
    ulps: float
    shape: str = "increasing"
    domain: tuple[float, float] = (-np.inf, np.inf)  # open: the ends are outside
    backend_ulps: Mapping[str, float] = field(default_factory=dict)
    interval: Callable | None = None
    adverse: Callable | None = None

    def __post_init__(self):
        if not self.name or not self.name.isidentifier():
            raise ValueError(f"function name {self.name!r}: a Python identifier, e.g. 'tanh'")
        if self.shape not in SHAPES:
            raise ValueError(f"function {self.name}: shape {self.shape!r}; one of "
                             f"{', '.join(SHAPES)} ('custom' with an `interval` form)")
        if self.shape == "custom" and self.interval is None:
            raise ValueError(f"function {self.name}: shape 'custom' needs an `interval` form "
                             f"(a monotone function: shape 'increasing' or 'decreasing')")
        if not (isinstance(self.ulps, (int, float)) and self.ulps >= 0):
            raise ValueError(f"function {self.name}: ulps {self.ulps!r}; a number >= 0 (f32 "
                             f"ULPs at the result)")
        low, high = self.domain
        if not low < high:
            raise ValueError(f"function {self.name}: domain {self.domain}; (low, high), low < "
                             f"high")

    def ulps_on(self, backend: str) -> float:
        return float(self.backend_ulps.get(backend, self.ulps))

    def same_as(self, other: "Function") -> bool:
        """The same declaration, though perhaps from another import of its module (a plugin
        loaded by path twice): the same numbers and forms, named alike."""
        def key(f):
            forms = (f.exact, f.interval, f.adverse)
            return (f.name, f.ulps, f.shape, f.domain, dict(f.backend_ulps),
                    tuple(getattr(c, "__qualname__", repr(c)) for c in forms))
        return key(self) == key(other)


FUNCTIONS: dict[str, Function] = {}


def register_function(f: Function) -> Function:
    """Register `f` under its name. The same declaration again is a no-op (a module imported
    twice, a plugin loaded in a worker); another under a taken name is an error."""
    held = FUNCTIONS.get(f.name)
    if held is not None and not held.same_as(f):
        raise ValueError(f"function {f.name!r} is registered already, differently; pick another "
                         f"name or reuse `function({f.name!r})`")
    FUNCTIONS[f.name] = f
    return f


def functions() -> dict[str, Function]:
    """Every declared function, the ops' own included (their modules loaded first)."""
    from oracle import load_all

    load_all()
    return dict(FUNCTIONS)


def function(name: str) -> Function:
    try:
        return FUNCTIONS[name] if name in FUNCTIONS else functions()[name]
    except KeyError:
        raise KeyError(f"no function {name!r} in the kernel models' vocabulary (known: "
                       f"{', '.join(sorted(FUNCTIONS))}); declare it in the op's module: "
                       f"register_function(Function({name!r}, exact, ulps=..., shape=...))"
                       ) from None
