"""MoE router and dispatch (`oracle/moe_route.py`): the oracles against hand-worked rows and the
counting sort written out (a stable scatter by expert), the torch and MLX impls green on every
gate case, the dispatch properties, and the router mutants red."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gpu_impls
from cases.generate import Work, gate_cases
from cases.model import Case, make_inputs
from cases.moe_route import router
from gpu_impls.impl import Impl
from oracle.spec import get_op
from results.store import Store
from runners.correctness import check, run_impl
from verbs.cli import main

MUTANTS = str(Path(__file__).with_name("mutants.py"))

OPS = ("moe_router", "moe_dispatch", "moe_permute", "moe_unpermute", "moe_scatter_add")


def _route(logits, bias, k, scoring="sigmoid_bias", norm=1, scale=1.0, groups=1, topk_group=1):
    t, e = np.shape(logits)
    case = router(t, e, k, scoring, norm, scale, "f32", "test", groups=groups,
                  topk_group=topk_group)
    inputs = {"logits": np.asarray(logits, dtype=np.float32),
              "correction_bias": np.asarray(bias, dtype=np.float32)}
    return get_op("moe_router").oracle(inputs, case)


def _sig(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def test_sigmoid_bias_chooses_by_biased_and_weights_by_unbiased_scores():
    logits, bias = [[2.0, 1.0, 0.0, -1.0]], [-0.5, 0.0, 0.3, 0.0]
    out = _route(logits, bias, 2, norm=1, scale=2.5)
    # biased: 0.381, 0.731, 0.8, 0.269 -> experts 2 and 1
    assert out["ids"].tolist() == [[2.0, 1.0]]
    s = _sig([0.0, 1.0])
    assert np.allclose(out["weights"], 2.5 * s / (s.sum() + 1e-20), rtol=1e-15)


def test_ties_go_to_the_smaller_id_and_nan_never_wins():
    out = _route([[np.nan, 0.5, 0.5, -np.inf, 0.5]], [0.0] * 5, 3, norm=0)
    assert out["ids"].tolist() == [[1.0, 2.0, 4.0]]
    out = _route([[np.nan, 0.5, -np.inf, np.nan]], [0.0] * 4, 3, norm=0)
    assert out["ids"].tolist() == [[1.0, 2.0, 0.0]]  # -inf before any NaN


def test_dropped_groups_are_filled_with_minus_inf_not_zero():
    """Group 0 (experts 0, 1) wins; group 1's experts have s + bias < 0, so a 0-fill of the
    dropped groups would pick a dropped expert (2) over them; -inf keeps them."""
    logits = [[3.0, 3.0, -3.0, -3.0, 2.0, 2.0]]
    bias = [-1.0, -1.0, 0.0, 0.0, 0.0, 0.0]  # group scores: -0.10, 0.09, 1.76
    out = _route(logits, bias, 4, groups=3, topk_group=2, norm=0)
    # groups 2 (experts 4, 5) and 1 (experts 2, 3) are kept; group 0 is dropped
    assert sorted(out["ids"][0].tolist()) == [2.0, 3.0, 4.0, 5.0]


def test_softmax_weights_renormalise_over_the_chosen_k_only_when_asked():
    l = np.array([[1.0, 3.0, 2.0, 0.0]])
    p = np.exp(l - 3) / np.exp(l - 3).sum()
    plain = _route(l, [0.0] * 4, 2, scoring="softmax", norm=0)
    normed = _route(l, [0.0] * 4, 2, scoring="softmax_topk", norm=1)
    assert plain["ids"].tolist() == normed["ids"].tolist() == [[1.0, 2.0]]
    assert np.allclose(plain["weights"], p[:, [1, 2]], rtol=1e-15)
    assert np.allclose(normed["weights"], p[:, [1, 2]] / p[:, [1, 2]].sum(), rtol=1e-15)


def test_dispatch_is_the_counting_sort_of_math_md():
    """The stable counting-sort scatter written as its loop: pos = offsets[e_i] + fill[e_i]++."""
    case = Case.make("moe_dispatch", {"tokens": 7, "experts": 16, "top_k": 4}, "f32",
                     "hot_expert", seed=3)
    inputs = make_inputs(case)
    out = get_op("moe_dispatch").oracle(inputs, case)
    e = np.asarray(inputs["ids"]).astype(int).ravel()
    counts = np.zeros(16, int)
    for x in e:
        counts[x] += 1
    offsets = np.concatenate([[0], np.cumsum(counts)])
    fill, perm = np.zeros(16, int), np.zeros(e.size, int)
    for i, x in enumerate(e):
        perm[offsets[x] + fill[x]] = i
        fill[x] += 1
    assert out["counts"].tolist() == counts.tolist() and counts[16 // 3] == 7
    assert out["offsets"].tolist() == offsets.tolist()
    assert out["perm"].tolist() == perm.tolist()
    assert out["inv_perm"][perm].tolist() == list(range(e.size))


def _impl(impl_id):
    impl = gpu_impls.impls()[impl_id]
    ok, why = impl.available(gpu_impls.backend(impl.backend))
    if not ok:
        pytest.skip(why)
    return impl, gpu_impls.backend(impl.backend)


IMPLS = [f"{b}:{op}" for b in ("torch", "mlx") for op in OPS]


@pytest.mark.parametrize("impl_id", IMPLS)
def test_impls_pass_every_gate_case(impl_id):
    impl, backend = _impl(impl_id)
    failed = [(c.short(), row["message"]) for c in gate_cases(impl.op)
              if (row := check(Work(impl, c, "valid"), backend))["status"] != "pass"]
    assert not failed, failed[:3]


@pytest.mark.parametrize("backend_name", ["torch", "mlx"])
def test_dispatch_properties_and_the_round_trip(backend_name):
    """counts sum to T·k; each token's k experts appear once among the sorted slots, each in
    its expert's segment; permute then unpermute with unit weights and k = 1 is x bit for bit."""
    dispatch, backend = _impl(f"{backend_name}:moe_dispatch")
    for case in gate_cases("moe_dispatch"):
        inputs = make_inputs(case)
        out = {k: np.asarray(v) for k, v in run_impl(dispatch, backend, case, inputs).items()}
        t, k = case.dims["tokens"], case.dims["top_k"]
        e = np.asarray(inputs["ids"]).astype(int).ravel()
        assert out["counts"].sum() == t * k
        assert sorted(out["perm"].tolist()) == list(range(t * k))
        seg = np.repeat(np.arange(case.dims["experts"]), out["counts"])
        assert (e[out["perm"]] == seg).all()
    permute, _ = _impl(f"{backend_name}:moe_permute")
    unpermute, _ = _impl(f"{backend_name}:moe_unpermute")
    for dtype in ("f32", "f16", "bf16"):
        pc = Case.make("moe_permute", {"tokens": 7, "top_k": 1, "hidden": 64}, dtype, seed=1)
        pin = make_inputs(pc)
        xs = np.asarray(run_impl(permute, backend, pc, pin)["x_sorted"])
        uc = Case.make("moe_unpermute", {"tokens": 7, "top_k": 1, "hidden": 64}, dtype)
        inv = np.argsort(np.asarray(pin["perm"])).astype(np.int32)
        uin = {"y_sorted": xs, "weights": np.ones((7, 1), np.float32), "inv_perm": inv}
        back = np.asarray(run_impl(unpermute, backend, uc, uin)["out"])
        assert back.tobytes() == np.asarray(pin["x"]).tobytes()


# --- mutants: each a plausible router bug, red on the sigmoid_bias gate cases ---------------

def _mutant(bug):
    def run(launch, inputs, outputs, case):
        import torch

        l = inputs["logits"].float()
        s, b = torch.sigmoid(l), inputs["correction_bias"].float()
        k = case.dims["top_k"]
        if bug == "choose_unbiased":
            ids = torch.topk(s, k, dim=-1).indices
            w = s.gather(1, ids)
        elif bug == "weight_biased":
            ids = torch.topk(s + b, k, dim=-1).indices
            w = (s + b).gather(1, ids)
        else:  # "bias_after_topk": the bias added to the k unbiased winners' weights
            ids = torch.topk(s, k, dim=-1).indices
            w = (s + b).gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * float(case.params["routed_scaling_factor"])
        return {"ids": ids.to(torch.int32), "weights": w}

    return Impl("moe_router", "torch", f"mutant_{bug}", run)


@pytest.mark.parametrize("bug", ["choose_unbiased", "weight_biased", "bias_after_topk"])
def test_router_mutants_fail(bug):
    backend = gpu_impls.backend("torch")
    cases = [c for c in gate_cases("moe_router") if c.params["scoring"] == "sigmoid_bias"
             and c.dist == "normal" and c.dims["groups"] == 1]
    rows = [check(Work(_mutant(bug), c, "valid"), backend) for c in cases]
    assert any(r["status"] == "fail" for r in rows)
    assert rows[-1]["status"] == "fail", rows[-1]["message"]  # the Nemotron-shaped case


# --- the scatter-add: its declared order, and a shuffled (atomic) one caught by --repeat ------

def _declared_order(inputs, case) -> np.ndarray:
    """The declared accumulation as its loop: out = 0 in f32; for r in sorted order,
    out[perm[r] // k] += w.flat[perm[r]] * y_sorted[r] (f32 product, f32 add)."""
    t, k = case.dims["tokens"], case.dims["top_k"]
    y = np.asarray(inputs["y_sorted"]).astype(np.float32)
    w = np.asarray(inputs["weights"], dtype=np.float32).ravel()
    perm = np.asarray(inputs["perm"]).astype(int)
    out = np.zeros((t, y.shape[-1]), np.float32)
    for r in range(t * k):
        out[perm[r] // k] += w[perm[r]] * y[r]
    return out


@pytest.mark.parametrize("backend_name", ["torch", "mlx"])
def test_scatter_add_follows_its_declared_order_bit_for_bit(backend_name):
    """f32 outputs (no final rounding to hide the order) equal the declared loop's bits, on
    every f32 gate case; k = 4 makes the order matter (a sum in j order differs somewhere)."""
    impl, backend = _impl(f"{backend_name}:moe_scatter_add")
    cases = [c for c in gate_cases("moe_scatter_add") if c.dtype == "f32"]
    for case in cases:
        inputs = make_inputs(case)
        got = np.asarray(run_impl(impl, backend, case, inputs)["out"])
        assert got.tobytes() == _declared_order(inputs, case).tobytes(), case.short()
    case = next(c for c in cases if c.dims["top_k"] == 4)  # the j order: other bits
    inputs = make_inputs(case)
    terms = np.asarray(inputs["weights"], np.float32)[:, :, None] * np.asarray(
        inputs["y_sorted"], np.float32)[np.argsort(np.asarray(inputs["perm"]))].reshape(7, 4, -1)
    in_j_order = terms[:, 0] + terms[:, 1] + terms[:, 2] + terms[:, 3]
    assert in_j_order.tobytes() != _declared_order(inputs, case).tobytes()


def _scatter_check(store, impl, *extra):
    rc = main(["--store", str(store), "--plugin", MUTANTS, "check", "--impl", impl,
               "--op", "moe_scatter_add", "--dtype", "f32", "--isolate", "none", *extra])
    return rc, {r["case_id"]: r for r in Store(store).read("correctness").to_pylist()}


def test_a_shuffled_scatter_add_passes_one_run_and_fails_repeats(tmp_path):
    """The issue's mutant, an atomic (arrival-order) scatter-add declaring determinism: every
    run is inside the order-free bound, so one run passes; two runs differ in bits at k = 4
    and --repeat 2 fails it. The real impl passes --repeat 2."""
    bad = "torch:mutant_moe_scatter_add_shuffled"
    rc, rows = _scatter_check(tmp_path / "once", bad)
    assert rc == 0 and {r["status"] for r in rows.values()} == {"pass"}
    rc, rows = _scatter_check(tmp_path / "twice", bad, "--repeat", "2")
    assert rc == 1
    failed = [r for r in rows.values() if r["status"] == "fail"]
    # k = 2: 0 + a + b = 0 + b + a, any order the same bits; k = 4: not
    assert len(failed) == 1 and '"top_k": 4' in failed[0]["dims"]
    assert "nondeterministic: out differ" in failed[0]["message"]
    rc, rows = _scatter_check(tmp_path / "real", "torch:moe_scatter_add", "--repeat", "2")
    assert rc == 0 and {r["status"] for r in rows.values()} == {"pass"}
