"""The open function vocabulary (`oracle/functions.py`, issue 51 item 3): a function declared
outside `oracle/numerics.py` is bounded by `Val.call` and emulated by `Adverse.call`, its bound
holds for a real f32 implementation and bites where a term is shrunk, and bad declarations are
refused naming the fix."""

from __future__ import annotations

import numpy as np
import pytest

from oracle.functions import FUNCTIONS, Function, function, register_function
from oracle.numerics import DEFAULT, Adverse, Choices, Model, Numerics, Val

# numpy's float32 tanh: at most 1.37 ULP from the exact value over 10^6 normal points (x 4)
TANH = Function("t_tanh", np.tanh, ulps=2.0, shape="increasing")
RECIP = Function("t_recip", lambda x: 1.0 / x, ulps=0.5, shape="decreasing",
                 domain=(0.0, np.inf))


@pytest.fixture
def declared():
    """TANH and RECIP registered for one test (a plugin's own module would register them at
    import), then removed."""
    for f in (TANH, RECIP):
        register_function(f)
    yield
    for f in (TANH, RECIP):
        FUNCTIONS.pop(f.name, None)


def _intervals(n=4000, seed=0):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(n) * 3.0
    e = np.abs(v) * 10.0 ** rng.uniform(-8, -3, n)
    return v, e


def test_a_declared_function_bounds_every_f32_result_from_its_interval(declared):
    """Every f32 input within [v - e, v + e] (the ends included), through numpy's f32 tanh,
    lands within the bound of tanh(v)."""
    v, e = _intervals()
    out = Val(v, e, Model()).call("t_tanh")
    assert np.allclose(out.v, np.tanh(v), rtol=0, atol=0)
    for t in np.linspace(-1.0, 1.0, 9):
        x = (v + t * e).astype(np.float32)
        x = np.clip(x, np.nextafter((v - e).astype(np.float32), np.float32(np.inf)),
                    np.nextafter((v + e).astype(np.float32), np.float32(-np.inf)))
        inside = (x >= v - e) & (x <= v + e)
        got = np.tanh(x).astype(np.float64)
        assert np.all(np.abs(got - out.v)[inside] <= out.e[inside])


def test_each_term_of_a_declared_functions_bound_is_needed(declared):
    """The monotone image alone (no ULPs) fails the f32 results at exact inputs; the ULPs
    alone fail a kernel whose input sits at the interval's end: both terms bite."""
    x = np.random.default_rng(1).standard_normal(20000).astype(np.float32).astype(np.float64)
    exact_in = Val(x, np.zeros_like(x), Model()).call("t_tanh")
    got = np.tanh(x.astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(got - exact_in.v) <= exact_in.e)
    assert np.any(np.abs(got - exact_in.v) > 0.3 * exact_in.e)  # the ULPs are used
    v, e = _intervals(seed=2)
    out = Val(v, e, Model(shrink={"func": 0.0})).call("t_tanh")
    end = np.tanh(v + e)
    assert np.all(np.abs(end - out.v) <= out.e * (1 + 1e-12))
    assert np.all(np.abs(end - out.v) > 0.9 * out.e)  # the image's end is attained


def test_a_decreasing_function_maps_the_low_end_and_leaves_its_domain_unbounded(declared):
    v = np.array([2.0, 0.5, 1e-3])
    e = np.array([0.5, 0.5, 1e-3])
    out = Val(v, e, Model()).call("t_recip")
    assert out.e[0] >= 1 / 1.5 - 0.5 and out.e[0] < 1 / 1.5 - 0.5 + 1e-6
    assert out.e[1] == np.inf and out.e[2] == np.inf  # the interval reaches 0


def test_the_emulated_kernel_stays_within_the_bound_in_every_direction(declared):
    v, e = _intervals(seed=3)
    bound = Val(v, e, Model()).call("t_tanh")
    for flips in ((), (0,)):
        kernel = Adverse(v + e, Model(), Choices(flips)).call("t_tanh")
        # float64's own noise in v + err against e + err: F64_SLACK's order, relative to v
        assert np.all(np.abs(kernel.x - bound.v) <= bound.e + 2.0 ** -40 * np.abs(bound.v))
        assert np.any(np.abs(kernel.x - bound.v) > 0.99 * bound.e)


def test_a_backend_reads_a_declared_functions_own_ulps(declared):
    register_function(Function("t_slow", np.tanh, ulps=2.0, backend_ulps={"mlx": 64.0}))
    try:
        assert Numerics().on("mlx").ulps["t_slow"] == 64.0
        assert Numerics().on("cuda").ulps["t_slow"] == 2.0
        assert Numerics().on("mlx").ulps["exp"] == 96.0  # the built-in table stays first
        one = Val(np.array([0.5]), np.zeros(1), Model(numerics=Numerics().on("mlx")))
        assert one.call("t_slow").e[0] == pytest.approx(
            32 * Val(np.array([0.5]), np.zeros(1), Model(numerics=DEFAULT)).call("t_slow").e[0])
    finally:
        FUNCTIONS.pop("t_slow", None)


def test_the_builtins_are_declarations_too():
    assert {"exp", "log", "rsqrt", "sin", "cos"} <= set(FUNCTIONS)
    v = np.array([0.5, 2.0]), np.array([1e-6, 1e-6])
    for name in ("exp", "log", "rsqrt", "sin", "cos"):
        a = Val(*v, Model())
        assert np.array_equal(getattr(a, name)().e, a.call(name).e)


@pytest.mark.parametrize("kwargs, says", [
    (dict(name="bad name", exact=np.tanh, ulps=1.0), "a Python identifier"),
    (dict(name="f", exact=np.tanh, ulps=1.0, shape="convex"), "one of increasing"),
    (dict(name="f", exact=np.tanh, ulps=1.0, shape="custom"), "needs an `interval` form"),
    (dict(name="f", exact=np.tanh, ulps=-1.0), "a number >= 0"),
    (dict(name="f", exact=np.tanh, ulps=1.0, domain=(1.0, 0.0)), "low < high"),
])
def test_a_bad_declaration_is_refused_naming_the_fix(kwargs, says):
    with pytest.raises(ValueError, match=says):
        Function(**kwargs)


def test_a_name_taken_differently_is_refused_and_an_unknown_one_names_the_known(declared):
    register_function(TANH)  # the same declaration again: a module imported twice
    with pytest.raises(ValueError, match="registered already"):
        register_function(Function("t_tanh", np.tanh, ulps=1.0))
    with pytest.raises(KeyError, match="known: .*exp.*register_function"):
        function("t_nope")
