"""RoPE (`oracle/rope.py`): the oracle's closed forms, the tables the impls compute against the
ULPs they declare, the bound's tightness at 128k, and the rotation's properties on the torch
and MLX impls (CPU): rotating by p then by q is rotating by p + q, and each pair keeps its norm,
within the bounds.

Tightness (f32, positions 131008..131071, llama-3.1-8b's table, pairs 1..7, where the angle's
error dominates; seed 0): the worst element uses 0.71 of its bound on torch:rope_polar (a
float64 table rounded once, declared 0.5 ULP; bound up to 0.03 there, the actual error up to
0.02) and 0.35 on torch:rope_hf (HF's f32 table held to the default 2 (1 + |ln inv|) ULPs,
~0.5-1 ULP actual; bound up to 0.10); qwen3-8b's table: 0.85 and 0.35.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpu_impls
from cases.model import Case, make_inputs
from cases.rope import DECODE, model_dims, model_params
from oracle.numerics import Model, half_ulp32, table_error
from oracle.rope import _halves, _join, inv_freq
from runners.correctness import run_impl

DIMS = {"heads_q": 4, "heads_kv": 2, "head_dim": 64}
F32_IMPLS = ("torch:rope_polar", "mlx:fast_rope_f32")
T_IMPLS = ("torch:rope_hf", "mlx:fast_rope")
SCALED = ("llama-3.1-8b", "llama-3.2-1b", "gpt-oss-20b")


def _case(positions, dtype="f32", compute="f32", seed=0, dims=DIMS, **params) -> Case:
    return Case.make("rope", dims, dtype, "normal", seed,
                     params={"theta": 500000.0, "compute": compute,
                             "positions": tuple(positions), **params})


def _impl(impl_id: str):
    impl = gpu_impls.impls()[impl_id]
    ok, why = impl.available(gpu_impls.backend(impl.backend))
    if not ok:
        pytest.skip(why)
    return impl


def _run(impl, case, inputs) -> tuple[dict, dict, dict]:
    """(impl outputs, exact outputs, bounds) in float64."""
    exact = case.spec.reference(inputs, case)[0]
    bounds = case.spec.bounds(inputs, exact, case, impl.numerics_for(case))
    out = run_impl(impl, gpu_impls.backend(impl.backend), case, inputs)
    return {k: v.astype(np.float64) for k, v in out.items()}, exact, bounds


def _pair_norms(a: np.ndarray, case) -> np.ndarray:
    """Each element's pair norm sqrt(a1^2 + a2^2), in the pairing's layout (the tail: |a|)."""
    a1, a2, rest = _halves(a, case)
    n = np.sqrt(a1 * a1 + a2 * a2)
    return _join(np.concatenate, n, n, np.abs(rest), case)


# --- the oracle ----------------------------------------------------------------------------------

def test_position_zero_is_the_identity_and_pairings_are_one_permutation():
    case = _case((0, 5, 131071), rotary_dim=48)
    inputs = make_inputs(case)
    out = case.spec.reference(inputs, case)[0]
    x = inputs["q"].astype(np.float64)
    assert np.array_equal(out["q_out"][0], x[0])
    assert np.array_equal(out["q_out"][:, :, 48:], x[:, :, 48:])  # the unrotated tail
    # interleaved pairs (2i, 2i+1) are rotate-half's (i, i+24) after a permutation of the head
    perm = np.concatenate([np.stack([np.arange(24), np.arange(24, 48)], -1).ravel(),
                           np.arange(48, 64)])
    gptj = case.replace(pairing="gptj")
    moved = {**inputs, "q": inputs["q"][..., perm], "k": inputs["k"][..., perm]}
    assert np.array_equal(gptj.spec.reference(moved, gptj)[0]["q_out"], out["q_out"][..., perm])


def test_scaled_tables_keep_their_bands():
    """llama3: the high band unchanged, the low band divided by factor, the smooth band
    between; YaRN: extrapolated below `low`, interpolated above `high`."""
    llama = _case(DECODE, dims={"heads_q": 1, "heads_kv": 1, "head_dim": 128},
                  **model_params("llama-3.1-8b"))
    plain = 500000.0 ** (-np.arange(64) / 64)
    wavelen = 2 * math.pi / plain
    got = inv_freq(llama)
    assert np.array_equal(got[wavelen < 2048], plain[wavelen < 2048])
    assert np.allclose(got[wavelen > 8192], plain[wavelen > 8192] / 8, rtol=1e-15)
    mid = (wavelen >= 2048) & (wavelen <= 8192)
    assert mid.sum() >= 4 and ((got[mid] < plain[mid]) & (got[mid] > plain[mid] / 8)).all()
    yarn = _case(DECODE, dims={"heads_q": 1, "heads_kv": 1, "head_dim": 64},
                 **model_params("gpt-oss-20b"))
    plain = 150000.0 ** (-np.arange(32) / 32)
    got = inv_freq(yarn)
    assert np.allclose(got[:8], plain[:8], rtol=1e-15) and np.allclose(got[-6:], plain[-6:] / 32)


# --- the tables the impls compute ----------------------------------------------------------------

def _table_ulps(table: np.ndarray, exact: np.ndarray, impl_id: str) -> float:
    """The table's error as a share of what its impl declares (<= 1: within)."""
    impl = gpu_impls.impls()[impl_id]
    model = Model(numerics=impl.numerics.on(impl.backend))
    allowed = table_error(model, "inv_freq", exact, 1.0 + np.abs(np.log(exact)))
    err = np.abs(np.asarray(table, dtype=np.float64) - exact)
    return float(np.max(np.where(err == 0, 0.0, err / np.where(allowed > 0, allowed, 1e-300))))


def _table_cases() -> list[Case]:
    """A plain table per theta x rotary dim (96: an inexact exponent 2i/R), and the models'."""
    plain = [_case(DECODE, dims={"heads_q": 1, "heads_kv": 1, "head_dim": d}, theta=theta)
             for theta in (1e4, 1.5e5, 5e5, 1e6, 1e7, 1e8) for d in (32, 64, 96, 128, 256)]
    models = [_case(DECODE, dims=model_dims(m), **model_params(m))
              for m in ("qwen3-8b", "gemma-3-1b", "qwen3-next-80b-a3b") + SCALED]
    return plain + models


def test_inv_freq_tables_within_their_declared_ulps():
    torch = pytest.importorskip("torch")
    mx = pytest.importorskip("mlx.core")
    from gpu_impls.mlx.rope import mlx_lm_freqs
    from gpu_impls.torch.rope import _table_f32, hf_inv_freq

    worst = {}
    for case in _table_cases():
        exact = inv_freq(case)
        half = len(exact)
        tables = {"torch:rope_hf": hf_inv_freq(case, torch).numpy(),
                  "torch:rope_polar": _table_f32(case, torch).numpy(),
                  "mlx:fast_rope_f32": np.array(mx.reciprocal(
                      mx.array((1.0 / exact).astype(np.float32))))}
        if case.params["scaling"] == "none":  # MLX's fallback for base=theta (mlx/fast.cpp)
            tables["mlx:fast_rope"] = np.array(mx.exp(
                mx.arange(0, -half, -1, dtype=mx.float32)
                * mx.array(math.log(case.params["theta"]) / half, dtype=mx.float32)))
        else:
            tables["mlx:fast_rope"] = np.array(mx.reciprocal(mlx_lm_freqs(case, mx)))
        for impl_id, table in tables.items():
            worst[impl_id] = max(worst.get(impl_id, 0.0), _table_ulps(table, exact, impl_id))
    assert all(share <= 1.0 for share in worst.values()), worst


# --- the bound at 128k -------------------------------------------------------------------------

@pytest.mark.parametrize("impl_id, compute, low", [("torch:rope_polar", "f32", 0.5),
                                                    ("torch:rope_hf", "T", 0.2)])
def test_bound_is_tight_at_128k(impl_id, compute, low):
    """At positions 131008..131071 in f32 the angles of pairs 1..7 (~10^5 rad) carry the
    table's and the angle's rounding: the worst element there uses a good share of its bound
    (not absurdly loose). Pair 0's angle (inv = 1) is exact."""
    pytest.importorskip("torch")
    impl = _impl(impl_id)
    case = _case(range(131008, 131072), compute=compute, dims={"heads_q": 4, "heads_kv": 2,
                                                               "head_dim": 128},
                 **model_params("llama-3.1-8b"))
    out, exact, bounds = _run(impl, case, make_inputs(case))
    first = np.r_[1:8, 65:72]  # rotate-half: pairs 1..7, both elements
    budget = max(float((np.abs(out[k] - exact[k]) / bounds[k])[..., first].max())
                 for k in ("q_out", "k_out"))
    assert low <= budget <= 1.0
    assert 0.01 < bounds["q_out"][..., first].max() < 0.15  # ~0.01-0.03 r: the angle's error


# --- properties on the impls -------------------------------------------------------------------

P = (0, 17, 4095, 32767, 100000)
Q = (131071, 50000, 4095, 17, 31071)


@pytest.mark.parametrize("impl_id", F32_IMPLS + T_IMPLS)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_rotating_by_p_then_q_is_rotating_by_p_plus_q(impl_id, dtype):
    """impl(impl(x, p), q) = impl(x, p + q) within b_q + |b_p| + b_{p+q}: the first call's error
    rotated (a pair's error norm, per element), the second's own bound on its stored input, and
    the direct call's bound (plain theta: the angles add exactly)."""
    impl = _impl(impl_id)
    compute = "f32" if impl_id in F32_IMPLS else "T"
    first = _case(P, dtype, compute, rotary_dim=48)
    x = make_inputs(first)
    y, exact_p, b_p = _run(impl, first, x)
    then = first.replace(positions=Q)
    stored = {k: v.astype(x[k].dtype) for k, v in (("q", y["q_out"]), ("k", y["k_out"]))}
    z, _, b_q = _run(impl, then, {**stored, "positions": np.asarray(Q, dtype=np.int32)})
    direct = first.replace(positions=tuple(p + q for p, q in zip(P, Q)))
    w, _, b_pq = _run(impl, direct, {**x, "positions": np.asarray(direct.params["positions"],
                                                                  dtype=np.int32)})
    for k in ("q_out", "k_out"):
        allowed = b_q[k] + _pair_norms(b_p[k], first) + b_pq[k]
        assert (np.abs(z[k] - w[k]) <= allowed).all(), k


@pytest.mark.parametrize("impl_id", F32_IMPLS + T_IMPLS)
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_rotation_keeps_each_pairs_norm(impl_id, dtype):
    """| |(o1, o2)| - |(x1, x2)| | <= |(b1, b2)|: a rotation keeps the norm, the impl is within
    its bound of one (plain theta: no attention factor)."""
    impl = _impl(impl_id)
    case = _case(DECODE, dtype, "f32" if impl_id in F32_IMPLS else "T", pairing="gptj")
    inputs = make_inputs(case)
    out, _, bounds = _run(impl, case, inputs)
    for k, x in (("q_out", "q"), ("k_out", "k")):
        drift = np.abs(_pair_norms(out[k], case) - _pair_norms(inputs[x].astype(np.float64),
                                                               case))
        assert (drift <= _pair_norms(bounds[k], case) * (1 + 2.0 ** -40)).all(), k


# --- cuda:kp_rope on the CPU: its table and its contract (the kernel runs in the GPU gate) -----

def _kp_rope_table(case) -> np.ndarray:
    """kp_rope.cu's `rope_inv_freq`, transcribed in float64 NumPy and fed the launcher's own
    `_table_args`, rounded to f32 once as the kernel does."""
    from gpu_impls.cuda.kp_rope import SCALING, _table_args

    scaling, log2_theta, factor, low, high, orig, yarn_low, span, _ = map(float,
                                                                          _table_args(case))
    r = case.params["rotary_dim"] or case.dims["head_dim"]
    i = np.arange(r // 2, dtype=np.float64)
    inv = np.exp2(-(2.0 * i / r) * log2_theta)
    if scaling == SCALING["llama3"]:
        wavelen = 2.0 * math.pi / inv
        s = (orig / wavelen - low) / (high - low)
        inv = np.where(wavelen > orig / low, inv / factor,
                       np.where(wavelen < orig / high, inv, (1.0 - s) * inv / factor + s * inv))
    elif scaling == SCALING["yarn"]:
        ramp = np.clip((i - yarn_low) / span, 0.0, 1.0)
        inv = inv / factor * ramp + inv * (1.0 - ramp)
    return inv.astype(np.float32)


def test_kp_rope_table_within_its_declared_half_ulp():
    """The kernel's float64 table (exp2 of -(2i/R) log2 theta, then llama3's bands or YaRN's
    ramp, from `_table_args`) rounded to f32 is within the 0.5 (1 + |ln inv|) ULPs cuda:kp_rope
    declares, for every plain theta x rotary dim and every model's table, the 1 of theta^0
    exact. The comparison bites: a table whose smooth band is squeezed out fails it."""
    from cases.rope import rope_cases

    cases = _table_cases() + [c for c in rope_cases() if c.dtype == "f32"]
    worst = max(_table_ulps(_kp_rope_table(c), inv_freq(c), "cuda:kp_rope") for c in cases)
    assert worst <= 1.0, worst
    llama = next(c for c in cases if c.params["scaling"] == "llama3")
    skipped = _kp_rope_table(llama.replace(low_freq_factor=llama.params["high_freq_factor"]
                                           - 1e-9))  # the smooth band all but gone
    assert _table_ulps(skipped, inv_freq(llama), "cuda:kp_rope") > 1.0


def test_kp_rope_contract_rejects_a_table_past_its_shared_memory():
    """rotary_dim <= 512: a 514-wide head rotated whole is refused before launch, naming the
    fix; the same head with a 64-wide partial rotary is admitted, as is every gate case."""
    from cases.rope import rope_cases
    from gpu_impls.contract import ContractError

    impl = gpu_impls.impls()["cuda:kp_rope"]
    wide = _case(DECODE, dims={"heads_q": 2, "heads_kv": 1, "head_dim": 514})
    with pytest.raises(ContractError, match=r"rotary_dim <= 512") as info:
        impl.contract.check(impl.id, wide)
    assert "rotary_dim <= 512 (a partial rotary of head_dim=514), or torch:rope_polar" in \
        str(info.value)
    assert impl.contract.admits(wide.replace(rotary_dim=64))
    assert all(impl.contract.admits(c) for c in rope_cases())


def test_kp_rope_geometry_from_the_dims():
    """Llama-3.1-8B decode (40 heads of 128: 64 pairs each): 2 heads per 128-thread block, 20
    blocks per token; Qwen3-Next (256 wide, 64 rotated: 32 pairs + 192 copied) one head per
    block; tokens past gridDim.y's 65535 are strided over by the kernel."""
    impl = gpu_impls.impls()["cuda:kp_rope"]
    llama = Case.make("rope", model_dims("llama-3.1-8b"), "bf16",
                      params={**model_params("llama-3.1-8b"), "positions": (4095,) * 3})
    launch = impl.contract.check(impl.id, llama)
    assert (launch.grid, launch.block) == ((20, 3, 1), (128, 1, 1))
    assert launch.extra["heads_per_block"] == 2
    qwen = Case.make("rope", model_dims("qwen3-next-80b-a3b"), "bf16",
                     params={**model_params("qwen3-next-80b-a3b"),
                             "positions": tuple(range(70000))})
    launch = impl.contract.check(impl.id, qwen)
    heads = qwen.dims["heads_q"] + qwen.dims["heads_kv"]
    assert launch.grid == (heads, 65535, 1) and launch.extra["rotary"] == 64


def test_an_inf_times_a_factor_its_rounding_may_flip_admits_either_sign():
    """inf · cos(θ) where the kernel's cos(θ) may land on either side of 0 (the angle's error
    at a far position reaches a zero of it): the oracle marks that output `nonfinite_free` and
    any NaN or ±inf passes there, a finite value does not; an inf times a sin near ±1 keeps its
    sign (issue 49's "a correct kernel never fails": the fuzz's named rope gap)."""
    import numpy as np

    from cases.model import Case, make_inputs
    from oracle.comparators import judge_outputs

    p = 130962  # cos(p) = 0.00215, inside the angle's error there (~0.02 rad)
    case = Case.make("rope", {"heads_q": 1, "heads_kv": 1, "head_dim": 64}, "f32",
                     params={"positions": (p,)})
    inputs = make_inputs(case)
    q = np.array(inputs["q"], copy=True)
    q[0, 0, 0] = np.inf  # x1 of pair 0 (neox: its partner is element 32)
    inputs = {**inputs, "q": q}
    exact, ref = case.spec.reference(inputs, case)
    free = exact["q_out:nonfinite_free"]
    assert free[0, 0, 0] and not free[0, 0, 32] and free.sum() == 1
    bounds = case.spec.bounds(inputs, exact, case)

    def passes(element: int, value) -> bool:
        out = np.array(ref["q_out"], copy=True)
        out[0, 0, element] = value(out[0, 0, element])
        return judge_outputs(case.spec, case, inputs, {"q_out": out, "k_out": ref["k_out"]},
                             exact, ref, bounds)["q_out"].ok

    assert passes(0, lambda v: v) and passes(0, lambda v: -v) and passes(0, lambda v: np.nan)
    assert not passes(0, lambda v: 1.0)  # finite where the oracle has an infinity
    assert np.isinf(ref["q_out"][0, 0, 32]) and not passes(32, lambda v: -v)
