"""Timing modes, written once over `gpu_impls.timer.Timer` (the protocol: `docs/ab.md`).

`measure(timer, mode, calls, stop)` turns a list of zero-argument calls (one per rotating input
set, all computing the same case) into per-call samples:

* warm-up by count and by time: every call once (compilation, allocation, autotuning), then
  calls until at least `WARMUP_CALLS` calls and `WARMUP_S` seconds have passed (clocks ramp up
  from idle, e.g. 345 MHz on an H200); the same again for a captured graph;
* one sample per iteration of the mode (see the table in `gpu_impls/timer.py`), until the
  stopping rule (`runners/stopping.py`) says stop;
* after each sample the SM clock is read; a sample taken under the throttle floor (75 % of the
  default SM clock) is dropped and counted, and sampling pauses 50 ms to let the clock recover
  (nvbench's `--throttle-threshold` and `--throttle-recovery-delay` defaults).

Rotating sets: `rotation_sets` picks k input sets so that k * bytes >= 4 x the cache, within the
timer's memory budget (and its `max_sets`); a rotating sample of R calls runs set i % k on
call i, R = max(k, min_calls) rounded up to a multiple of k (chain, graph_rot: >= 50 calls;
wall_eval: >= 64).

`chain` (`measure(..., before=preds)`, one predecessor call per set): two graphs over the same
rotation, P = [pred_0, pred_1, ...] and C = [pred_0, call_0, pred_1, call_1, ...], R of each.
In `graph_rot` each call follows the previous call of the same impl, so a programmatic dependent
launch overlaps its own predecessor, a best case that a non-PDL impl cannot have; in C each
call follows an ordinary kernel that wrote its input, as in a decode step. A sample is one
replay of P and, right after it, one replay of C:

    sample = (t(C) - t(P)) / R          (the row's samples and median; t(P) / R is kept too)

Paired differences of adjacent replays rather than the difference of two medians: the two
replays share the clock and thermal state, so slow drift cancels in each difference, and the
stopping rule and the row's rel_std judge the differences themselves, so the subtraction's own
noise (both graphs' jitter) is in the reported noise, not hidden by it. The median of the
differences is robust to one disturbed replay as the plain median is.

Uncaptured (`measure(..., capture=False)`, for an impl declaring `Impl.host_sync`): a call that
reads device data on the host cannot be captured in a graph, and a user's step could not capture
it either. `chain` and `graph_rot` then run the same sequences as plain loops launched from
Python between the events, so each call's launches and its wait for the GPU are in its time:
what the call costs a step that runs it. `bench_one` caps such a rotation at `UNCAPTURED_SETS`
(the row's n_sets says how many): each call costs tens of microseconds of host time there, and
65536 of them would make one sample last seconds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from runners.stopping import StdRel

WARMUP_CALLS = 3
UNCAPTURED_SETS = 50      # rotating sets at most for an impl timed uncaptured
WARMUP_S = 0.1
HOST_SAMPLE_S = 0.01      # `wall` mode: a sample should last at least this long
THROTTLE_PAUSE_S = 0.05
ROTATING = ("graph_rot", "wall", "wall_eval", "metal_ts")
# every mode `measure` knows (a timer offers some of them)
MODES = ("chain", *ROTATING, "cold", "eager")


@dataclass
class Measurement:
    mode: str
    timer: str
    samples_s: list[float] = field(default_factory=list)
    pred_samples_s: list[float] = field(default_factory=list)  # chain: t(P) / R per sample
    n_warmup: int = 0
    warmup_s: float = 0.0
    n_sets: int = 1
    calls_per_sample: int = 1
    n_dropped: int = 0
    stop_reason: str = ""
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None


def rotation_sets(bytes_per_call: int, timer) -> int:
    """k input sets with k * bytes >= 4 x the cache, capped by the timer's memory budget."""
    want = max(1, math.ceil(4 * timer.cache_bytes() / max(bytes_per_call, 1)))
    fit = max(1, timer.memory_budget() // max(bytes_per_call, 1))
    return int(min(want, fit, timer.max_sets))


def _warm(timer, fn, calls_each: int) -> tuple[int, float]:
    """Run fn until >= WARMUP_CALLS units and >= WARMUP_S; returns (calls made, seconds)."""
    t0 = time.perf_counter()
    n = 0
    while n < WARMUP_CALLS or time.perf_counter() - t0 < WARMUP_S:
        timer.elapsed(fn)
        n += 1
    return n * calls_each, time.perf_counter() - t0


def _calls_per_sample(mode: str, timer, calls: list, est_s: float) -> int:
    k = len(calls)
    r = timer.min_calls
    if mode == "wall":  # a host-timed sample needs enough calls to dwarf the timer's overhead
        r = max(1, min(timer.min_calls, math.ceil(HOST_SAMPLE_S / max(est_s, 1e-9))))
    r = max(r, k)
    return int(math.ceil(r / k) * k)


def _chain(timer, calls: list, before: list, est_s: float, capture: bool = True):
    """(R, sample, warm-up calls, warm-up seconds) of `chain` (module docstring): graphs P
    (the predecessors alone) and C (each call after its set's predecessor) over the same
    rotation of R calls; a sample is (t(C) - t(P)) / R, with t(P) / R beside it."""
    r = _calls_per_sample("chain", timer, calls, est_s)
    sets = [i % len(calls) for i in range(r)]
    preds = timer.sequence([before[i] for i in sets], capture)
    chained = timer.sequence([f for i in sets for f in (before[i], calls[i])], capture)
    n1, s1 = _warm(timer, preds, r)
    n2, s2 = _warm(timer, chained, r)

    def sample():
        t_pred = timer.elapsed(preds) / r
        return timer.elapsed(chained) / r - t_pred, t_pred
    return r, sample, n2, s1 + s2


def measure(timer, mode: str, calls: list, stop: StdRel, progress=None,
            before: list | None = None, capture: bool = True) -> Measurement:
    """Per-call samples of `calls` in `mode`; `progress(samples, noise)` is told as it goes.
    `before`: for `chain`, the predecessor of each set's call (`Timer.predecessor`), in order.
    `capture=False`: the rotating and chain sequences run uncaptured (module docstring)."""
    if mode not in timer.modes:
        raise ValueError(f"mode {mode!r} is not available on this timer ({timer.kind}); "
                         f"choose one of {', '.join(timer.modes)}")
    if mode == "chain" and (before is None or len(before) != len(calls)):
        raise ValueError(f"mode chain needs one predecessor per input set: {len(calls)} sets, "
                         f"{'none' if before is None else len(before)} predecessors")
    m = Measurement(mode=mode, timer=timer.kind, n_sets=len(calls))
    with timer.stream():
        for call in [*calls, *(before or [])]:  # compile, allocate, autotune: outside any
            call()                               # capture or timing

    first = calls[0]
    n, secs = _warm(timer, first, 1)
    est = secs / n
    if mode in ROTATING:
        r = _calls_per_sample(mode, timer, calls, est)
        unit = timer.sequence([calls[i % len(calls)] for i in range(r)], capture)
        n2, secs2 = _warm(timer, unit, r)
        n, secs = n + n2, secs + secs2
        m.calls_per_sample = r
        sample = lambda: (timer.elapsed(unit) / r, None)  # noqa: E731
    elif mode == "chain":
        r, sample, n2, secs2 = _chain(timer, calls, before, est, capture)
        n, secs = n + n2, secs + secs2
        m.calls_per_sample = r
    elif mode == "cold":
        def sample():
            timer.flush()
            return timer.elapsed(first), None
    elif mode == "eager":
        sample = lambda: (timer.elapsed(first), None)  # noqa: E731
    else:
        raise ValueError(f"unknown mode {mode!r}")
    m.n_warmup, m.warmup_s = n, secs

    floor = timer.throttle_floor_mhz()
    sm_seen, mem_seen = [], []
    stop.start()
    while True:
        t, pred = sample()
        sm, mem = timer.clocks()
        if floor and sm and sm < floor:
            m.n_dropped += 1
            if stop.timed_out():
                stop.reason = "timeout"
                break
            time.sleep(THROTTLE_PAUSE_S)
            continue
        m.samples_s.append(t)
        if pred is not None:
            m.pred_samples_s.append(pred)
        if sm:
            sm_seen.append(sm)
        if mem:
            mem_seen.append(mem)
        done = stop.add(t, m.calls_per_sample)
        if progress is not None:
            progress(stop.samples, stop.noise)
        if done:
            break
    m.stop_reason = stop.reason
    m.sm_clock_mhz = sum(sm_seen) / len(sm_seen) if sm_seen else None
    m.mem_clock_mhz = sum(mem_seen) / len(mem_seen) if mem_seen else None
    return m
