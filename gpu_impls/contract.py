"""Dispatch contracts as data.

A kernel's contract is the list of invariants its launch geometry must satisfy (the seed kernels'
`## DISPATCH INVARIANTS` blocks). The wrapper never accepts a geometry from its caller: it derives
one from the case dims with `Contract.geometry`, then `Contract.check` evaluates every invariant
on the dims, params and derived geometry together, before any launch. A broken invariant raises
`ContractError` naming it, saying what it would have done, and the nearest valid choice. Why this
matters: the 2026-05-19 GPU freeze came from a reduction kernel launched with 4 threads, where
`n_simd = TPG/32 = 0` turned a strided loop into an infinite one (thewafflehaus/FFAI
`papers/post-mortem-2026-05-19-dispatch-shape-gpu-freeze.md`).

Each invariant also carries `violation`, dims that break it (and, where possible, only it): the
case generator turns those into the "violating case per invariant" that tests and sweeps run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from oracle.dtypes import FLOAT_DTYPES


class ContractError(ValueError):
    """A case that the kernel's dispatch contract forbids. Raised before any launch. `launch`:
    which launch of a several-launch impl (`Launches`) the invariant belongs to, else ""."""

    def __init__(self, impl: str, invariant: str, values: str, why: str, fix: str,
                 launch: str = ""):
        self.impl, self.invariant, self.fix, self.launch = impl, invariant, fix, launch
        self.values, self.why = values, why
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

    def namespace(self, case, given: Mapping[str, object] | None = None
                  ) -> tuple[dict, Launch | None]:
        """dims, params (with the case's `dtype`: a vector width depends on it; for an op with
        dtype roles, `dtypes`: each role's dtype in the case) and geometry. `given`: names an
        earlier launch derived (`Launches`), seen as params."""
        params = {**(given or {}), **case.params, "dtype": case.dtype}
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


class Launches:
    """The contract of an impl with several launches (a split-KV pass and its combine): one
    `Contract` per named launch, in launch order. Every launch's invariants are checked before
    anything launches; `check` returns {name: Launch}, which the impl's run function receives.

    A launch's geometry and invariants see the names the earlier launches derived (the combine
    reads the split's part count). Its invariants are named `"<launch>: <invariant>"`, so a
    violating case's label and a `ContractError` name the launch.

    Same interface as `Contract` (`check`, `broken`, `admits`, `invariants`, `dtypes`), so the
    case generator and the runners take either.
    """

    def __init__(self, contracts: Mapping[str, Contract]):
        if not contracts:
            raise ValueError("Launches needs at least one named launch")
        for name, c in contracts.items():
            if not isinstance(c, Contract):
                raise TypeError(f"launch {name!r}: a Contract, got {type(c).__name__}")
        self.contracts = dict(contracts)

    @property
    def geometry(self):  # a several-launch contract has no single geometry
        return None

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes every launch is instantiated for."""
        each = [c.dtypes for c in self.contracts.values()]
        return tuple(d for d in each[0] if all(d in other for other in each[1:]))

    @property
    def invariants(self) -> tuple[Invariant, ...]:
        return tuple(inv for _, inv, _ in self._named())

    def _named(self) -> list[tuple[str, Invariant, Invariant]]:
        """(launch, invariant named for its launch, the launch contract's own invariant)."""
        if not hasattr(self, "_named_cache"):
            self._named_cache = [(name, replace(inv, name=f"{name}: {inv.name}"), inv)
                                 for name, c in self.contracts.items() for inv in c.invariants]
        return self._named_cache

    def namespaces(self, case) -> dict[str, tuple[dict, Launch | None]]:
        """Per launch, its namespace (with the names earlier launches derived) and launch."""
        out, given = {}, {}
        own = {**case.params, **case.dims, "dtype": case.dtype}
        for name, contract in self.contracts.items():
            ns, launch = contract.namespace(case, given)
            out[name] = (ns, launch)
            given = {**given, **{k: v for k, v in ns.items() if k not in own}}
        return out

    def broken(self, case) -> list[Invariant]:
        spaces = self.namespaces(case)
        return [named for launch, named, inv in self._named() if not inv.holds(spaces[launch][0])]

    def check(self, impl_id: str, case) -> dict[str, Launch | None]:
        """{launch name: derived launch}, or ContractError for the first broken invariant of
        any launch (launch order), before anything launches."""
        for name, contract in self.contracts.items():
            if case.dtype not in contract.dtypes:
                raise ContractError(impl_id, f"{name}: dtype in {contract.dtypes}",
                                    f"dtype={case.dtype}", f"launch {name!r} is not "
                                    "instantiated for this dtype",
                                    f"one of {', '.join(contract.dtypes)}", launch=name)
        spaces = self.namespaces(case)
        for name, named, inv in self._named():
            ns = spaces[name][0]
            if not inv.holds(ns):
                shown = ", ".join(f"{k}={ns[k]}" for k in inv.shows if k in ns)
                raise ContractError(impl_id, named.name, shown, inv.why, inv.fix(ns),
                                    launch=name)
        return {name: launch for name, (_, launch) in spaces.items()}

    def admits(self, case) -> bool:
        return case.dtype in self.dtypes and not self.broken(case)


def nearest_multiples(value: int, m: int, lo: int = 1, hi: int | None = None) -> str:
    """'a or b': the multiples of m nearest to value, within [lo, hi]."""
    below = max((value // m) * m, lo + (-lo) % m)
    above = below + m if below < value else below
    options = sorted({v for v in (below, above) if v >= lo and (hi is None or v <= hi)})
    if not options and hi is not None:
        options = [(hi // m) * m]
    return " or ".join(str(v) for v in options)


def param_is(name: str, value: object, alternative: str, other: object) -> Invariant:
    """A semantic invariant: the impl implements only `name == value` (e.g. a rounding
    convention); `other`, a value the op admits, is the one its violating case uses (named at
    each call: which values exist is the op's, e.g. rms_norm's once / normed, silu_mul's
    once / act)."""
    return Invariant(
        name=f"{name} == {value!r}", holds=lambda ns: ns.get(name) == value,
        why=f"this impl implements only {name}={value!r}", fix=lambda ns: alternative,
        violation={name: other}, shows=(name,))


def rounding_once(alternative: str) -> tuple[Invariant, ...]:
    """For the RMSNorm family's `rounding` (once / normed): this impl rounds once, at the store."""
    return (param_is("rounding", "once", alternative, other="normed"),)
