"""Results history: series from store rows, the z-score and step detectors on planted changes and
on pure noise, and annotations that accept a change and reset the baseline."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from results import history
from results.history import SeriesKey, detect, judge_last, regressions, series
from results.store import Store

N_RUNS, STEP_AT, CV = 30, 20, 0.03


def noisy(seed: int, n: int = N_RUNS, level: float = 1000.0) -> np.ndarray:
    return level * (1 + CV * np.random.default_rng(seed).standard_normal(n))


def planted_step(seed: int, factor: float = 1.08) -> np.ndarray:
    x = noisy(seed)
    x[STEP_AT:] *= factor
    return x


# --- detect on synthetic series ----------------------------------------------------------------

def test_planted_8pct_slowdown_is_flagged_at_its_first_run_by_the_step_detector():
    """One point of an 8 % step in 3 % noise is 2.7 sigma off: only the step detector (a level
    shift over the following runs) can see it, and it reports the run the new level starts."""
    for seed in (1, 2, 3):
        found = detect(planted_step(seed))
        assert [(d.index, d.kind, d.direction) for d in found] == \
            [(STEP_AT, "step", "regression")], (seed, found)
        assert 0.05 < found[0].change < 0.11 and found[0].z >= 5
        # The z-score alone flags nothing here.
        assert not [i for i in range(N_RUNS) if history.lookback(planted_step(seed), i)]


def test_planted_step_is_found_at_or_next_to_its_run_in_most_draws():
    indices = [[d.index for d in detect(planted_step(100 + s))] for s in range(50)]
    exact = sum(ix == [STEP_AT] for ix in indices)
    near = sum(len(ix) == 1 and abs(ix[0] - STEP_AT) <= 1 for ix in indices)
    assert exact >= 30 and near >= 42, (exact, near)


def test_a_speedup_is_an_improvement():
    found = detect(planted_step(1, factor=0.9))
    assert [(d.index, d.direction) for d in found] == [(STEP_AT, "improvement")]


def test_planted_budget_jump_is_flagged_at_its_run():
    """Budgets are bit-identical run to run (std 0): the floor keeps z finite."""
    values = [0.12] * STEP_AT + [0.31] * (N_RUNS - STEP_AT)
    found = detect(values, **history.detect_kwargs("budget"))
    assert [(d.index, d.kind, d.direction) for d in found] == [(STEP_AT, "step", "regression")]
    assert found[0].baseline == pytest.approx(0.12) and found[0].value == pytest.approx(0.31)
    # The z-score sees the jump's first run too: the std of 20 equal budgets is 0, floored at
    # the budget's 0.01, so z = (0.31 - 0.12) / 0.01 ...
    assert history.lookback(values, STEP_AT, **history.detect_kwargs("budget")).z == \
        pytest.approx(19)
    # ... and a jump in the last run, before any step can be seen, is the z-score's.
    late = [0.12] * 29 + [0.31]
    assert [(d.index, d.kind) for d in detect(late, **history.detect_kwargs("budget"))] == \
        [(29, "zscore")]


def test_tiny_budgets_moving_in_the_last_bits_are_not_flagged():
    values = [1e-9] * 20 + [3e-9] * 10
    assert detect(values, **history.detect_kwargs("budget")) == []
    assert detect([0.12] * 20 + [0.1203] * 10, **history.detect_kwargs("budget")) == []


def test_pure_noise_raises_at_most_one_alarm_in_100_series():
    alarms = [(seed, d.index, d.kind) for seed in range(100) for d in detect(noisy(seed))]
    assert len(alarms) <= 1, alarms


def test_false_alarm_rate_over_1000_series():
    """The docstring's rate, 0.3 per 100 series, and why min_history is 10: a 5-run baseline
    raises about 2 per 100 (18 here)."""
    xs = [noisy(seed) for seed in range(1000, 2000)]
    assert sum(len(detect(x)) for x in xs) <= 4
    assert sum(len(detect(x, min_history=5)) for x in xs) >= 10


def test_short_history_and_min_history():
    values = [1.0] * 6 + [1.5]
    assert detect(values) == []  # 6 points of history < min_history 10
    assert [d.index for d in detect(values, min_history=5)] == [6]
    assert judge_last(values).verdict == "short"
    assert judge_last(values, min_history=5).verdict == "regression"


def test_resets_start_a_new_baseline():
    x = planted_step(1)
    assert detect(x, resets=[STEP_AT]) == []  # the step is the reset itself
    # A 10 % spike on the new level, compared with the new level: flagged, at its index.
    y = np.concatenate([x, 1.08 * 1000 * np.ones(12)])
    y[-1] = 1.08 * 1000 * 1.25
    found = detect(y, resets=[STEP_AT])
    assert [(d.index, d.kind) for d in found] == [(len(y) - 1, "zscore")]
    assert found[0].baseline == pytest.approx(np.mean(y[STEP_AT:-1]))


def test_judge_last_compares_with_the_level_after_a_detected_step():
    x = list(planted_step(1)) + [1000 * 1.08]
    last = judge_last(x, min_history=5)
    assert last.verdict == "same" and last.n_baseline == len(x) - 1 - STEP_AT
    assert abs(last.change) < 0.05


# --- series and regressions from store rows ----------------------------------------------------

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def run_id(i: int) -> str:
    return (T0 + timedelta(hours=i)).strftime("%Y%m%dT%H%M%SZ") + f"-{i:06x}"


def write_history(store: Store, medians, budgets, impl="torch:rms_norm", case="c1",
                  device="cpu", first_run: int = 0) -> None:
    for i, (m, b) in enumerate(zip(medians, budgets), start=first_run):
        rid = run_id(i)
        store.write("runs", [{"run_id": rid, "started": T0 + timedelta(hours=i), "verb": "bench",
                              "devices": '{"torch": "%s"}' % device}], rid, 0)
        common = {"run_id": rid, "case_id": case, "impl": impl, "op": "rms_norm",
                  "backend": impl.split(":")[0], "device": device, "dtype": "bf16",
                  "label": "bench:decode-1x4096"}
        store.write("bench", [
            {**common, "mode": "wall", "arm": "", "status": "ok", "median_ns": m,
             "q1_ns": 0.99 * m, "q3_ns": 1.01 * m, "samples_ns": [m]},
            # A second plain row in the run: the point is the median of the two.
            {**common, "mode": "wall", "arm": "", "status": "ok", "median_ns": m * 1.002,
             "q1_ns": 0.99 * m, "q3_ns": 1.01 * m},
            # A/B arms and untimed rows are not history.
            {**common, "mode": "wall", "arm": "B", "ab_id": "x", "status": "ok",
             "median_ns": 5 * m},
            {**common, "mode": "wall", "arm": "", "status": "error", "median_ns": None}], rid, 1)
        store.write("correctness", [{**common, "label": "preset:qwen3", "expect": "valid",
                                     "status": "pass" if b <= 1 else "fail", "budget": b}], rid,
                    2)


def test_series_from_store_rows(tmp_path):
    store = Store(tmp_path)
    write_history(store, [100.0, 110.0, 120.0], [0.1, 0.2, 0.3])
    write_history(store, [7.0], [0.5], impl="cuda:kp", device="cuda:0 NVIDIA H100 80GB HBM3",
                  first_run=3)
    got = series(store, "median_ns", impl="torch:rms_norm")
    assert len(got) == 1
    s = got[0]
    assert s.key == SeriesKey("median_ns", "torch:rms_norm", "c1", "wall", "cpu")
    assert (s.op, s.dtype, s.label) == ("rms_norm", "bf16", "bench:decode-1x4096")
    assert [p.run_id for p in s.points] == [run_id(0), run_id(1), run_id(2)]
    assert [p.value for p in s.points] == pytest.approx([100.1, 110.11, 120.12])
    assert s.points[1].lo == pytest.approx(108.9) and s.points[1].hi == pytest.approx(111.1)
    assert s.points[2].started == T0 + timedelta(hours=2)
    budgets = series(store, "budget")
    assert [(b.key.impl, b.key.mode, [p.value for p in b.points]) for b in budgets] == \
        [("cuda:kp", "", [0.5]), ("torch:rms_norm", "", [0.1, 0.2, 0.3])]
    assert [b.key.device for b in series(store, "budget", device="cpu")] == ["cpu"]
    with pytest.raises(ValueError):
        series(store, "p99")


def test_regressions_finds_planted_changes_in_store_history(tmp_path):
    store = Store(tmp_path)
    budgets = [0.12] * STEP_AT + [0.31] * (N_RUNS - STEP_AT)
    write_history(store, planted_step(2), budgets)
    alerts = regressions(store)
    assert [(a.key.metric, a.index, a.run_id, a.kind, a.direction, a.accepted_by)
            for a in alerts] == [
        ("median_ns", STEP_AT, run_id(STEP_AT), "step", "regression", None),
        ("budget", STEP_AT, run_id(STEP_AT), "step", "regression", None)]
    # Only the last 12 runs: the step is 2 runs in, too short a history to see it.
    assert regressions(store, baseline=12) == []
    assert regressions(store, impl="torch:other") == []


def accept(store: Store, target: str, at: int, reason: str, metric: str = "") -> None:
    store.write("annotations", [{"run_id": run_id(at), "created": T0, "kind": "accept",
                                 "target": target, "metric": metric, "reason": reason}],
                f"a{at}-{target.replace(':', '_')}", 0)


def test_accepted_step_is_no_regression_and_later_points_see_the_new_level(tmp_path):
    store = Store(tmp_path)
    medians = list(planted_step(2))
    # A 25 % slowdown on the new level in the last run: a regression against the new level.
    medians += [1080.0] * 11 + [1080.0 * 1.25]
    write_history(store, medians, [0.12] * len(medians))
    before = regressions(store, metrics=("median_ns",))
    # The detected step already restarts the z-score's baseline: the last run is flagged.
    assert [(a.index, a.kind, a.accepted_by) for a in before] == [
        (STEP_AT, "step", None), (len(medians) - 1, "zscore", None)]

    accept(store, "torch:rms_norm", STEP_AT, "new tiling, slower on CPU")
    after = regressions(store, metrics=("median_ns",))
    assert [(a.index, a.kind, a.accepted_by) for a in after] == [
        (STEP_AT, "step", "new tiling, slower on CPU"),
        (len(medians) - 1, "zscore", None)]
    # Compared with the new level only (a point is the median of its run's two rows: m, 1.002 m).
    assert after[1].baseline == pytest.approx(1.001 * np.mean(medians[STEP_AT:-1]))


def test_accept_after_the_step_became_visible_covers_the_step(tmp_path):
    """`kparity accept` defaults to the newest run: the step started some runs before it."""
    store = Store(tmp_path)
    write_history(store, planted_step(2), [0.12] * N_RUNS)
    accept(store, "c1", N_RUNS - 1, "known", metric="median_ns")
    alerts = regressions(store)
    assert [(a.index, a.accepted_by) for a in alerts] == [(STEP_AT, "known")]
    # An annotation for another metric or target changes nothing.
    store2 = Store(tmp_path / "other")
    write_history(store2, planted_step(2), [0.12] * N_RUNS)
    accept(store2, "c1", STEP_AT, "budget only", metric="budget")
    accept(store2, "torch:other", STEP_AT, "another impl")
    assert [(a.index, a.accepted_by) for a in regressions(store2)] == [(STEP_AT, None)]


# --- repro runs and retired impls (issue 25) ---------------------------------------------------

NORM, MUTANT, GEMV = "torch:rms_norm", "torch:mutant_rms", "torch:dequant_linear"


def write_sweep(store: Store, i: int, verb: str, rows: list[tuple], impls=None) -> str:
    """A run of `verb` with rows (impl, op, case, status, budget) on cpu; `impls`: its
    `--impl` filter (None: every impl of its ops)."""
    rid = run_id(i)
    store.write("runs", [{"run_id": rid, "started": T0 + timedelta(hours=i), "verb": verb,
                          "command": f"kparity {verb}", "devices": '{"torch": "cpu"}',
                          "filters": json.dumps({"op": None, "impl": impls})}], rid, 0)
    store.write("correctness", [
        {"run_id": rid, "case_id": case, "impl": impl, "op": op, "backend": "torch",
         "device": "cpu", "dtype": "bf16", "dist": "normal", "dims": "{}",
         "label": f"preset:{case}", "expect": "valid", "status": status, "budget": budget}
        for impl, op, case, status, budget in rows], rid, 1)
    return rid


def sweeps_with_a_plugin_impl_and_a_repro(store: Store) -> None:
    """0: a sweep of rms_norm (with a plugin's impl) and GEMV; 1: a repro of one rms_norm case,
    failing; 2: a check of --impl torch:rms_norm only; 3: a sweep of rms_norm alone, without
    the plugin."""
    write_sweep(store, 0, "check", [(NORM, "rms_norm", "c0", "pass", 0.1),
                                    (NORM, "rms_norm", "c1", "pass", 0.1),
                                    (MUTANT, "rms_norm", "c0", "fail", 3.0),
                                    (MUTANT, "rms_norm", "c1", "pass", 0.4),
                                    (GEMV, "qgemv", "g0", "pass", 0.2)])
    write_sweep(store, 1, "repro", [(NORM, "rms_norm", "c0", "fail", 9.0)], impls=[NORM])
    write_sweep(store, 2, "check", [(NORM, "rms_norm", "c0", "pass", 0.2)], impls=[NORM])
    write_sweep(store, 3, "check", [(NORM, "rms_norm", "c0", "pass", 0.3)])


def test_repro_runs_are_no_point_of_a_series(tmp_path):
    store = Store(tmp_path)
    sweeps_with_a_plugin_impl_and_a_repro(store)
    got = {s.key.case_id: [(p.run_id, p.value) for p in s.points]
           for s in series(store, "budget", impl=NORM)}
    assert got == {"c0": [(run_id(0), 0.1), (run_id(2), 0.2), (run_id(3), 0.3)],
                   "c1": [(run_id(0), 0.1)]}


def test_sql_views_leave_out_repro_runs_and_retired_impls(tmp_path):
    pytest.importorskip("duckdb")
    from results.query import query

    store = Store(tmp_path)
    sweeps_with_a_plugin_impl_and_a_repro(store)
    _, hist = query(store, f"SELECT run_id, value FROM history WHERE impl = '{NORM}' AND "
                           "case_id = 'c0' ORDER BY run_id")
    assert hist == [(run_id(0), 0.1), (run_id(2), 0.2), (run_id(3), 0.3)]
    _, latest = query(store, "SELECT impl, case_id, run_id, status FROM latest ORDER BY ALL")
    # The plugin's impl: absent from sweep 3, which ran every rms_norm impl registered then.
    # The GEMV: sweep 3 did not run its op. c1 of torch:rms_norm: its newest row is sweep 0's.
    assert latest == [(GEMV, "g0", run_id(0), "pass"), (NORM, "c0", run_id(3), "pass"),
                      (NORM, "c1", run_id(0), "pass")]
    # Without sweep 3, the check of --impl torch:rms_norm proves nothing about the plugin's.
    store2 = Store(tmp_path / "before")
    write_sweep(store2, 0, "check", [(MUTANT, "rms_norm", "c0", "fail", 3.0)])
    write_sweep(store2, 2, "check", [(NORM, "rms_norm", "c0", "pass", 0.2)], impls=[NORM])
    _, kept = query(store2, "SELECT impl, run_id FROM latest ORDER BY ALL")
    assert kept == [(MUTANT, run_id(0)), (NORM, run_id(2))]
