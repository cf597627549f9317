"""The model gate's logit metrics (issue 28): per-position comparisons of a test plan's logits
with the reference plan's, their summary under llama-perplexity's names and formulas
(`llama-perplexity --kl-divergence`, llama.cpp `tools/perplexity/perplexity.cpp`), FFAI's
one-line summary (thewafflehaus/FFAI `Sources/FFAI/Quality/KLDivergence.swift`), near-tie aware
top-token flips and the gate.

Pure NumPy in float64, independent of the rest of kparity, so the decode loop and the CLI can
both use it.

Positions: row t of the logits predicts `next_tokens[t]` (the token at t + 1 of the
teacher-forced text). "ref" is the reference plan (llama's "base"), "test" the plan under test
(llama's "Q").
"""

from __future__ import annotations

import math

import numpy as np

# llama-perplexity skips its final block of statistics below this many scored tokens.
MIN_DISTRIBUTION = 100
# Uncertainties of means are 0 at or below this many positions (llama's `count > 10`).
MIN_UNCERTAINTY = 10
# Rows per block in `position_metrics`.
BLOCK_ROWS = 64

KLD_PERCENTILES = (("kld_99_9", 0.999), ("kld_99", 0.99), ("kld_95", 0.95), ("kld_90", 0.90),
                   ("median_kld", 0.5), ("kld_10", 0.10), ("kld_5", 0.05), ("kld_1", 0.01),
                   ("kld_0_1", 0.001))
DP_PERCENTILES = (("dp_99_9", 0.999), ("dp_99", 0.99), ("dp_95", 0.95), ("dp_90", 0.90),
                  ("dp_75", 0.75), ("median_dp", 0.5), ("dp_25", 0.25), ("dp_10", 0.10),
                  ("dp_5", 0.05), ("dp_1", 0.01), ("dp_0_1", 0.001))

# Summary key -> llama-perplexity's label for it, alignment padding dropped (its Δp lines print
# the value x 100 %). Each `*_unc` key is the ± of its value's line.
LLAMA_NAMES = {
    "ppl_q": "Mean PPL(Q)", "ppl_base": "Mean PPL(base)",
    "cor_ln_ppl": "Cor(ln(PPL(Q)), ln(PPL(base)))",
    "ln_ppl_ratio": "Mean ln(PPL(Q)/PPL(base))", "ppl_ratio": "Mean PPL(Q)/PPL(base)",
    "ppl_diff": "Mean PPL(Q)-PPL(base)",
    "mean_kld": "Mean KLD", "max_kld": "Maximum KLD", "min_kld": "Minimum KLD",
    **{k: "Median KLD" if k == "median_kld" else f"{100 * f:.1f}% KLD" for k, f in KLD_PERCENTILES},
    "mean_dp": "Mean Δp", "max_dp": "Maximum Δp", "min_dp": "Minimum Δp",
    **{k: "Median Δp" if k == "median_dp" else f"{100 * f:.1f}% Δp" for k, f in DP_PERCENTILES},
    "rms_dp": "RMS Δp", "same_top_p": "Same top p",
}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64: x - max - log Σ exp(x - max)."""
    x = np.asarray(logits, dtype=np.float64)
    c = x - np.max(x, axis=-1, keepdims=True)
    return c - np.log(np.sum(np.exp(c), axis=-1, keepdims=True))


def _top2(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(argmax per row, first max wins; top1 - top2 logit per row, 0 where the max is tied)."""
    top = np.argmax(x, axis=1)
    two = -np.partition(-x, 1, axis=1)[:, :2]
    return top, two[:, 0] - two[:, 1]


def _check(ref: np.ndarray, test: np.ndarray, nxt: np.ndarray) -> None:
    if ref.ndim != 2 or ref.shape[1] < 2:
        raise ValueError(f"ref_logits must be [T, V] with V >= 2, got shape {ref.shape}")
    if test.shape != ref.shape:
        raise ValueError(f"test_logits has shape {test.shape}, ref_logits {ref.shape}: "
                         "score the same positions over the same vocabulary")
    if nxt.shape != (ref.shape[0],) or not np.issubdtype(nxt.dtype, np.integer):
        raise ValueError(f"next_tokens must be integer [T] = [{ref.shape[0]}], got "
                         f"{nxt.dtype} {nxt.shape}")
    if nxt.size and (nxt.min() < 0 or nxt.max() >= ref.shape[1]):
        raise ValueError(f"next_tokens must lie in [0, {ref.shape[1]}), got "
                         f"[{nxt.min()}, {nxt.max()}]")


def position_metrics(ref_logits: np.ndarray, test_logits: np.ndarray,
                     next_tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Per-position comparison of `test_logits` [T, V] with `ref_logits` [T, V]; row t predicts
    `next_tokens[t]`. Returns arrays [T]:

    * `kld`: KL(P_ref ‖ Q_test) = Σ_i p_ref,i (log p_ref,i − log q_test,i), terms with
      p_ref,i = 0 counted as 0, clamped at 0 as FFAI does (a negative value is float64
      rounding only; llama does not clamp).
    * `same_top`: argmax ref == argmax test (`ref_top`, `test_top`; first max wins, as llama's
      strict `>` scan).
    * `dp`: p_test(next) − p_ref(next) (llama's Δp sign: positive where the test plan is more
      sure of the true token).
    * `abs_dp_top`: |p_test(ref_top) − p_ref(ref_top)|: the reference's top token.
    * `cosine`: cosine of the two logit vectors (1 where both are zero, 0 where one is).
    * `ref_margin`, `test_margin`: top1 − top2 logit of each (0 at an exact tie).
    * `flip_gap`: ref_logit[ref_top] − ref_logit[test_top], the reference's own gap to the test
      plan's pick (0 where the tops agree; `flips` judges it).
    * `nll_ref`, `nll_test`: −log p(next) of each (the perplexity lines).

    The one deliberate difference from llama.cpp: its base log-probs are stored as uint16 over
    [max − 16, max] (about 2.4e-4 nats resolution) and its KLD sums only the tokens above
    max − 16; here the reference is held exactly, so the log-softmax of both sides is float64
    and the KLD sums the whole vocabulary. The per-token formulas are otherwise llama's
    (`summary` lists the statistics' edge cases). Rows are processed BLOCK_ROWS at a time to
    bound the float64 temporaries (a 49152-token vocabulary is 393 KB a row)."""
    ref = np.asarray(ref_logits)
    test = np.asarray(test_logits)
    nxt = np.asarray(next_tokens)
    _check(ref, test, nxt)
    blocks = [_block_metrics(ref[i:i + BLOCK_ROWS], test[i:i + BLOCK_ROWS],
                             nxt[i:i + BLOCK_ROWS]) for i in range(0, ref.shape[0], BLOCK_ROWS)]
    if not blocks:
        return _block_metrics(ref, test, nxt)
    return {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}


def _block_metrics(ref_logits: np.ndarray, test_logits: np.ndarray,
                   nxt: np.ndarray) -> dict[str, np.ndarray]:
    """`position_metrics` of a block of rows (inputs already checked)."""
    ref = np.asarray(ref_logits, dtype=np.float64)
    test = np.asarray(test_logits, dtype=np.float64)
    rows = np.arange(ref.shape[0])

    lp_ref, lp_test = log_softmax(ref), log_softmax(test)
    p_ref, p_test = np.exp(lp_ref), np.exp(lp_test)
    with np.errstate(invalid="ignore"):  # 0 * (-inf - x) where p_ref is 0: counted as 0
        kld = np.sum(np.where(p_ref > 0, p_ref * (lp_ref - lp_test), 0.0), axis=1)
    kld = np.where(np.isnan(kld), kld, np.maximum(kld, 0.0))

    ref_top, ref_margin = _top2(ref)
    test_top, test_margin = _top2(test)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(test, axis=1)
    dots = np.sum(ref * test, axis=1)
    both_zero = ~ref.any(axis=1) & ~test.any(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cosine = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0),
                          np.where(both_zero, 1.0, 0.0))
    return {
        "kld": kld,
        "same_top": ref_top == test_top,
        "ref_top": ref_top,
        "test_top": test_top,
        "dp": p_test[rows, nxt] - p_ref[rows, nxt],
        "abs_dp_top": np.abs(p_test[rows, ref_top] - p_ref[rows, ref_top]),
        "cosine": cosine,
        "ref_margin": ref_margin,
        "test_margin": test_margin,
        "flip_gap": ref[rows, ref_top] - ref[rows, test_top],
        "nll_ref": -lp_ref[rows, nxt],
        "nll_test": -lp_test[rows, nxt],
    }


def mean_and_uncertainty(values: np.ndarray) -> tuple[float, float]:
    """llama's `mean_and_uncertainty`: (mean, sqrt(var_pop / (n − 1))), i.e. the sample standard
    deviation over √n; uncertainty 0 for n <= 10 (too few to say) and (0, 0) for n = 0. The
    variance is Σ(v − mean)²/n, algebraically llama's Σv²/n − mean² without its cancellation."""
    v = np.asarray(values, dtype=np.float64)
    n = v.size
    if n < 1:
        return 0.0, 0.0
    mean = float(np.mean(v))
    var = float(np.mean((v - mean) ** 2))
    return mean, (float(np.sqrt(var / (n - 1))) if var > 0 and n > MIN_UNCERTAINTY else 0.0)


def _covariance(a: np.ndarray, b: np.ndarray) -> float:
    """llama's `covariance` of the two means: (Σab/n − mean_a·mean_b)/(n − 1). llama returns 0
    below 10 positions but its uncertainties are 0 up to 10: at exactly n = 10 that pairs a
    nonzero covariance with zero uncertainties (NaN or a spurious ln-ratio uncertainty). Here 0
    for n <= 10, like the uncertainties."""
    n = a.size
    if n <= MIN_UNCERTAINTY:
        return 0.0
    return float(np.mean((a - a.mean()) * (b - b.mean()))) / (n - 1)


def _percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama's `percentile`: linear interpolation at fraction·(n − 1) of the ascending values
    (NumPy's `method="linear"`); its median (mean of the middle two for even n) is the 0.5
    point of the same rule."""
    return float(np.percentile(sorted_values, 100.0 * fraction, method="linear"))


def summary(metrics: dict[str, np.ndarray]) -> dict:
    """llama-perplexity's `--kl-divergence` statistics of `position_metrics` output (keys:
    `LLAMA_NAMES`; every `*_unc` is the ± beside its value). Also `n`, `mean_abs_dp` (FFAI's
    mean_dp: mean |Δp| of the true token), `nonfinite` (positions whose KLD is NaN or inf) and
    `distribution` (whether the order statistics were computed).

    Below 100 positions llama prints none of its final block ("we do not wish to do statistics
    on so few values"). Here, below 100, the order statistics (min, max, median and the
    percentiles of KLD and Δp) are NaN and `distribution` is False; the means with their
    uncertainties (PPLs, ln ratio, KLD, Δp, RMS Δp, same top p) and the correlation are
    returned, as llama's per-chunk lines report the means at any count.

    Uncertainties: `mean_and_uncertainty` (0 for n <= 10). RMS Δp = sqrt(mean Δp²) ±
    0.5/RMS · unc(mean Δp²) (0 where RMS is 0: llama prints NaN). Same top p = n_same/n ±
    sqrt(p(1 − p)/(n − 1)), llama's formula with no n <= 10 rule (0 for n = 1). PPL = exp(mean
    nll) ± PPL·unc; ln ratio ± sqrt(σ_q² + σ_b² − 2 cov) (clamped at 0 against rounding);
    Cor = cov/(σ_q σ_b), NaN where either σ is 0. Non-finite logits (a broken plan) give NaN or
    inf statistics, counted in `nonfinite`, without warnings."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf − inf where a KLD is inf
        return _summary(metrics)


def _summary(metrics: dict[str, np.ndarray]) -> dict:
    kld = np.asarray(metrics["kld"], dtype=np.float64)
    dp = np.asarray(metrics["dp"], dtype=np.float64)
    nll_q = np.asarray(metrics["nll_test"], dtype=np.float64)
    nll_b = np.asarray(metrics["nll_ref"], dtype=np.float64)
    n = kld.size
    if n == 0:
        raise ValueError("summary of 0 positions: score at least one position")

    s = {"n": n, "distribution": n >= MIN_DISTRIBUTION,
         "nonfinite": int(np.sum(~np.isfinite(kld)))}
    lq, lq_unc = mean_and_uncertainty(nll_q)
    lb, lb_unc = mean_and_uncertainty(nll_b)
    cov = _covariance(nll_q, nll_b)
    s["ppl_q"], s["ppl_q_unc"] = float(np.exp(lq)), float(np.exp(lq)) * lq_unc
    s["ppl_base"], s["ppl_base_unc"] = float(np.exp(lb)), float(np.exp(lb)) * lb_unc
    s["cor_ln_ppl"] = cov / (lq_unc * lb_unc) if lq_unc > 0 and lb_unc > 0 else float("nan")
    s["ln_ppl_ratio"] = lq - lb
    s["ln_ppl_ratio_unc"] = float(np.sqrt(max(0.0, lq_unc ** 2 + lb_unc ** 2 - 2 * cov)))
    s["ppl_ratio"] = float(np.exp(lq - lb))
    s["ppl_ratio_unc"] = s["ppl_ratio"] * s["ln_ppl_ratio_unc"]
    s["ppl_diff"] = s["ppl_q"] - s["ppl_base"]
    s["ppl_diff_unc"] = float(np.sqrt(max(0.0, s["ppl_q_unc"] ** 2 + s["ppl_base_unc"] ** 2
                                          - 2 * s["ppl_q"] * s["ppl_base"] * cov)))

    s["mean_kld"], s["mean_kld_unc"] = mean_and_uncertainty(kld)
    s["mean_dp"], s["mean_dp_unc"] = mean_and_uncertainty(dp)
    mse, mse_unc = mean_and_uncertainty(dp * dp)
    s["rms_dp"] = float(np.sqrt(mse))
    s["rms_dp_unc"] = 0.5 / s["rms_dp"] * mse_unc if s["rms_dp"] > 0 else 0.0
    p = float(np.mean(np.asarray(metrics["same_top"], dtype=bool)))
    s["same_top_p"] = p
    s["same_top_p_unc"] = float(np.sqrt(p * (1 - p) / (n - 1))) if n > 1 else 0.0
    s["mean_abs_dp"] = float(np.mean(np.abs(dp)))

    ks, ds = np.sort(kld), np.sort(dp)
    full = s["distribution"]
    nan = float("nan")
    s["max_kld"], s["min_kld"] = (float(ks[-1]), float(ks[0])) if full else (nan, nan)
    s["max_dp"], s["min_dp"] = (float(ds[-1]), float(ds[0])) if full else (nan, nan)
    for key, f in KLD_PERCENTILES:
        s[key] = _percentile(ks, f) if full else nan
    for key, f in DP_PERCENTILES:
        s[key] = _percentile(ds, f) if full else nan
    return s


def summary_line(label: str, s: dict) -> str:
    """FFAI's summary line (`KLDivergence.swift`): mean_dp there is the mean |Δp| of the true
    token (`mean_abs_dp`). The order statistics print `nan` below 100 positions."""
    return (f"{label}: mean_kld={s['mean_kld']:.4f} med={s['median_kld']:.4f} "
            f"95%={s['kld_95']:.4f} 99%={s['kld_99']:.4f} 99.9%={s['kld_99_9']:.4f} "
            f"max={s['max_kld']:.4f} same_top={s['same_top_p']:.4f} "
            f"mean_dp={s['mean_abs_dp']:.4f} n={s['n']}")


def _flip_bound(metrics: dict[str, np.ndarray], margin_bound) -> tuple[np.ndarray, np.ndarray]:
    """(flipped positions mask, the bound broadcast to [T]), checking the bound."""
    flipped = ~np.asarray(metrics["same_top"], dtype=bool)
    bound = np.asarray(margin_bound, dtype=np.float64)
    if bound.ndim > 1 or (bound.ndim == 1 and bound.shape != flipped.shape):
        raise ValueError(f"margin_bound must be a scalar or [T] = [{flipped.size}], got shape "
                         f"{bound.shape}")
    if np.isnan(bound).any() or (bound < 0).any():
        raise ValueError("margin_bound must be >= 0 everywhere (a bound on how far the per-op "
                         "tolerances move a logit difference), got NaN or a negative value")
    return flipped, np.broadcast_to(bound, flipped.shape)


def flips(metrics: dict[str, np.ndarray], margin_bound) -> np.ndarray:
    """Positions (ascending int indices) whose top-token flip is a failure.

    Rule (near-tie aware, as the lm_head gate's `oracle.metrics.logit_metrics`): at position t
    the test plan picks j, the reference i ≠ j. `margin_bound[t]` (scalar or [T], supplied by
    the caller) bounds how far the per-op tolerances can move a difference of two logits at t
    (for a per-logit bound b_t, pass 2·b_t, the lm_head gate's bound[i] + bound[j]). If the
    reference's own gap l_i − l_j (`flip_gap`) is <= that bound, a plan within its tolerances
    could have swapped them: a near-tie, excused (`near_ties`). If the gap exceeds the bound,
    the flip fails. The gap to the test's pick is at least the reference's top1 − top2 margin
    and equals it when the test picks the runner-up (the usual flip); using the gap means a
    close runner-up never excuses a jump to a token far down the list."""
    flipped, bound = _flip_bound(metrics, margin_bound)
    gap = np.asarray(metrics["flip_gap"], dtype=np.float64)
    return np.flatnonzero(flipped & ~(gap <= bound))


def near_ties(metrics: dict[str, np.ndarray], margin_bound) -> np.ndarray:
    """Positions whose top-token flip `flips` excuses (flip_gap <= margin_bound[t]): recorded,
    not failed."""
    flipped, bound = _flip_bound(metrics, margin_bound)
    gap = np.asarray(metrics["flip_gap"], dtype=np.float64)
    return np.flatnonzero(flipped & (gap <= bound))


# The near-tie band of the model gate, in standard deviations of the logit-difference
# perturbation the gate's KLD bound admits (`margin_bound`).
MARGIN_SIGMAS = 4.0


def margin_bound(max_mean_kld: float = 1e-4) -> float:
    """How far a plan that the gate's KLD bound admits may move the difference of two logits:
    the `margin_bound` of `flips` for the model gate (a scalar, the same at every position).

    By `gate`'s second-order relation KLD = ½ Var_p(δ), the bound admits a logit perturbation
    of RMS σ = √(2·max_mean_kld) (0.014 nats at 1e-4); the difference of two perturbed logits
    then has RMS √2·σ, and a flip between tokens whose reference gap is within MARGIN_SIGMAS
    of those (4·√2·σ = 8·√max_mean_kld: 0.08 nats at 1e-4) is what such a perturbation does:
    a near tie, excused. A wider gap flipped means a perturbation 4 σ beyond what the gate
    admits at that position: it fails, whatever the mean KLD says.

    Not a bound composed from the per-op tolerances: those bound each op given its inputs,
    and how their errors grow through 30 layers depends on the model's gains, which nothing
    here bounds; the KLD bound is the perturbation the gate already accepts."""
    return MARGIN_SIGMAS * math.sqrt(2.0) * math.sqrt(2.0 * max_mean_kld)


def gate(s: dict, failed_flips, max_mean_kld: float = 1e-4,
         min_same_top: float = 0.99, near_ties: int = 0) -> tuple[bool, list[str]]:
    """The model gate: (ok, reasons it failed). Passes when mean KLD <= `max_mean_kld`, same top
    p >= `min_same_top` with the `near_ties` flips (`near_ties`: within `margin_bound`)
    counted as agreeing, and no flip failed (`flips`). A NaN mean KLD (non-finite logits)
    fails. The reported same top p is llama-perplexity's, every flip counted.

    Why 1e-4 and 99 % for an oracle-exact-rounding plan (its kernels round where the contracts
    say, so it differs from the float64 reference only by f32 vs float64 arithmetic and by a
    rounding point landing on the other side of a T boundary where the f32 value sits within
    its own error of one):

    * KLD of a logit perturbation δ: to second order KL(P ‖ softmax(l + δ)) = ½ Var_p(δ), the
      p-weighted variance of δ (a shift common to all logits costs nothing). For independent
      relative errors δ_i = ε_i·l_i of RMS ε this is ½ ε² Σ_i p_i (1 − p_i) l_i² <= ½ ε² L²,
      L the magnitude of the logits that hold the probability mass. (Checked numerically on a
      49152-token vocabulary: ½ Var_p(δ) matched the exact KL to a few percent.)
    * Mean KLD 1e-4 is therefore Var_p(δ) = 2e-4: an RMS logit perturbation of 0.014 nats,
      ε ≈ 7e-4 relative at L = 20. One round-to-nearest of every logit has an RMS relative error
      of about spacing/√12 averaged over the binade: ≈ 1.6e-3 for bf16 (8-bit significand,
      u = 2^-8) and ≈ 2e-4 for f16 (u = 2^-11). At L = 20 that is a KLD of ≈ 5e-4 (bf16,
      fails) and ≈ 1e-5 (f16, passes with 10x room): 1e-4 sits between one bf16 and one f16
      rounding of the logits.
    * The exact-rounding plan's own sources are far below it: f32 accumulation (u = 6e-8,
      √K growth, ~1e-6 relative at K = 576) gives ~1e-10; a rounding point flips in T on a
      fraction ≈ 2·(f32 error)/(T spacing) of its elements (≈ 4e-4 for bf16), one ulp each,
      i.e. a relative noise of ≈ √4e-4 · 2^-7 ≈ 1.6e-4 per bf16 rounding point (≈ 5e-5 for f16).
      How those add up through 30 layers depends on the model's gains, which this estimate does
      not know; the bound leaves them a factor ~4 in ε (~20 in KLD) for bf16, ~14 for f16.
      A wrong kernel (a group's scale off by one) moves logits by O(0.1-1) nats: KLD 1e-2 or
      more, orders of magnitude above the bound.
    * Same top p >= 99 %: a perturbation of RMS σ flips the top token only where the reference's
      top1 − top2 margin is below about √2·σ (the difference of two perturbed logits). At the
      KLD bound (σ ≈ 0.014 nats) that is margins below ≈ 0.02 nats: a fraction f_m(0)·0.02 of
      positions, f_m(0) the density of margins at 0 per nat; for margins spread over a few nats
      (f_m(0) <= 0.5) it is <= 1 %, so 99 % is the same-top rate consistent with the KLD bound
      (check f_m(0) on the text set with `ref_margin`). On fewer than 100 positions 99 %
      would allow no flip at all, and a correct plan meets a near tie sooner or later: the
      near ties (`margin_bound`) count as agreeing, every other flip fails regardless
      (`flips`)."""
    reasons = []
    failed = np.asarray(failed_flips, dtype=np.int64)
    kld, unc = s["mean_kld"], s["mean_kld_unc"]
    if not kld <= max_mean_kld:
        extra = f" ({s['nonfinite']} positions with non-finite KLD)" if s.get("nonfinite") else ""
        reasons.append(f"mean KLD {kld:.3g} ± {unc:.2g} > {max_mean_kld:.3g}{extra}")
    same = s["same_top_p"] + (near_ties / s["n"] if s.get("n") else 0.0)
    if not same >= min_same_top:
        excused = f" ({near_ties} near ties counted as agreeing)" if near_ties else ""
        reasons.append(f"same top p {100 * same:.2f} ± {100 * s['same_top_p_unc']:.2f} % < "
                       f"{100 * min_same_top:.2f} %{excused}")
    if failed.size:
        shown = ", ".join(str(int(t)) for t in failed[:8]) + (", ..." if failed.size > 8 else "")
        reasons.append(f"{failed.size} top-token flips beyond the margin bound at positions "
                       f"{shown}")
    return not reasons, reasons
