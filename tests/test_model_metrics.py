"""models/metrics.py: the model gate's logit metrics against hand computations and
llama-perplexity's formulas (llama.cpp `tools/perplexity/perplexity.cpp`). Expected values are
computed here independently (pure Python math / statistics), never by calling the module under
test."""

from __future__ import annotations

import math
import statistics
import warnings

import numpy as np
import pytest

from models import metrics as M


def random_logits(t: int, v: int, seed: int, scale: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, scale, (t, v))


def softmax_py(row) -> list[float]:
    m = max(row)
    e = [math.exp(x - m) for x in row]
    return [x / sum(e) for x in e]


def test_identical_logits_give_zero_kld_and_same_top():
    ref = random_logits(20, 64, seed=1)
    m = M.position_metrics(ref, ref.copy(), np.arange(20) % 64)
    assert np.all(m["kld"] < 1e-12)
    assert m["same_top"].all() and np.all(m["dp"] == 0) and np.allclose(m["cosine"], 1.0)
    s = M.summary(m)
    assert s["mean_kld"] < 1e-12 and s["same_top_p"] == 1.0
    assert s["rms_dp"] == 0.0 and s["rms_dp_unc"] == 0.0  # llama prints NaN here
    assert s["ln_ppl_ratio"] == 0.0 and s["ln_ppl_ratio_unc"] == 0.0


def test_shifted_logits_are_softmax_invariant():
    ref = random_logits(16, 128, seed=2)
    shift = np.linspace(-700.0, 900.0, 16)[:, None]  # per row; exp(900) overflows unshifted
    m = M.position_metrics(ref, ref + shift, np.arange(16))
    assert np.all(m["kld"] < 1e-10)
    assert m["same_top"].all() and np.all(np.abs(m["dp"]) < 1e-12)


# A 3-token vocabulary, 12 positions (more than 10, so the uncertainties are not 0): three
# patterns of (ref row, test row, next token), repeated four times.
PATTERNS = [([2.0, 1.0, 0.0], [1.0, 1.5, 0.0], 0),     # top flips 0 -> 1
            ([0.0, 3.0, -1.0], [0.5, 2.0, -1.0], 1),   # same top
            ([1.0, 0.0, 0.5], [1.2, -0.5, 0.3], 2)]    # same top


def hand_example():
    rows = PATTERNS * 4
    ref = np.array([r for r, _, _ in rows])
    test = np.array([q for _, q, _ in rows])
    nxt = np.array([t for _, _, t in rows])
    return ref, test, nxt, rows


def test_hand_computed_three_token_example():
    ref, test, nxt, rows = hand_example()
    m = M.position_metrics(ref, test, nxt)
    s = M.summary(m)

    kld, dp, same = [], [], []
    for r, q, t in rows:
        p, qq = softmax_py(r), softmax_py(q)
        kld.append(sum(pi * math.log(pi / qi) for pi, qi in zip(p, qq)))   # KL(P_ref ‖ Q_test)
        dp.append(qq[t] - p[t])                                            # test − ref
        same.append(r.index(max(r)) == q.index(max(q)))
    n = len(rows)
    np.testing.assert_allclose(m["kld"], kld, rtol=1e-12)
    np.testing.assert_allclose(m["dp"], dp, rtol=1e-12)
    assert m["same_top"].tolist() == same

    sem = lambda v: statistics.stdev(v) / math.sqrt(len(v))  # sample std / √n
    assert s["mean_kld"] == pytest.approx(statistics.fmean(kld), rel=1e-12)
    assert s["mean_kld_unc"] == pytest.approx(sem(kld), rel=1e-9)
    assert s["mean_dp"] == pytest.approx(statistics.fmean(dp), rel=1e-12)
    assert s["mean_dp_unc"] == pytest.approx(sem(dp), rel=1e-9)
    dp2 = [d * d for d in dp]
    rms = math.sqrt(statistics.fmean(dp2))
    assert s["rms_dp"] == pytest.approx(rms, rel=1e-12)
    assert s["rms_dp_unc"] == pytest.approx(0.5 / rms * sem(dp2), rel=1e-9)
    p_same = sum(same) / n
    assert p_same == pytest.approx(2 / 3)
    assert s["same_top_p"] == pytest.approx(p_same)
    assert s["same_top_p_unc"] == pytest.approx(math.sqrt(p_same * (1 - p_same) / (n - 1)))

    # The reference's top token's |Δp|, the margins and the flip gap of pattern 0.
    p0, q0 = softmax_py(PATTERNS[0][0]), softmax_py(PATTERNS[0][1])
    assert m["abs_dp_top"][0] == pytest.approx(abs(q0[0] - p0[0]))
    assert m["ref_margin"][0] == pytest.approx(1.0) and m["test_margin"][0] == pytest.approx(0.5)
    assert m["flip_gap"][0] == pytest.approx(1.0) and m["flip_gap"][1] == 0.0
    cos = sum(a * b for a, b in zip(*PATTERNS[0][:2])) / (
        math.hypot(*PATTERNS[0][0]) * math.hypot(*PATTERNS[0][1]))
    assert m["cosine"][0] == pytest.approx(cos)


def test_perplexity_lines_follow_llama():
    ref, test, nxt, rows = hand_example()
    s = M.summary(M.position_metrics(ref, test, nxt))
    nq = [-math.log(softmax_py(q)[t]) for _, q, t in rows]
    nb = [-math.log(softmax_py(r)[t]) for r, _, t in rows]
    n = len(rows)
    sq, sb = (statistics.stdev(v) / math.sqrt(n) for v in (nq, nb))
    cov = sum((a - statistics.fmean(nq)) * (b - statistics.fmean(nb))
              for a, b in zip(nq, nb)) / n / (n - 1)
    assert s["ppl_q"] == pytest.approx(math.exp(statistics.fmean(nq)))
    assert s["ppl_q_unc"] == pytest.approx(s["ppl_q"] * sq)
    assert s["ppl_base"] == pytest.approx(math.exp(statistics.fmean(nb)))
    assert s["ln_ppl_ratio"] == pytest.approx(statistics.fmean(nq) - statistics.fmean(nb))
    assert s["ln_ppl_ratio_unc"] == pytest.approx(math.sqrt(sq ** 2 + sb ** 2 - 2 * cov))
    assert s["cor_ln_ppl"] == pytest.approx(cov / (sq * sb))


def test_percentiles_are_linear_interpolation():
    t = 137
    ref, test = random_logits(t, 50, seed=3), random_logits(t, 50, seed=4, scale=2.5)
    m = M.position_metrics(ref, test, np.arange(t) % 50)
    s = M.summary(m)
    # Rows span three blocks of 64: block edges' KLDs as computed here, one row at a time.
    for i in (0, 63, 64, 136):
        p, q = softmax_py(ref[i].tolist()), softmax_py(test[i].tolist())
        assert m["kld"][i] == pytest.approx(sum(a * math.log(a / b) for a, b in zip(p, q)))
    assert s["distribution"]
    assert set(M.LLAMA_NAMES) <= set(s) and all(k + "_unc" in s for k in ("mean_kld", "rms_dp"))
    for values, table in ((m["kld"], M.KLD_PERCENTILES), (m["dp"], M.DP_PERCENTILES)):
        for key, f in table:
            assert s[key] == pytest.approx(np.percentile(values, 100 * f, method="linear"),
                                           rel=1e-12), key
    # llama's rule by hand at 99 %: position f·(n − 1) of the ascending values.
    v = sorted(m["kld"].tolist())
    pos = 0.99 * (t - 1)
    lo, frac = int(pos), pos - int(pos)
    assert s["kld_99"] == pytest.approx((1 - frac) * v[lo] + frac * v[lo + 1], rel=1e-12)
    assert s["median_kld"] == pytest.approx(v[t // 2])  # odd n: the middle value
    assert (s["min_kld"], s["max_kld"]) == (v[0], v[-1])
    assert s["max_dp"] == max(m["dp"]) and s["min_dp"] == min(m["dp"])


def test_order_statistics_skipped_below_100_positions():
    ref, test = random_logits(100, 20, seed=5), random_logits(100, 20, seed=6)
    nxt = np.arange(100) % 20
    short = M.summary(M.position_metrics(ref[:99], test[:99], nxt[:99]))
    assert not short["distribution"]
    for key in ["max_kld", "min_kld", "max_dp", "min_dp",
                *(k for k, _ in M.KLD_PERCENTILES), *(k for k, _ in M.DP_PERCENTILES)]:
        assert math.isnan(short[key]), key
    for key in ("mean_kld", "mean_kld_unc", "rms_dp", "same_top_p", "ppl_q", "ln_ppl_ratio"):
        assert math.isfinite(short[key]) and short[key] != 0, key
    assert "med=nan" in M.summary_line("short", short)
    full = M.summary(M.position_metrics(ref, test, nxt))
    assert full["distribution"] and math.isfinite(full["kld_99_9"]) and full["n"] == 100


def test_uncertainties_are_zero_at_or_below_10_positions():
    ref, test = random_logits(11, 20, seed=7), random_logits(11, 20, seed=8)
    nxt = np.arange(11)
    ten = M.summary(M.position_metrics(ref[:10], test[:10], nxt[:10]))
    for key in ("mean_kld_unc", "mean_dp_unc", "rms_dp_unc", "ppl_q_unc", "ppl_base_unc",
                "ln_ppl_ratio_unc"):
        assert ten[key] == 0.0, key
    assert math.isnan(ten["cor_ln_ppl"])
    eleven_m = M.position_metrics(ref, test, nxt)
    eleven = M.summary(eleven_m)
    kld = eleven_m["kld"].tolist()
    assert eleven["mean_kld_unc"] == pytest.approx(statistics.stdev(kld) / math.sqrt(11))


# Near-tie worked case, V = 3, bound 0.05 on a logit difference:
#   t=0: ref margin 0.02, the test picks the runner-up (gap 0.02 <= 0.05): excused;
#   t=1: ref margin 0.5, the test picks the runner-up (gap 0.5 > 0.05): fails;
#   t=2: ref margin 0.01 but the test jumps to token 2 (gap 1.0 > 0.05): fails;
#   t=3: no flip.
TIE_REF = [[1.0, 0.98, 0.0], [1.0, 0.5, 0.0], [1.0, 0.99, 0.0], [2.0, 0.0, 0.0]]
TIE_TEST = [[0.97, 0.99, 0.0], [0.4, 0.6, 0.0], [0.0, 0.0, 5.0], [2.0, 0.1, 0.0]]


def test_near_tie_flip_is_excused_and_a_clear_one_fails():
    m = M.position_metrics(np.array(TIE_REF), np.array(TIE_TEST), np.zeros(4, dtype=int))
    assert M.flips(m, 0.05).tolist() == [1, 2]
    assert M.near_ties(m, 0.05).tolist() == [0]
    # A per-position bound: a wider bound at t=1 excuses that flip too.
    assert M.flips(m, np.array([0.05, 0.6, 0.05, 0.05])).tolist() == [2]
    # Zero bound: every flip fails.
    assert M.flips(m, 0.0).tolist() == [0, 1, 2]
    ok, reasons = M.gate({"mean_kld": 0.0, "mean_kld_unc": 0.0, "same_top_p": 1.0,
                          "same_top_p_unc": 0.0}, M.flips(m, 0.05))
    assert not ok and reasons == ["2 top-token flips beyond the margin bound at positions 1, 2"]
    with pytest.raises(ValueError, match="margin_bound"):
        M.flips(m, np.array([0.1, 0.1]))


def test_gate_defaults():
    s = {"mean_kld": 1e-4, "mean_kld_unc": 1e-6, "same_top_p": 0.99, "same_top_p_unc": 0.005}
    assert M.gate(s, []) == (True, [])
    ok, reasons = M.gate({**s, "mean_kld": 1.01e-4}, [])
    assert not ok and reasons[0].startswith("mean KLD 0.000101")
    ok, reasons = M.gate({**s, "same_top_p": 0.989}, [])
    assert not ok and reasons[0].startswith("same top p 98.90")
    ok, reasons = M.gate({**s, "mean_kld": float("nan"), "nonfinite": 3}, [])
    assert not ok and "3 positions with non-finite KLD" in reasons[0]


def test_small_perturbation_kld_is_half_the_p_weighted_variance():
    """The gate docstring's estimate KL ≈ ½ Var_p(δ)."""
    ref = random_logits(4, 1000, seed=9)
    delta = np.random.default_rng(10).normal(0.0, 1e-3, ref.shape)
    m = M.position_metrics(ref, ref + delta, np.zeros(4, dtype=int))
    p = np.exp(ref - ref.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    var = np.sum(p * delta ** 2, 1) - np.sum(p * delta, 1) ** 2
    np.testing.assert_allclose(m["kld"], 0.5 * var, rtol=1e-2)


def test_bad_inputs_are_named():
    ref = random_logits(3, 5, seed=11)
    with pytest.raises(ValueError, match="test_logits"):
        M.position_metrics(ref, ref[:, :4], np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match="next_tokens"):
        M.position_metrics(ref, ref, np.array([0, 1, 5]))
    with pytest.raises(ValueError, match="0 positions"):
        M.summary(M.position_metrics(ref[:0], ref[:0], np.zeros(0, dtype=int)))


def test_nonfinite_test_logits_fail_the_gate_without_warnings():
    ref = random_logits(120, 30, seed=12)
    test = ref.copy()
    test[3, 5], test[4, 7] = np.nan, -np.inf  # an unwritten element, a -inf logit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = M.position_metrics(ref, test, np.arange(120) % 30)
        s = M.summary(m)
    assert math.isnan(m["kld"][3]) and m["kld"][4] == math.inf and s["nonfinite"] == 2
    ok, reasons = M.gate(s, M.flips(m, 0.1))
    assert not ok and "2 positions with non-finite KLD" in reasons[0]


def test_the_model_gates_margin_bound_excuses_near_ties_only():
    """`margin_bound`: 4·√2·σ with σ = √(2·KLD bound), 0.08 nats at 1e-4. A plan whose only
    flip is a near tie passes on 15 positions (93 % raw same top); the same flip on a gap the
    bound does not cover fails, whatever the mean KLD."""
    assert M.margin_bound(1e-4) == pytest.approx(0.08)
    bound = M.margin_bound(1e-4)
    s = {"n": 15, "mean_kld": 2e-5, "mean_kld_unc": 1e-6, "same_top_p": 14 / 15,
         "same_top_p_unc": 0.067}
    ref = np.array([[1.0, 1.0 - 0.07, 0.0]] + [[2.0, 0.0, 0.0]] * 14)
    test = ref.copy()
    test[0] = [0.96, 0.965, 0.0]  # a 0.07-nat gap flipped by a 0.075-nat perturbation
    m = M.position_metrics(ref, test, np.zeros(15, dtype=int))
    ties, failed = M.near_ties(m, bound), M.flips(m, bound)
    assert ties.tolist() == [0] and failed.size == 0
    assert M.gate(s, failed, near_ties=len(ties)) == (True, [])
    assert not M.gate(s, failed)[0]  # without counting the near tie: 93 % < 99 %
    ref[0, 1] = 1.0 - 0.09  # a gap beyond the band: the flip fails
    test[0] = [0.95, 0.96, 0.0]
    m = M.position_metrics(ref, test, np.zeros(15, dtype=int))
    assert M.flips(m, bound).tolist() == [0] and M.near_ties(m, bound).size == 0
    ok, reasons = M.gate(s, M.flips(m, bound))
    assert not ok and any("beyond the margin bound" in r for r in reasons)
