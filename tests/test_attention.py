"""Attention for decode (`oracle/attention.py`) on CPU: the oracle against independent
formulations and closed forms, the combine recombining splits, the properties (split, paging and
batch invariance), MLX's flushing exp, and the mutants going red."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gpu_impls
from cases.attention import SMALL, heads
from cases.model import Case, make_inputs
from oracle.attention import attended, gathered, scale_of
from oracle.dtypes import round_to
from verbs.cli import main
from runners.correctness import batch_variant_rows, oracle_for, run_impl

MUTANTS = str(Path(__file__).with_name("mutants.py"))
SWA = {"sinks": 1, "window": 16}


def _case(op="sdpa_decode", dtype="f32", dist="normal", **params):
    if op == "sdpa_decode":
        return Case.make(op, {**SMALL, "max_len": 48}, dtype, dist, params=params)
    dims = {"batch": 6, "heads": 8, "kv_heads": 2, "head_dim": 64, "page_size": 16,
            "max_pages": 4, "num_pages": 30}
    return Case.make(op, dims, dtype, dist, params=params)


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


# --- the oracle --------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["sdpa_decode", "sdpa_decode_paged"])
def test_oracle_matches_torch_float64(op):
    """The oracle against F.scaled_dot_product_attention in float64 over the whole (padded)
    cache, lengths and window as an additive mask, the sink a zero key (and value) whose mask
    entry is the sink logit."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from gpu_impls.torch.attention import attended_mask, cache

    case = _case(op, window=20, sink_end=3, sinks=1)
    inputs = make_inputs(case)
    t = {k: torch.from_numpy(_f64(v)) for k, v in inputs.items()}
    k, v = cache(t, case)
    b, hkv, _, d = k.shape
    zero = torch.zeros(b, hkv, 1, d, dtype=torch.float64)
    mask = attended_mask(t["lengths"].long(), k.shape[2], case.params)
    bias = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    bias = torch.cat([bias[:, None, None, :].expand(b, 8, 1, -1),
                      t["sinks"][None, :, None, None].expand(b, 8, 1, 1)], dim=-1)
    got = F.scaled_dot_product_attention(t["q"][:, :, None], torch.cat([k, zero], dim=2),
                                         torch.cat([v, zero], dim=2), attn_mask=bias,
                                         scale=scale_of(case), enable_gqa=True)[:, :, 0]
    np.testing.assert_allclose(case.spec.oracle(inputs, case)["out"], got.numpy(), rtol=1e-12,
                               atol=1e-13)


def test_prefill_oracle_matches_torch_float64_over_the_packed_batch():
    """sdpa_prefill_varlen's oracle against one float64 F.scaled_dot_product_attention over the
    packed batch with a block-diagonal, bottom-right causal, windowed mask; and the rows of a
    fresh prompt (q = k) against torch's own is_causal."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from gpu_impls.torch.attention import packed_mask

    case = Case.make("sdpa_prefill_varlen", {"heads": 8, "kv_heads": 2, "head_dim": 64}, "f32",
                     params={"q_lens": (4, 1, 9), "k_lens": (16, 30, 9), "window": 6})
    inputs = make_inputs(case)
    q, k, v = (torch.from_numpy(_f64(inputs[n])).transpose(0, 1)[None] for n in "qkv")
    mask = packed_mask(case)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale_of(case),
                                         enable_gqa=True)[0].transpose(0, 1).numpy()
    exact = case.spec.oracle(inputs, case)["out"]
    np.testing.assert_allclose(exact, got, rtol=1e-12, atol=1e-13)
    fresh = F.scaled_dot_product_attention(q[:, :, 5:], k[:, :, 46:], v[:, :, 46:], is_causal=True,
                                           scale=scale_of(case.replace(window=0)),
                                           enable_gqa=True)[0].transpose(0, 1).numpy()
    whole = case.replace(window=0)
    np.testing.assert_allclose(whole.spec.oracle(inputs, whole)["out"][5:], fresh, rtol=1e-12,
                               atol=1e-13)


def test_closed_forms():
    """All keys equal: the mean of the attended values. One key 30 above the rest: its value
    (to e^-29). One key in the cache: that key's value, exactly."""
    case = _case(dist="equal_keys")
    inputs = make_inputs(case)
    out = case.spec.oracle(inputs, case)["out"]
    for b, keys in enumerate(attended(case, inputs["lengths"])):
        _, v = gathered(inputs, case, b, keys)
        mean = np.repeat(v.mean(axis=1), 4, axis=0)  # 4 query heads per kv head
        np.testing.assert_allclose(out[b], mean, rtol=1e-12, atol=1e-12)
    assert int(inputs["lengths"][1]) == 1  # `seq_lens`: the second sequence has one key
    np.testing.assert_array_equal(out[1], np.repeat(_f64(inputs["v"][1, :, 0]), 4, axis=0))

    case = _case(dist="clear_margin")
    inputs = make_inputs(case)
    out = case.spec.oracle(inputs, case)["out"]
    keys = attended(case, inputs["lengths"])[0]
    top = _f64(inputs["v"][0, :, keys[len(keys) // 4]])  # the planted key, per kv head
    np.testing.assert_allclose(out[0, ::4], top, atol=np.exp(-29) * 4 * len(keys))


def test_combine_recombines_the_splits_of_a_sequence():
    """Pass 1 in float64 over 5 splits of each head's keys (one split empty), then the
    attn_combine oracle: the single-pass attention, and lse = log Σ e^s (sink included)."""
    case = _case(sinks=1)
    inputs = make_inputs(case)
    full = case.spec.oracle(inputs, case)["out"][0]  # sequence 0: 48 keys
    keys = attended(case, inputs["lengths"])[0]
    k, v = gathered(inputs, case, 0, keys)
    q = _f64(inputs["q"][0]).reshape(2, 4, -1)
    s = np.einsum("hgd,hnd->hgn", q, k) * scale_of(case)  # [2, 4, n]
    bounds = [0, 7, 7, 20, 33, len(keys)]
    o, m, l = np.zeros((8, 5, 64)), np.full((8, 5), -np.inf), np.zeros((8, 5))
    for j, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        if lo == hi:
            continue
        part = s[..., lo:hi].reshape(8, -1)
        m[:, j] = part.max(axis=-1)
        p = np.exp(part - m[:, j, None])
        l[:, j] = p.sum(axis=-1)
        o[:, j] = np.einsum("ht,htd->hd", p, np.repeat(v[:, lo:hi], 4, axis=0))
    combine = Case.make("attn_combine", {"batch": 1, "heads": 8, "splits": 5, "head_dim": 64},
                        "f32", params={"sinks": 1})
    got = combine.spec.oracle({"o": o[None], "m": m[None], "l": l[None],
                               "sinks": inputs["sinks"]}, combine)
    np.testing.assert_allclose(got["out"][0], full, rtol=1e-12, atol=1e-13)
    logits = np.concatenate([s.reshape(8, -1), _f64(inputs["sinks"])[:, None]], axis=-1)
    top = logits.max(axis=-1)
    np.testing.assert_allclose(got["lse"][0], top + np.log(np.exp(logits - top[:, None])
                                                           .sum(axis=-1)), rtol=1e-14)


# --- the properties ----------------------------------------------------------------------------

@pytest.mark.parametrize("dist, params", [("near_tie", {}), ("outlier_rows", SWA),
                                          ("normal", {"window": 40, "sink_end": 4})])
def test_split_invariance(dist, params):
    """The split-KV pair at 1, 2, 3, 5, 16 and 64 splits (more splits than keys: empty ones)
    is within the single-pass oracle's bound for its declared numerics."""
    pytest.importorskip("torch")
    from gpu_impls.torch.attention import split_kv_impl

    case = _case(dtype="bf16", dist=dist, **params)
    inputs = make_inputs(case)
    backend = gpu_impls.backend("torch")
    for splits in (1, 2, 3, 5, 16, 64):
        impl = split_kv_impl("sdpa_decode", f"split{splits}", splits)
        exact, _, bound = oracle_for(impl, backend, case, inputs)
        out = _f64(run_impl(impl, backend, case, inputs)["out"])
        ok = np.isfinite(exact["out"])
        budget = np.max(np.abs(out - exact["out"])[ok] / bound["out"][ok])
        assert budget <= 1.0, f"{splits} splits: budget {budget:.3f}"


@pytest.mark.parametrize("impl_id", ["torch:paged_sdpa", "torch:paged_split_kv",
                                     "mlx:paged_fast_sdpa"])
def test_paging_invariance(impl_id):
    """Permuting the physical pages (the table renamed with them) changes no output bit."""
    impl = gpu_impls.impls()[impl_id]
    backend = gpu_impls.backend(impl.backend)
    ok, why = impl.available(backend)
    if not ok:
        pytest.skip(why)
    assert_paging_invariant(impl, backend, _case("sdpa_decode_paged", "bf16", probs="T"))


def assert_paging_invariant(impl, backend, case) -> None:
    """`impl`'s output bits on `case` and on its pages permuted (the table renamed with them)
    are the same (also the GPU test's, tests/test_gpu_attention.py)."""
    inputs = make_inputs(case)
    perm = np.random.default_rng(1).permutation(case.dims["num_pages"])  # new page of old i
    moved = dict(inputs)
    for name in ("k_pages", "v_pages"):
        moved[name] = np.empty_like(inputs[name])
        moved[name][perm] = inputs[name]
    moved["page_table"] = perm[inputs["page_table"]].astype(inputs["page_table"].dtype)
    assert not np.array_equal(moved["page_table"], inputs["page_table"])
    first = run_impl(impl, backend, case, inputs)["out"]
    assert run_impl(impl, backend, case, moved)["out"].tobytes() == first.tobytes()


def test_declared_batch_invariant_impls_match_each_row_alone():
    """Every attention impl declaring batch invariance here: sequence i of a ragged batch is
    bit for bit that sequence alone."""
    cases = {"sdpa_decode": _case(dtype="bf16", probs="T", **SWA),
             "sdpa_decode_paged": _case("sdpa_decode_paged", "bf16", probs="T"),
             "attn_combine": Case.make("attn_combine", {"batch": 4, "heads": 8, "splits": 5,
                                                        "head_dim": 64}, "bf16",
                                       params={"sinks": 1})}
    checked = []
    for impl in gpu_impls.impls().values():
        backend = gpu_impls.backend(impl.backend)
        if impl.op not in cases or not impl.available(backend)[0] \
                or not impl.batch_invariant_on(backend.device()):
            continue
        case = cases[impl.op]
        if not impl.contract.admits(case):
            case = case.replace(sinks=0, probs="T") if impl.op != "attn_combine" else case
        if not impl.contract.admits(case):
            continue
        assert batch_variant_rows(impl, backend, case) == [], impl.id
        checked.append(impl.id)
    assert len(checked) >= 6, checked


# --- the error model's facts -------------------------------------------------------------------

def test_mlx_exp_flushes_subnormal_results():
    """`oracle.numerics.BACKEND_FLUSHES["mlx"]`: MLX CPU's exp is 0 where the result is below
    2^-126 (its products keep subnormals)."""
    mx = pytest.importorskip("mlx.core")
    from oracle.numerics import BACKEND_FLUSHES

    x = np.array([-87.0, -88.0, -95.0], dtype=np.float32)
    got = np.array(mx.exp(mx.array(x)))
    assert got[0] > 0 and not got[1:].any()
    assert np.array(mx.array(np.float32(1e-40)) * mx.array(np.float32(1.0))) > 0
    assert "exp" in BACKEND_FLUSHES["mlx"]


def test_p_in_t_is_charged():
    """torch:sdpa rounds P to T before P·V (bf16): on heads whose outputs cancel to 0 its error
    is P's rounding, ~1e-3, far past the f32-P bound; the probs='T' bound covers it."""
    pytest.importorskip("torch")
    heads = 8
    case = Case.make("sdpa_decode", {"batch": 1, "heads": heads, "kv_heads": heads,
                                     "head_dim": 64, "max_len": 2}, "bf16",
                     params={"ragged": 0, "probs": "T"})
    x = np.linspace(0.3, 0.5, heads)[:, None]  # per head: scores 0 and -x (scale 1/8)
    q = np.zeros((1, heads, 64))
    q[..., 0] = 1.0
    k = np.zeros((1, heads, 2, 64))
    k[0, :, 1, :1] = -8 * x
    v = np.zeros((1, heads, 2, 64))
    v[0, :, 0] = 1.0
    v[0, :, 1] = -np.exp(x)  # out = (1 - e^-x e^x) / l = 0, up to v's rounding to bf16
    store = {"lengths": np.array([2], dtype=np.int32), "sinks": np.zeros(0, np.float32),
             **{n: round_to(a, "bf16") for n, a in (("q", q), ("k", k), ("v", v))}}
    impl = gpu_impls.impls()["torch:sdpa"]
    backend = gpu_impls.backend("torch")
    out = _f64(run_impl(impl, backend, case, store)["out"])
    exact, _, bound = oracle_for(impl, backend, case, store)
    err = np.abs(out - exact["out"])
    assert err.max() > 5e-4 and (err <= bound["out"]).all()
    tight = case.spec.bounds(store, exact, case.replace(probs="f32"),
                             impl.numerics.on("torch"))["out"]
    assert (err > tight).any()


# --- mutants -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mutant, preset", [
    ("mutant_sdpa_drop_sink", "outlier_rows-sinks-window"),
    ("mutant_sdpa_window_off_by_one", "outlier_rows-sinks-window"),
    ("mutant_sdpa_gqa_modulo", "outlier_rows"),
    ("mutant_sdpa_scores_in_t", "near_tie"),
    ("mutant_combine_no_rescale", "splits-5"),
    ("mutant_split_kv_no_rescale", "llama-3.2-1b"),  # 256 keys: 4 splits
    ("mutant_prefill_causal_top_left", "outlier_rows")])
def test_each_attention_mutant_fails_check(tmp_path, mutant, preset, capsys):
    rc = main(["--store", str(tmp_path / "store"), "--plugin", MUTANTS, "check", "--impl",
               f"torch:{mutant}", "--preset", preset, "--show-failures", "1"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert f"--impl torch:{mutant}" in out


def test_flushing_exp_is_charged_its_result():
    """The error model charges an exp whose subnormal result the backend flushes (MLX) the whole
    result, and one that keeps it (torch) its ULPs of 2^-149."""
    from oracle.numerics import Model, Numerics

    tiny = np.array([6.2e-40])
    mlx = Model(numerics=Numerics().on("mlx")).func("exp", tiny)
    torch_cpu = Model(numerics=Numerics().on("torch")).func("exp", tiny)
    assert mlx[0] >= tiny[0] and torch_cpu[0] == 2 * 2.0 ** -149


# --- torch:flex_attention's masks on the eager path ------------------------------------------

FLEX_CASES = {
    "torch:flex_attention": _case(dtype="bf16", probs="T", sinks=1, window=20, sink_end=3),
    "torch:paged_flex_attention": _case("sdpa_decode_paged", "bf16", probs="T", **SWA),
    "torch:flex_attention_varlen": Case.make(
        "sdpa_prefill_varlen", {"heads": 8, "kv_heads": 2, "head_dim": 64}, "bf16",
        params={"q_lens": (3, 1, 6), "k_lens": (9, 4, 6), "window": 4, "probs": "T"})}


@pytest.mark.parametrize("impl_id", sorted(FLEX_CASES))
def test_flex_attention_masks_on_the_eager_path(impl_id):
    """The flex impls run compiled on CUDA only (the GPU gate); their block masks, sink column
    and score_mod are the same on flex's eager path, which runs here: one small bf16 case per
    op with every mask feature (lengths max, 1, 17...; window, sink_end and sinks; prefill:
    q_len < k_len, bottom-right causal, window) passes the oracle. A sink rounded to bf16 in
    the score_mod fails it (budget ~2), as does a window off by one."""
    pytest.importorskip("torch")
    from runners.correctness import check
    from cases.generate import Work

    impl = gpu_impls.impls()[impl_id]
    row = check(Work(impl, FLEX_CASES[impl_id], "valid"), gpu_impls.backend("torch"))
    assert row["status"] == "pass", row["message"]
