"""The functions every kernel model may call: exp, log, rsqrt, sin and cos, declared as an op
declares its own (`oracle/functions.py`). Their ULPs are `FUNCTION_ULPS`'s; a backend's own are
`BACKEND_ULPS`'s (`Numerics.on`, `oracle/float_model.py`).
"""

from __future__ import annotations

import numpy as np

from oracle.adverse import Adverse
from oracle.float_model import FUNCTION_ULPS, MAX32
from oracle.functions import Function, register_function
from oracle.intervals import Val, finite_errors


def _rsqrt_interval(a: Val) -> Val:
    """1/sqrt(a): decreasing, so the worst input is the interval's low end. An input past
    f32's range is inf in the kernel (a sum of squares of |x| > 1.8e19), and rsqrt(inf) = 0:
    the result may be anything from 0 up."""
    v = 1.0 / np.sqrt(a.v)
    low = a.v - a.e
    e = np.where(low > 0, 1.0 / np.sqrt(np.where(low > 0, low, 1.0)) - v, np.inf)
    e = np.where(a.v + a.e > MAX32, np.maximum(e, v), e)
    return finite_errors(Val(v, np.where(a.v == np.inf, 0.0, e + a.m.func("rsqrt", v + e)), a.m))


def _trig_interval(a: Val, f, other, name: str) -> Val:
    """f(a) for f = sin or cos (`other` the other one): the operand's error through Taylor's
    bound |f(a + d) - f(a)| <= |other(a)| |d| + d^2 / 2, at most |d| (1-Lipschitz); then f's
    ULPs of 1. A point 0 is exact (sin 0 = 0, cos 0 = 1 everywhere)."""
    v = f(a.v)
    e = np.minimum(a.e, np.abs(other(a.v)) * a.e + a.e * a.e / 2)
    e = e + a.m.func(name, np.maximum(np.abs(v) + e, 1.0))
    return finite_errors(Val(v, np.where((a.v == 0) & (a.e == 0), 0.0, e), a.m))


def _trig_adverse(k: Adverse, f, name: str) -> Adverse:
    v = f(k.x)
    return k.rounded(v, np.where(k.x == 0, 0.0, k.m.func(name, np.maximum(np.abs(v), 1.0))))


def _sin_interval(a: Val) -> Val:
    return _trig_interval(a, np.sin, np.cos, "sin")


def _cos_interval(a: Val) -> Val:
    return _trig_interval(a, np.cos, np.sin, "cos")


def _sin_adverse(k: Adverse) -> Adverse:
    return _trig_adverse(k, np.sin, "sin")


def _cos_adverse(k: Adverse) -> Adverse:
    return _trig_adverse(k, np.cos, "cos")


def _rsqrt(x):
    return 1.0 / np.sqrt(x)


# exp: increasing and convex (its image's high end is the worst); a backend's exp may return
# inf before f32's range ends (`BACKEND_OVERFLOWS`). log: increasing and concave, on (0, inf).
register_function(Function("exp", np.exp, FUNCTION_ULPS["exp"]))
register_function(Function("log", np.log, FUNCTION_ULPS["log"], domain=(0.0, np.inf)))
register_function(Function("rsqrt", _rsqrt, FUNCTION_ULPS["rsqrt"], "decreasing",
                           domain=(0.0, np.inf), interval=_rsqrt_interval))
register_function(Function("sin", np.sin, FUNCTION_ULPS["sin"], "custom",
                           interval=_sin_interval, adverse=_sin_adverse))
register_function(Function("cos", np.cos, FUNCTION_ULPS["cos"], "custom",
                           interval=_cos_interval, adverse=_cos_adverse))
