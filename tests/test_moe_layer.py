"""The whole MoE layer against a dense reference (issue 31's property), composed from the
registered torch impls' run functions at a tiny shape (T 5, E 8, k 2, H 32, I 64):

    router (logits -> ids, ŵ) -> dispatch (ids -> offsets, perm, inv_perm)
    -> permute (x -> x_sorted) -> moe_experts (x_sorted -> ŷ) -> unpermute or scatter_add (ô)

The dense reference, float64 in NumPy: every expert applied to every token (with the experts'
declared rounding point, the activation rounded to T between the GEMMs: part of moe_experts'
contract), masked by the oracle's routing and weighted by its exact weights w:
dense[t] = Σ_e [e ∈ ids(t)] w[t, e] · expert_e(x[t]).

How the bound is composed (each stage judged on the previous stage's STORED outputs):
1. router: ids equal the oracle's exactly (no near-tie at these inputs: asserted),
   |ŵ - w| <= b_w per chosen weight (the op's own bound, `oracle.moe_route.chosen_weights`);
2. dispatch and permute: exact (their checks are exact; x_sorted = x[perm // k] so the experts'
   oracle on the stored x_sorted is each expert applied to its token's row of x);
3. experts: |ŷ - y| <= b_y, y the moe_experts oracle on the stored x_sorted and offsets, b_y its
   kernel-model bound there;
4. combine: |ô - Σ_j ŵ_j ŷ_j| <= b_c, the combine's bound on the stored (ŷ, ŵ).
End to end, from the exact identity ŵŷ - wy = (ŵ - w) ŷ + w (ŷ - y) and the triangle inequality:

    |ô - dense| <= b_c + Σ_j (b_w,j |ŷ_j| + |w_j| b_y,j) + 2^-40 Σ_j |w_j y_j|

the last term for the float64 evaluations of dense and of the stage oracles differing by their
summation order (H + I = 96 terms: under 2^-46 relative). Nothing in it is fitted.
A planted wiring error (each token's two weights swapped before the combine) passes every
per-stage check (each stage judged on what it was handed) and fails the end-to-end one.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpu_impls
from cases.generate import Work
from cases.model import Case, make_inputs
from cases.moe_route import router
from oracle.dtypes import round_to
from oracle.moe_gemm import activation
from oracle.moe_route import chosen_weights
from runners.correctness import check_op, oracle_for

T, E, K, H, I = 5, 8, 2, 32, 64
# act -> the router of the model family that uses it: (scoring, norm_topk_prob, scale)
# op -> its torch impl (the names as registered)
IMPLS = {"moe_router": "torch:moe_router", "moe_dispatch": "torch:moe_dispatch",
         "moe_permute": "torch:moe_permute", "moe_experts": "torch:experts_linear_loop",
         "moe_unpermute": "torch:moe_unpermute", "moe_scatter_add": "torch:moe_scatter_add"}
ROUTING = {"relu2": ("sigmoid_bias", 1, 2.5), "silu_mul": ("softmax_topk", 1, 1.0)}


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


class Layer:
    """The torch impls of the layer's stages, each run and judged on its predecessor's stored
    outputs; `bounds` and `exact` keep each stage's oracle there."""

    def __init__(self, act: str, dtype: str):
        self.every, self.be = gpu_impls.impls(), gpu_impls.backend("torch")
        self.act, self.dtype = act, dtype
        self.failures: list[str] = []

    def stage(self, op: str, case: Case, inputs: dict) -> tuple[dict, dict, dict]:
        """(stored outputs, exact, bounds) of torch:op on `inputs`; a failing check recorded."""
        impl = self.every[IMPLS[op]]
        out: dict = {}
        row = check_op(Work(impl, case, "valid"), self.be, inputs=inputs, keep=out)
        if row["status"] != "pass" or row["flags"]:
            self.failures.append(f"{op}: {row['status']} {row['flags']} {row['message']}")
        exact, _, bounds = oracle_for(impl, self.be, case, inputs, own_inputs=False)
        return {k: np.asarray(v) for k, v in out.items()}, exact, bounds

    def run(self, combine: str, plant: str = "") -> dict:
        scoring, norm, scale = ROUTING[self.act]
        rc = router(T, E, K, scoring, norm, scale, self.dtype, "test:layer")
        r, r_exact, r_bounds = self.stage("moe_router", rc, make_inputs(rc))
        w, b_w = chosen_weights(rc, r_exact["wscore"], r_bounds["weights"], r["ids"])
        dc = Case.make("moe_dispatch", {"tokens": T, "experts": E, "top_k": K}, "f32")
        d, _, _ = self.stage("moe_dispatch", dc, {"ids": r["ids"]})
        pc = Case.make("moe_permute", {"tokens": T, "top_k": K, "hidden": H}, self.dtype)
        x = make_inputs(pc)["x"]
        p, _, _ = self.stage("moe_permute", pc, {"x": x, "perm": d["perm"]})
        ec = Case.make("moe_experts", {"rows": T * K, "experts": E, "hidden": H, "inter": I},
                       self.dtype, params={"act": self.act})
        weights = {k: v for k, v in make_inputs(ec).items() if k in ("w_up", "w_down")}
        y, y_exact, y_bounds = self.stage(
            "moe_experts", ec, {"x": p["x_sorted"], **weights, "offsets": d["offsets"]})
        w_hat = r["weights"][:, ::-1].copy() if plant == "swap_weights" else r["weights"]
        cc = Case.make(combine, {"tokens": T, "top_k": K, "hidden": H}, self.dtype)
        index = {"moe_unpermute": ("inv_perm", d["inv_perm"]),
                 "moe_scatter_add": ("perm", d["perm"])}
        o, _, c_bounds = self.stage(combine, cc, {"y_sorted": y["y"], "weights": w_hat,
                                                  index[combine][0]: index[combine][1]})
        return {"router_exact": r_exact, "ids": r["ids"], "w": w, "b_w": b_w, "x": x,
                "weights": weights, "ec": ec, "inv_perm": d["inv_perm"], "y_hat": y["y"],
                "y": y_exact["y"], "b_y": y_bounds["y"], "out": o["out"], "b_c": c_bounds["out"]}


def dense_reference(s: dict) -> np.ndarray:
    """Every expert on every token in float64 (activation rounded to T, as declared), masked by
    the oracle's ids and weighted by its exact weights."""
    x, ec = _f64(s["x"]), s["ec"]
    oracle_ids = s["router_exact"]["ids"].astype(int)
    w_exact = s["router_exact"]["weights"]
    out = np.zeros((T, H))
    for e in range(E):
        a = round_to(activation(x @ _f64(s["weights"]["w_up"][e]).T, ec), ec.dtype)
        expert = _f64(a) @ _f64(s["weights"]["w_down"][e]).T
        mask = (oracle_ids == e) * w_exact  # [T, k]: w[t, j] where expert e is token t's j-th
        out += mask.sum(-1, keepdims=True) * expert
    return out


def end_to_end_bound(s: dict) -> np.ndarray:
    """b_c + Σ_j (b_w,j |ŷ_j| + |w_j| b_y,j) + 2^-40 Σ_j |w_j y_j| (the module docstring)."""
    pos = s["inv_perm"].astype(int).reshape(T, K)  # token t's j-th slot's sorted row
    y_hat, y, b_y = _f64(s["y_hat"])[pos], s["y"][pos], s["b_y"][pos]  # [T, k, H]
    w, b_w = s["w"][:, :, None], s["b_w"][:, :, None]
    return (s["b_c"] + (b_w * np.abs(y_hat) + np.abs(w) * b_y).sum(1)
            + 2.0 ** -40 * np.abs(w * y).sum(1))


@pytest.mark.parametrize("act", ["relu2", "silu_mul"])
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("combine", ["moe_unpermute", "moe_scatter_add"])
def test_the_layer_equals_the_dense_reference_within_the_composed_bound(act, dtype, combine):
    layer = Layer(act, dtype)
    s = layer.run(combine)
    assert not layer.failures, layer.failures
    assert np.array_equal(s["ids"], s["router_exact"]["ids"])  # the dense mask is the impl's
    err = np.abs(_f64(s["out"]) - dense_reference(s))
    bound = end_to_end_bound(s)
    assert (err <= bound).all(), f"worst {(err / bound).max():.3g} of the bound"


@pytest.mark.parametrize("combine", ["moe_unpermute", "moe_scatter_add"])
def test_swapped_weights_pass_every_stage_and_fail_end_to_end(combine):
    layer = Layer("relu2", "bf16")
    s = layer.run(combine, plant="swap_weights")
    assert not layer.failures, layer.failures  # each stage is right on what it was handed
    err = np.abs(_f64(s["out"]) - dense_reference(s))
    assert (err > end_to_end_bound(s)).any()
