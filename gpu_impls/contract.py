"""Dispatch contracts as data.

A kernel's contract is the list of invariants its launch geometry must satisfy (the seed kernels'
`## DISPATCH INVARIANTS` blocks). The wrapper never accepts a geometry from its caller: it derives
one from the case dims with `Contract.geometry`, then `Contract.check` evaluates every invariant
on the dims, params and derived geometry together, before any launch. A broken invariant raises
`ContractError` naming it, saying what it would have done, and the nearest valid choice. Why this
matters: the 2026-05-19 GPU freeze came from a reduction kernel launched with 4 threads, where
`n_simd = TPG/32 = 0` turned a strided loop into an infinite one (`reference/ops.md` §5).

Each invariant also carries `violation`, dims that break it (and, where possible, only it): the
case generator turns those into the "violating case per invariant" that tests and sweeps run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from oracle.dtypes import FLOAT_DTYPES


class ContractError(ValueError):
    """A case that the kernel's dispatch contract forbids. Raised before any launch."""

    def __init__(self, impl: str, invariant: str, values: str, why: str, fix: str):
        self.impl, self.invariant, self.fix = impl, invariant, fix
        super().__init__(f"{impl}: contract invariant `{invariant}` broken ({values}): {why}. "
                         f"Nearest valid choice: {fix}")


@dataclass(frozen=True)
class Launch:
    """Derived launch geometry: grid and block in CUDA's (x, y, z) sense, dynamic shared memory."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0
    extra: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Invariant:
    """`holds(ns)` over a namespace of dims, params and geometry names (`tpg`, `rows`, ...).

    `shows` lists the names whose values the error message prints; `fix(ns)` returns the nearest
    valid choice as text; `violation` is a dims override that breaks this invariant.
    """

    name: str
    holds: Callable[[Mapping[str, int]], bool]
    why: str
    fix: Callable[[Mapping[str, int]], str]
    violation: Mapping[str, int]
    shows: tuple[str, ...] = ()


@dataclass(frozen=True)
class Contract:
    invariants: tuple[Invariant, ...] = ()
    # dims, params -> derived names (e.g. {"tpg": n // 4}) and the Launch.
    geometry: Callable[[Mapping[str, int], Mapping[str, object]], tuple[dict, Launch]] | None = None
    dtypes: tuple[str, ...] = FLOAT_DTYPES
    # The dtypes the kernel is built for per dtype role of its op (`OpSpec.roles`), e.g.
    # {"kv": ("e4m3", "e5m2")}; a role not named here may take any dtype.
    role_dtypes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def namespace(self, case) -> tuple[dict, Launch | None]:
        """dims, params (with the case's `dtype`: a vector width depends on it; for an op with
        dtype roles, `dtypes`: each role's dtype in the case) and geometry."""
        params = {**case.params, "dtype": case.dtype}
        if case.spec.roles:
            params["dtypes"] = {role: case.dtype_of(role) for role in case.spec.roles}
        ns = {**params, **case.dims}
        if self.geometry is None:
            return ns, None
        derived, launch = self.geometry(case.dims, params)
        return {**ns, **derived}, launch

    def broken(self, case) -> list[Invariant]:
        ns, _ = self.namespace(case)
        return [inv for inv in self.invariants if not inv.holds(ns)]

    def check(self, impl_id: str, case) -> Launch | None:
        """The derived launch, or ContractError for the first broken invariant."""
        if case.dtype not in self.dtypes:
            raise ContractError(impl_id, f"dtype in {self.dtypes}", f"dtype={case.dtype}",
                                "the kernel is not instantiated for this dtype",
                                f"one of {', '.join(self.dtypes)}")
        for role, dtype in self._bad_role_dtypes(case):
            allowed = self.role_dtypes[role]
            raise ContractError(impl_id, f"{role} dtype in {tuple(allowed)}", f"{role}={dtype}",
                                "the kernel is not instantiated for this dtype",
                                f"dtypes={{{role!r}: one of {', '.join(allowed)}}}")
        ns, launch = self.namespace(case)
        for inv in self.invariants:
            if not inv.holds(ns):
                shown = ", ".join(f"{k}={ns[k]}" for k in inv.shows if k in ns)
                raise ContractError(impl_id, inv.name, shown, inv.why, inv.fix(ns))
        return launch

    def admits(self, case) -> bool:
        return (case.dtype in self.dtypes and not self._bad_role_dtypes(case)
                and not self.broken(case))

    def _bad_role_dtypes(self, case) -> list[tuple[str, str]]:
        return [(role, case.dtype_of(role)) for role, allowed in self.role_dtypes.items()
                if case.dtype_of(role) not in allowed]


NO_CONTRACT = Contract()


def nearest_multiples(value: int, m: int, lo: int = 1, hi: int | None = None) -> str:
    """'a or b': the multiples of m nearest to value, within [lo, hi]."""
    below = max((value // m) * m, lo + (-lo) % m)
    above = below + m if below < value else below
    options = sorted({v for v in (below, above) if v >= lo and (hi is None or v <= hi)})
    if not options and hi is not None:
        options = [(hi // m) * m]
    return " or ".join(str(v) for v in options)


def param_is(name: str, value: object, alternative: str, other: object = None) -> Invariant:
    """A semantic invariant: the impl implements only `name == value` (e.g. a rounding
    convention); `other` is the value its violating case uses."""
    if other is None:
        other = {"once": "normed", "normed": "once"}[value]
    return Invariant(
        name=f"{name} == {value!r}", holds=lambda ns: ns.get(name) == value,
        why=f"this impl implements only {name}={value!r}", fix=lambda ns: alternative,
        violation={name: other}, shows=(name,))


def rounding_once(alternative: str) -> tuple[Invariant, ...]:
    """For ops with a `rounding` param: this impl rounds once, at the store."""
    return (param_is("rounding", "once", alternative),)
