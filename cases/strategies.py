"""Hypothesis strategies drawing valid cases per impl, and the `ci` / `nightly` profiles.

`valid_case(impl)` draws an op's dims from wide ranges biased to contract-friendly values
(multiples of 32), a dtype, a distribution and a seed, and keeps only cases the impl's contract
admits and that lie in the op's domain (`OpSpec.domain`: e.g. the sequences fit the cache); the
op's params are taken from its gate cases (so conventions like `rounding` match).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cases.distributions import DISTRIBUTIONS
from cases.model import Case

settings.register_profile("ci", max_examples=20, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.filter_too_much,
                                                 HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.filter_too_much,
                                                 HealthCheck.too_slow])

# Upper bounds per dim name keep drawn cases cheap on a CPU oracle.
DIM_MAX = {"rows": 9, "n": 9000, "batch": 2, "tokens": 3, "heads": 8, "head_dim": 600,
           "out": 40, "in": 2048, "kv_heads": 8, "heads_q": 8, "heads_kv": 8, "max_len": 256,
           "max_pages": 8, "num_pages": 24,
           # GDN: the chunked stages' interval models cost heads x chunk x K x V per token
           "heads_k": 4, "heads_v": 8, "dim_k": 64, "dim_v": 32,
           # Mamba-2's conv (widths 2-6); its gated norm's groups (dividing its dim) and the
           # scans' (dividing the heads); the scans' interval models cost T x H x P x N
           "width": 6, "groups": 4, "dim_p": 16, "dim_n": 32}
# Dims that are layout choices, drawn from the values a layout has (plus one that no layout has,
# so contracts still see invalid ones).
DIM_CHOICES = {"bits": (2, 3, 4, 5, 6, 8, 7), "group_size": (32, 64, 128, 48),
               "page_size": (16, 32, 64, 8)}


def _dim(name: str):
    if name in DIM_CHOICES:
        return st.sampled_from(DIM_CHOICES[name])
    hi = DIM_MAX.get(name, 64)
    if hi < 32:  # no multiple of 32 within the cap (heads: 32 of them made attention cases 4x)
        return st.integers(1, hi)
    aligned = st.integers(1, hi // 32).map(lambda k: 32 * k)
    return st.one_of(aligned, st.integers(1, hi))


class _Named:
    """An impl as a strategy argument: hypothesis prints each drawn strategy's arguments (its
    repr of a whole Impl, contract and all, cost 9 s over one file's fuzz tests); its id says
    the same."""

    def __init__(self, impl):
        self.impl = impl

    def __repr__(self) -> str:
        return self.impl.id


# impl id -> (the impl, its strategy): a test that draws inside its body (`st.data()`) asks
# for the strategy once per example
_STRATEGIES: dict[str, tuple[object, st.SearchStrategy]] = {}


def valid_case(impl) -> st.SearchStrategy:
    """Cases the impl's contract admits, in its op's domain, with the params of one of its gate
    cases. The gate cases are read once per impl, not once per draw."""
    from cases.generate import valid_cases

    held = _STRATEGIES.get(impl.id)
    if held is None or held[0] is not impl:
        known = valid_cases(impl)
        params = tuple(sorted({c.param_items for c in known}))
        spec_dims = known[0].spec.dims if known else ()
        held = _STRATEGIES[impl.id] = impl, _valid_case(_Named(impl), params, tuple(spec_dims))
    return held[1]


@st.composite
def _valid_case(draw, named, params, spec_dims):
    from hypothesis import assume

    impl = named.impl
    chosen = draw(st.sampled_from(params)) if params else ()
    dims = {d: draw(_dim(d)) for d in spec_dims}
    case = Case.make(impl.op, dims, draw(st.sampled_from(impl.contract.dtypes)),
                     draw(st.sampled_from(DISTRIBUTIONS)), draw(st.integers(0, 2**16)),
                     dict(chosen), label="fuzz")
    assume(not case.spec.domain_error(case))  # dims and params that agree (`OpSpec.domain`)
    assume(impl.contract.admits(case))
    return case
