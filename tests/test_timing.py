"""The timing layer on CPU: statistics, the stopping rule, the modes over a fake timer, the work
model, and `kparity bench` / `kparity ab` end to end on torch CPU and MLX CPU."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow.dataset as ds
import pytest

from cases.model import Case, make_inputs
from gpu_impls.timer import Timer
from results.schema import AB, BENCH, CEILINGS
from runners.abstats import aa_noise, bootstrap_ratio, compare_runs, summarize, verdict
from runners.bench import work_model
from verbs.cli import main
from runners.stopping import StdRel
from runners.timing import measure, rotation_sets

# --- A/B statistics on synthetic run medians ------------------------------------------------------

RUN_NOISE = 0.005  # 0.5 % run-to-run spread: graph_rot on a quiet GPU


def _runs(rng, scale, n=5, sigma=RUN_NOISE):
    return 10e-6 * scale * np.exp(rng.normal(0.0, sigma, n))


@pytest.mark.parametrize("shift, expected", [(0.95, "FASTER"), (1.05, "SLOWER")])
def test_a_five_percent_shift_is_detected(shift, expected):
    rng = np.random.default_rng(1)
    verdicts = Counter(compare_runs(_runs(rng, 1.0), _runs(rng, shift), seed=t)["verdict"]
                       for t in range(100))
    assert verdicts[expected] >= 95, verdicts


def test_pure_noise_is_same_in_95_of_100_trials():
    rng = np.random.default_rng(2)
    verdicts = Counter(compare_runs(_runs(rng, 1.0), _runs(rng, 1.0), seed=t)["verdict"]
                       for t in range(100))
    assert verdicts["SAME"] >= 95, verdicts


def test_noisy_runs_widen_delta_instead_of_calling_a_winner():
    """At 3 % run-to-run noise a 2 % shift must not be called FASTER: delta follows the noise."""
    rng = np.random.default_rng(3)
    rows = [compare_runs(_runs(rng, 1.0, sigma=0.03), _runs(rng, 0.98, sigma=0.03), seed=t)
            for t in range(100)]
    assert all(r["delta"] > 0.02 for r in rows)
    assert sum(r["verdict"] == "FASTER" for r in rows) <= 10


def test_verdict_rules():
    assert verdict(0.90, 0.88, 0.92, 0.02) == "FASTER"
    assert verdict(1.10, 1.08, 1.12, 0.02) == "SLOWER"
    assert verdict(1.00, 0.99, 1.01, 0.02) == "SAME"
    assert verdict(0.99, 0.985, 0.995, 0.02) == "SAME"        # excludes 1, but within delta
    assert verdict(0.97, 0.90, 1.04, 0.02) == "AMBIGUOUS"     # CI straddles 1 and delta
    assert verdict(0.985, 0.975, 0.995, 0.02) == "AMBIGUOUS"  # excludes 1, below delta, CI out


def test_bootstrap_ratio_brackets_the_ratio_of_medians():
    a = [10.0, 10.1, 9.9, 10.05, 9.95]
    b = [v * 1.2 for v in a]
    ratio, lo, hi = bootstrap_ratio(a, b)
    assert ratio == pytest.approx(1.2)
    assert lo <= ratio <= hi and hi - lo < 0.05


def test_aa_noise_is_the_mad_of_consecutive_log_ratios():
    a = np.array([1.0, 1.01, 1.0, 1.01, 1.0])
    expected = np.median(np.abs(np.diff(np.log(a)) - np.median(np.diff(np.log(a)))))
    assert aa_noise(a) == pytest.approx(expected)
    assert aa_noise([1.0, 1.0, 1.0]) == 0.0


def test_summarize():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median"] == 3.0 and s["min"] == 1.0 and s["q1"] == 2.0 and s["q3"] == 4.0
    assert s["rel_iqr"] == pytest.approx(2 / 3)


# --- the stopping rule ----------------------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_stdrel_needs_min_time_and_samples_then_converges():
    clock = FakeClock()
    stop = StdRel(min_time_s=0.5, min_samples=10, clock=clock)
    rng = np.random.default_rng(0)
    n = 0
    while not stop.add(1e-3 * (1 + 0.001 * rng.standard_normal()), calls=10):
        n += 1
        clock.t += 0.011
    assert stop.reason == "converged"
    assert stop.samples >= 10 and stop.measured_s >= 0.5
    assert stop.samples == 50  # 0.5 s / (10 calls x 1 ms)


def test_stdrel_stops_on_a_noise_plateau():
    clock = FakeClock()
    stop = StdRel(min_time_s=0.0, clock=clock)
    rng = np.random.default_rng(0)
    while not stop.add(1e-3 * (1 + 0.05 * rng.standard_normal())):
        clock.t += 0.001
    assert stop.reason == "plateau" and stop.noise > 0.005


def test_stdrel_times_out():
    clock = FakeClock()
    stop = StdRel(timeout_s=1.0, clock=clock)
    stop.start()
    samples = 0
    while not stop.add(1e-3 * (1 + (samples % 2))):  # 50 % noise, never converges
        samples += 1
        clock.t += 0.1
    assert stop.reason == "timeout" and samples <= 11


# --- the modes over a fake timer --------------------------------------------------------------------

class FakeTimer(Timer):
    """Per call 1 us of 'device time'; the SM clock dips under the floor on every 5th read."""

    kind = "fake"
    modes = ("graph_rot", "cold", "eager")
    min_calls = 50

    def __init__(self):
        self.sequences = []
        self.reads = 0
        self.flushes = 0

    def cache_bytes(self):
        return 1 << 20

    def memory_budget(self):
        return 64 << 20

    def sequence(self, calls, capture=True):
        self.sequences.append(len(calls))
        return lambda: [c() for c in calls]

    def elapsed(self, fn):
        before = COUNT["calls"]
        fn()
        return 1e-6 * (COUNT["calls"] - before)

    def flush(self):
        self.flushes += 1

    def clocks(self):
        self.reads += 1
        return (1000.0 if self.reads % 5 == 0 else 1980.0), 3200.0

    def throttle_floor_mhz(self):
        return 0.75 * 1980.0


COUNT = {"calls": 0}


def _call():
    COUNT["calls"] += 1


def _stop():
    return StdRel(min_time_s=0.0, min_samples=10, timeout_s=5.0)


def test_graph_rot_rotates_sets_and_drops_throttled_samples():
    timer = FakeTimer()
    calls = [_call] * 3
    m = measure(timer, "graph_rot", calls, _stop())
    assert m.calls_per_sample % 3 == 0 and m.calls_per_sample >= 50
    assert timer.sequences == [m.calls_per_sample]
    assert all(s == pytest.approx(1e-6) for s in m.samples_s)
    assert m.n_dropped >= 2 and len(m.samples_s) >= 10
    assert m.sm_clock_mhz == 1980.0 and m.n_warmup >= 3


def test_cold_flushes_before_every_sample():
    timer = FakeTimer()
    m = measure(timer, "cold", [_call], _stop())
    assert timer.flushes == len(m.samples_s) + m.n_dropped


def test_a_mode_the_timer_lacks_is_refused():
    with pytest.raises(ValueError, match="wall_eval"):
        measure(FakeTimer(), "wall_eval", [_call], _stop())


def test_rotation_sets_overflow_four_times_the_cache_within_the_budget():
    timer = FakeTimer()  # 1 MiB cache, 64 MiB budget
    assert rotation_sets(1 << 18, timer) == 16        # 16 x 256 KiB = 4 MiB
    assert rotation_sets(8 << 20, timer) == 1         # one set already overflows the cache
    assert rotation_sets(1 << 10, timer) == 1024  # the host cap
    assert rotation_sets(1 << 22, timer) == 1


# --- the work model ----------------------------------------------------------------------------------

def test_work_model_counts_each_input_once_and_flags_cache_residency():
    case = Case.make("rms_norm", {"rows": 2048, "n": 4096}, "bf16")
    nbytes = case.spec.bytes(case)
    assert nbytes == 2048 * 4096 * 2 * 2 + 4096 * 2  # x read, out written, w read
    row = {"bytes_model": nbytes, "flops_model": case.spec.flops(case)}
    work_model(row, 10e-6, {"peak_bw_spec_gbps": 4800.0, "copy_gbps": 4000.0})
    assert row["gbps"] == pytest.approx(nbytes / 10e-6 / 1e9)
    assert row["pct_copy_ceiling"] == pytest.approx(100 * row["gbps"] / 4000.0)
    assert not row["cache_resident"]  # 33.6 MB in 10 us: 3.36 TB/s, under the 4.8 TB/s peak
    row2 = dict(row)
    work_model(row2, 5e-6, {"peak_bw_spec_gbps": 4800.0, "copy_gbps": 4000.0})
    assert row2["cache_resident"]


# --- the verbs end to end on CPU backends -------------------------------------------------------------

FAST = ["--min-time", "0.02", "--min-samples", "5", "--timeout", "1"]


def _table(store, name, schema):
    files = sorted(str(p) for p in (store / name).glob("date=*/*.parquet"))
    assert files, f"no {name} parts written"
    table = ds.dataset(files, format="parquet").to_table()
    assert table.schema.equals(schema, check_metadata=False)
    return table.to_pylist()


@pytest.fixture
def small_cache(monkeypatch):
    """A 4 MiB host cache: 4 rotating sets of a 64x4096 case instead of ~1000 over a 480 MiB L3
    (2 GB of traffic per sample, minutes per test on a busy 2-core machine). The rotation, its
    count rule and every other step of the protocol are unchanged; `rotation_sets` is tested
    on its own above."""
    monkeypatch.setattr("gpu_impls.timer._cpu_cache_bytes", lambda: 4 << 20)


def test_bench_on_torch_and_mlx_cpu_writes_rows_with_samples(tmp_path, capsys, small_cache):
    pytest.importorskip("mlx.core")
    rc = main(["--store", str(tmp_path), "bench", "--impl", "torch:rms_norm,mlx:rms_norm_f32",
               "--preset", "decode-64x4096", "--dtype", "bf16", *FAST[:-1], "15",
               "--max-noise", "0.5"])  # >= 5 samples even on a busy machine, seconds when idle
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = _table(tmp_path, "bench", BENCH)
    assert {(r["impl"], r["mode"]) for r in rows} == {("torch:rms_norm", "wall"),
                                                     ("mlx:rms_norm_f32", "wall_eval")}
    for r in rows:
        assert r["status"] == "ok" and r["correct"] == "pass"
        assert len(r["samples_ns"]) == r["n_samples"] >= 5
        assert r["median_ns"] > 0 and r["gbps"] > 0 and r["pct_copy_ceiling"] > 0
        assert r["calls_per_sample"] % r["n_sets"] == 0
    mlx = next(r for r in rows if r["impl"].startswith("mlx"))
    assert mlx["calls_per_sample"] >= 64  # wall_eval amortises the per-eval sync
    ceilings = _table(tmp_path, "ceilings", CEILINGS)
    assert {c["backend"] for c in ceilings} == {"torch", "mlx"}
    assert all(c["copy_gbps"] > 0 for c in ceilings)
    assert "bench" in out and "decode-64x4096" in out


def test_ab_same_impl_twice_is_not_a_difference(tmp_path, capsys, small_cache):
    rc = main(["--store", str(tmp_path), "ab", "torch:rms_norm", "torch:rms_norm",
               "--preset", "decode-64x4096", "--dtype", "f32", "--runs", "5", *FAST,
               "--max-noise", "0.5"])  # CPU noise never reaches 0.5 %: each run would wait 1 s
    out = capsys.readouterr().out
    assert rc == 0, out
    (row,) = _table(tmp_path, "ab", AB)
    assert row["status"] == "ok" and row["correct_a"] == row["correct_b"] == "pass"
    assert row["ab_max_ulp"] == 0 and row["ab_max_abs"] == 0.0
    assert len(row["runs_a_ns"]) == len(row["runs_b_ns"]) == 5
    assert row["ci_lo"] <= row["ratio"] <= row["ci_hi"] and row["delta"] >= 0.02
    assert row["verdict"] in ("SAME", "AMBIGUOUS", "FASTER", "SLOWER")  # CPU timing: no claim
    runs = _table(tmp_path, "bench", BENCH)
    assert [r["arm"] for r in sorted(runs, key=lambda r: (r["rep"], r["arm"]))] == ["A", "B"] * 5
    assert "verdict" in out


def test_ab_no_verify_skips_the_oracle_and_still_compares_the_arms(tmp_path, capsys,
                                                                   small_cache, monkeypatch):
    import runners.ab

    def no_oracle(*_):
        raise AssertionError("the oracle ran under --no-verify")
    monkeypatch.setattr(runners.ab, "correctness", no_oracle)
    rc = main(["--store", str(tmp_path), "ab", "torch:rms_norm", "torch:rms_norm",
               "--preset", "decode-64x4096", "--dtype", "f32", "--runs", "5", *FAST,
               "--max-noise", "0.5", "--no-verify"])
    assert rc == 0, capsys.readouterr().out
    (row,) = _table(tmp_path, "ab", AB)
    assert row["correct_a"] == row["correct_b"] == "unverified"
    assert row["ab_max_ulp"] == 0 and len(row["runs_b_ns"]) == 5  # A against B still ran


def test_ab_refuses_to_mix_timers(tmp_path, capsys):
    pytest.importorskip("mlx.core")
    rc = main(["--store", str(tmp_path), "ab", "torch:rms_norm", "mlx:rms_norm_f32", *FAST])
    out = capsys.readouterr().out
    assert rc == 2 and "one mode on one kind of timer" in out


def test_ab_refuses_two_ops(tmp_path, capsys):
    rc = main(["--store", str(tmp_path), "ab", "torch:rms_norm", "torch:add_rms_norm"])
    assert rc == 2 and "two impls of one op" in capsys.readouterr().out


def test_bench_unknown_preset_lists_bench_presets(tmp_path, capsys):
    rc = main(["--store", str(tmp_path), "bench", "--impl", "torch:rms_norm", "--preset", "hbn"])
    out = capsys.readouterr().out
    assert rc == 2 and "hbm-65536x4096" in out


class _CommandBuffer:
    """Stands in for a committed MTLCommandBuffer: 2 us of GPU time, once waited on."""

    def __init__(self, start):
        self.start, self.waited = start, False

    def waitUntilCompleted(self):
        self.waited = True

    def GPUStartTime(self):
        return self.start

    def GPUEndTime(self):
        assert self.waited, "read the timestamps before the buffer completed"
        return self.start + 2e-6


def test_metal_timer_sums_command_buffer_gpu_windows():
    from gpu_impls.metal._timer import MetalCommandBufferTimer

    made = []

    def call():
        made.append(_CommandBuffer(start=0.25))  # seconds on the mach_absolute_time base
        return made[-1]
    m = measure(MetalCommandBufferTimer(), "metal_ts", [call, call], _stop())
    assert m.calls_per_sample == 64 and m.timer == "metal_gpu_timestamps"
    assert all(s == pytest.approx(2e-6) for s in m.samples_s)  # GPUEndTime asserts the wait


def test_ab_needs_five_runs_per_arm(tmp_path, capsys):
    rc = main(["--store", str(tmp_path), "ab", "torch:rms_norm", "torch:rms_norm", "--runs", "3"])
    assert rc == 2 and "--runs 5" in capsys.readouterr().out


def test_rotating_sets_keep_their_own_fresh_outputs():
    """An impl returning fresh outputs must not get one recycled (cache-hot) output block for
    all k sets: each set's last outputs stay alive until that set runs again."""
    import weakref

    from runners.bench import _SetCall

    class Out:
        pass

    made = []

    def run():
        out = Out()
        made.append(weakref.ref(out))
        return {"out": out}

    calls = [_SetCall(run) for _ in range(3)]
    for call in calls:
        call()
    assert all(ref() is not None for ref in made)  # three sets, three live outputs
    calls[0]()
    assert made[0]() is None                       # set 0's old output freed, not the others'
    assert all(ref() is not None for ref in made[1:])


def test_mlx_gpu_copy_ceiling_cancels_the_eval_sync(monkeypatch):
    """On an MLX GPU the copy ceiling is the difference of an eval of COPIES copies and an eval
    of one (the eval's sync cancelled; one copy an eval read ~30 % of the CUDA-event ceiling on
    an H100). Here the GPU branch runs on MLX CPU, its device type faked: it moves COPIES - 1
    copies' bytes and the difference of the two evals' times is positive."""
    mx = pytest.importorskip("mlx.core")
    from gpu_impls.mlx import _timer

    class FakeGpu:
        type = mx.gpu

    monkeypatch.setattr(mx, "default_device", lambda: FakeGpu())
    c = _timer.MlxTimer().ceilings()
    assert c["copy_bytes"] == 2 * (128 << 20) * (_timer.COPIES - 1)
    assert c["copy_gbps"] > 0


def test_ab_agreement_counts_integer_outputs_by_their_values():
    """`kparity ab` of two impls of an op with integer outputs (moe_dispatch: counts, offsets,
    perm): A=B is the largest |A - B| (it once raised "'i32' is not a floating-point format")."""
    import dataclasses

    from gpu_impls import backend, impls
    from runners.ab import agreement

    be = backend("torch")
    case = Case.make("moe_dispatch", {"tokens": 7, "experts": 16, "top_k": 4}, "f32")
    inputs = make_inputs(case)
    torch_impl = impls()["torch:moe_dispatch"]
    assert agreement(torch_impl, be, torch_impl, be, case, inputs) == (0.0, 0)

    def off_by_two(launch, ins, outs, c):
        out = torch_impl.run(launch, ins, outs, c)
        return {**out, "perm": out["perm"] + 2}
    shifted = dataclasses.replace(torch_impl, name="perm_plus_two", run=off_by_two)
    assert agreement(torch_impl, be, shifted, be, case, inputs) == (2.0, 2)
