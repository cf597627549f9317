"""`softcap` (Gemma 2's logit soft-capping, `oracle/softcap.py`): the op added without editing
any existing file (issue 51's worked example). Its own function (tanh) holds its declared ULPs
on the CPU backends here, the oracle keeps IEEE's limits, and the tolerance it derives fails the
mistakes a port makes: computing in T, the wrong cap, a hard clamp for tanh."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_impls
from cases.generate import Work, gate_cases
from cases.model import Case, make_inputs
from oracle.functions import function
from oracle.numerics import half_ulp32
from runners.correctness import check


def _tanh_points() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([rng.standard_normal(300_000) * 3, rng.uniform(-20, 20, 300_000),
                           10.0 ** rng.uniform(-37, 1, 100_000)
                           * rng.choice([-1, 1], 100_000)]).astype(np.float32)


def _ulps(got, x) -> float:
    exact = np.tanh(x.astype(np.float64))
    return float((np.abs(np.asarray(got, dtype=np.float64) - exact)
                  / (2 * half_ulp32(np.abs(exact)))).max())


def test_torch_tanh_holds_its_declared_ulps():
    torch = pytest.importorskip("torch")
    x = _tanh_points()
    assert _ulps(torch.tanh(torch.from_numpy(x)).numpy(), x) <= function("tanh").ulps_on("torch")


@pytest.mark.mlx
def test_mlx_tanh_holds_its_declared_ulps():
    mx = pytest.importorskip("mlx.core")
    x = _tanh_points()
    measured = _ulps(np.array(mx.tanh(mx.array(x))), x)
    assert 1.0 < measured <= function("tanh").ulps_on("mlx")  # more than torch's: charged more


def test_a_backend_is_charged_its_own_tanh_ulps():
    from oracle.numerics import Numerics

    assert Numerics().on("mlx").ulps["tanh"] == 4.0 and Numerics().on("cuda").ulps["tanh"] == 2.0


def test_the_oracle_saturates_at_the_cap_and_keeps_nan():
    case = Case.make("softcap", {"rows": 1, "n": 4}, "f32", params={"cap": 30.0})
    x = np.array([[np.inf, -np.inf, np.nan, 1e30]], dtype=np.float32)
    out = case.spec.reference({"x": x}, case)[0]["out"]
    assert out[0, 0] == 30.0 and out[0, 1] == -30.0 and np.isnan(out[0, 2])
    assert out[0, 3] == 30.0


@pytest.mark.parametrize("cap", [0.0, float("inf"), -1.0, 1e39])
def test_a_cap_outside_f32s_positive_range_is_refused_naming_the_fix(cap):
    case = Case.make("softcap", {"rows": 1, "n": 4}, "f32", params={"cap": cap})
    with pytest.raises(ValueError, match="finite number > 0 in f32.*Gemma 2: 30.0"):
        case.spec.domain_error(case) and case.spec.domain(case)


def _wrong(name: str, body):
    """A torch impl of softcap that makes one mistake (not registered)."""
    from gpu_impls.impl import Impl

    def run(launch, inputs, outputs, case):
        import torch

        x = inputs["x"]
        return {"out": body(torch, x, float(np.float32(case.params["cap"]))).to(x.dtype)}
    return Impl("softcap", "torch", name, run)


MISTAKES = {
    # HF's Gemma 2 code on bf16 logits: the divide, tanh and product in T
    "in_t": lambda torch, x, c: torch.tanh(x / c) * c,
    "wrong_cap": lambda torch, x, c: torch.tanh(x.float() / 50.0) * 50.0,
    "hard_clamp": lambda torch, x, c: (x.float() / c).clamp(-1, 1) * c,
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_each_mistake_fails_a_gate_case(mistake):
    """Over the gate's bf16 cases with cap 30, the mistaken impl fails at least one, while
    torch:softcap passes them all."""
    pytest.importorskip("torch")
    bad = _wrong(mistake, MISTAKES[mistake])
    good = gpu_impls.impls()["torch:softcap"]
    cases = [c for c in gate_cases("softcap") if c.dtype == "bf16" and c.params["cap"] == 30.0
             and c.dims["n"] <= 4096]
    assert cases
    backend = gpu_impls.backend("torch")
    assert all(check(Work(good, c, "valid"), backend)["status"] == "pass" for c in cases)
    statuses = {check(Work(bad, c, "valid"), backend)["status"] for c in cases}
    assert "fail" in statuses, f"{mistake}: {statuses}"


def test_the_inputs_reach_tanhs_bend_and_saturation():
    case = next(c for c in gate_cases("softcap") if c.dist == "normal" and c.dtype == "f32"
                and c.params["cap"] == 30.0)
    scaled = np.abs(make_inputs(case)["x"].astype(np.float64)) / 30.0
    assert (scaled < 0.5).mean() > 0.2 and (scaled > 2.0).mean() > 0.02
