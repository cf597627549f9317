"""Issue 34's four examples, pinned through the real registered impls (torch CPU, MLX CPU).

What each one found wrong before issue 34's fixes (c1b8a90, e56ea74):

1. bf16 rounding: `round_to` went float64 -> f32 -> bf16 and double-rounded 1 + 2^-8 + 2^-30 to
   1.0 instead of 1.0078125.
2. "normed" rms_norm at a binade edge: the bound charged a flipped T(x·inv) one ULP of x·inv
   times |w|, but the flipped product crosses a power of two where the store's ULP doubles
   (seed 11, oracle v1 data: mlx:fast_rms_norm out -1.0078125 vs oracle -0.999755859, budget 1.29).
3. Subnormal intermediates: the 2^-150 slack was scaled by inv (0.0115 here), so the rounding
   of the subnormal x·inv, then times w = 1.7, went uncharged (torch:rms_norm 3.19958478e-41 vs
   exact 3.19975547e-41 at x = 1.63e-39: budget 2.28).
4. GEMV sequential sum: the bound assumed >= 4 partial sums, (in/4) u; MLX CPU sums in index
   order, up to (in/2) u on same-sign terms: it held only because the roundings partly cancel
   (budget 0.80 on oracle v1 data).

Each test prints the case (id, json), the numbers and the repro command when it fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from cases.generate import Work
from cases.model import Case, make_inputs
from gpu_impls import backend, impls
from oracle.dtypes import round_to
from oracle.metrics import compare
from oracle.norms import inv_kernel, kernel_view
from oracle.numerics import SEQUENTIAL, Bounds, Model, Numerics, Val, store_bound
from runners.correctness import check, launch_impl
from runners.verdicts import repro_command


def _where(impl_id: str, case: Case) -> str:
    return f"case {case.id} {case.to_json()}\n    repro: {repro_command(impl_id, case.id)}"


def _on_inputs(impl_id: str, backend_name: str, case: Case, inputs: dict,
               numerics: Numerics | None = None) -> tuple[dict, dict, dict, dict]:
    """`check`'s steps on explicit inputs: (outputs, exact, bounds, metrics per output).
    `numerics`: the bound for this declaration instead of the impl's own."""
    impl, spec = impls()[impl_id], case.spec
    exact, ref = spec.reference(inputs, case)
    bounds = spec.bounds(inputs, exact, case, numerics or impl.numerics)
    out, defects = launch_impl(impl, backend(backend_name), case, inputs)
    assert not defects, f"{impl_id}: {defects}\n{_where(impl_id, case)}"
    metrics = {t.name: compare(out[t.name], ref[t.name], exact[t.name], bounds[t.name],
                               t.dtype(case), spec.inf_may_be_nan)
               for t in spec.outputs}
    return out, exact, bounds, metrics


def _report(impl_id: str, case: Case, m: dict, inputs_note: str = "") -> str:
    return (f"{impl_id}: budget {m['budget']:.6g} at [{m['worst_index']}]: out "
            f"{m['worst_out']:.9g}, exact {m['worst_exact']:.9g}, bound {m['worst_bound']:.6g}, "
            f"{m['nonfinite_mismatch']} NaN/Inf mismatches{inputs_note}\n{_where(impl_id, case)}")


# --- 1. bf16 rounding -------------------------------------------------------------------------

def test_bf16_rounds_in_one_step():
    assert float(round_to(1 + 2 ** -8 + 2 ** -30, "bf16")) == 1.0078125  # tests/test_rounding.py


# --- 2. "normed" rms_norm at a binade edge ----------------------------------------------------

SEED_11 = Case.make("rms_norm", {"rows": 7, "n": 4096}, "bf16", "normal", seed=11,
                    params={"eps": 1e-06, "rounding": "normed"})


def test_mlx_fast_rms_norm_seed_11_passes():
    pytest.importorskip("mlx.core")
    impl = impls()["mlx:fast_rms_norm"]
    row = check(Work(impl, SEED_11, "valid"), backend("mlx"))
    assert row["status"] == "pass", (f"{row['status']}: {row['message']} (budget {row['budget']})"
                                     f"\n{_where(impl.id, SEED_11)}")


def _inv_relative_error() -> float:
    """The any-order model's relative error bound on inv over SEED_11's rows (n = 4096): how far
    a kernel's f32 x·inv may sit from the exact one, beyond its own rounding."""
    model = Model()
    x = Bounds(model).load(kernel_view(make_inputs(SEED_11), SEED_11)["x"])
    inv = inv_kernel(Bounds(model), x, SEED_11)
    return float(np.max(inv.e / inv.v))


# (x·inv, w): issue 34's binade-edge elements (w rounded to bf16), and seed 11's failing element
# under the oracle v1 data. -4.38017683e-16 is exactly a bf16 midpoint in f32 (252.5 ULPs of
# bf16), so an f32 kernel ties to the even neighbour, the other one from the exact value's.
BINADE_EDGES = [(-4.38017683e-16, 1.01587), (-0.000925017308, 1.05762),
                (-0.9160150453940223, 1.09375)]


@pytest.mark.parametrize("xinv, w", BINADE_EDGES)
def test_normed_binade_edge_within_store_bound(xinv, w):
    """T(T(x·inv)·w) against the exact T(x·inv)·w, for x·inv exact, with one f32 rounding, and
    with the any-order model's inv error at n = 4096: the correctly rounded answer, and every
    answer a kernel whose x·inv lands anywhere in the interval can store, within store_bound."""
    model = Model()
    w_t = Val.exact(round_to(np.float64(w), "bf16").astype(np.float64), model)
    one = Val.exact(1.0, model)
    rel = _inv_relative_error()
    kernels = {"exact": Val.exact(xinv, model),
               "one f32 rounding": Val.exact(xinv, model) * one,
               f"inv within {rel:.3g} relative": Val.exact(xinv, model) * Val(1.0, rel, model)}
    failures = []
    for label, normed in kernels.items():
        y = normed.round_to("bf16") * w_t
        bound = float(store_bound(y, "bf16"))
        exact = float(y.v)
        lo, hi = (float(round_to(normed.v + s * normed.e, "bf16")) for s in (-1, 1))
        answers = {"correctly rounded": float(round_to(exact, "bf16"))}
        answers.update({f"x·inv to {n!r}": float(round_to(n * float(w_t.v), "bf16"))
                        for n in {lo, hi}})
        for name, out in answers.items():
            budget = abs(out - exact) / bound
            print(f"x·inv {xinv!r} ({label}, e {float(normed.e):.3g}), w {float(w_t.v)}: {name} "
                  f"{out!r}, exact {exact!r}, bound {bound:.6g}, budget {budget:.4f}")
            if not budget <= 1.0:
                failures.append(f"{label}: {name} {out!r} vs exact {exact!r}: bound {bound:.6g}"
                                f", budget {budget:.4f}")
    assert not failures, f"x·inv {xinv!r}, w {w}:\n" + "\n".join(failures)


def test_binade_edge_midpoint_is_straddled():
    """The first edge is the one the docstring claims: its f32 value is a bf16 midpoint, and
    the two neighbours' products round to one output, 2^-51."""
    xinv, w = BINADE_EDGES[0]
    q = 2.0 ** -59  # bf16's spacing in [2^-52, 2^-51)
    assert float(np.float32(xinv)) / q == -252.5
    assert float(round_to(xinv, "bf16")) == -253 * q
    w_t = float(round_to(np.float64(w), "bf16"))
    for n in (252, 253):
        assert float(round_to(-n * q * w_t, "bf16")) == -2.0 ** -51


# --- 3. subnormal intermediates ---------------------------------------------------------------

SUBNORMAL = Case.make("rms_norm", {"rows": 1, "n": 4}, "f32", "normal",
                      params={"eps": 1e-6, "rounding": "once"})
SUBNORMAL_INPUTS = {"x": np.array([[100, 100, 100, 1.6344787e-39]], dtype=np.float32),
                    "w": np.full(4, 1.6953843, dtype=np.float32)}


def test_torch_rms_norm_subnormal_intermediates():
    pytest.importorskip("torch")
    impl_id = "torch:rms_norm"
    out, exact, bounds, metrics = _on_inputs(impl_id, "torch", SUBNORMAL, SUBNORMAL_INPUTS)
    m = metrics["out"]
    note = f" (explicit inputs x = {SUBNORMAL_INPUTS['x'].tolist()}, w = 1.6953843: the repro " \
           f"draws the case's own)"
    print(_report(impl_id, SUBNORMAL, m, note))
    assert m["budget"] <= 1.0 and m["nonfinite_mismatch"] == 0, _report(impl_id, SUBNORMAL, m,
                                                                         note)
    # the subnormal element errs (torch 3.19958478e-41, exact 3.19975547e-41) ...
    assert out["out"][0, 3] != np.float32(exact["out"][0, 3])
    # ... and its bound charges the subnormal roundings: more than one, amplified by w
    assert float(bounds["out"][0, 3]) > 2.0 ** -150 * 1.6953843, float(bounds["out"][0, 3])


# --- 4. GEMV sequential sum -------------------------------------------------------------------

SAME_SIGN = Case.make("dequant_gemv", {"out": 33, "in": 1536, "bits": 2, "group_size": 128},
                      "f32", "normal")


def _same_sign_inputs() -> dict:
    """Every code at its maximum (3), positive scales and biases, x = 1/sqrt(in): every term of
    every sum has one sign and one size, a sequential sum's worst case."""
    inputs = make_inputs(SAME_SIGN)
    n = SAME_SIGN.dims["in"]
    return {"w": np.full_like(inputs["w"], 0xFFFFFFFF),
            "scales": np.abs(inputs["scales"]), "biases": np.abs(inputs["biases"]),
            "x": np.full_like(inputs["x"], 1.0 / np.sqrt(n))}


@pytest.mark.parametrize("impl_id, backend_name, mod", [
    ("mlx:quantized_matmul", "mlx", "mlx.core"),
    ("torch:dequant_linear", "torch", "torch")])
def test_gemv_same_sign_sum(impl_id, backend_name, mod):
    pytest.importorskip(mod)
    inputs = _same_sign_inputs()
    note = " (explicit same-sign inputs: the repro draws the case's own)"
    declared = {str(impls()[impl_id].numerics): None}
    if impl_id.startswith("mlx:") and backend(backend_name).device().startswith("cpu"):
        declared["reduction=sequential (MLX CPU's order)"] = Numerics(SEQUENTIAL)
    for label, numerics in declared.items():
        _, _, _, metrics = _on_inputs(impl_id, backend_name, SAME_SIGN, inputs, numerics)
        m = metrics["out"]
        print(f"[{label}] " + _report(impl_id, SAME_SIGN, m, note))
        assert m["budget"] <= 1.0 and m["nonfinite_mismatch"] == 0, \
            f"[{label}] " + _report(impl_id, SAME_SIGN, m, note)
