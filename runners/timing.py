"""Timing modes, written once over `gpu_impls.timer.Timer` (`reference/measurement.md` §9).

`measure(timer, mode, calls, stop)` turns a list of zero-argument calls (one per rotating input
set, all computing the same case) into per-call samples:

* warm-up by count and by time: every call once (compilation, allocation, autotuning), then
  calls until at least `WARMUP_CALLS` calls and `WARMUP_S` seconds have passed (clocks ramp up
  from idle, e.g. 345 MHz on an H200); the same again for a captured graph;
* one sample per iteration of the mode (see the table in `gpu_impls/timer.py`), until the
  stopping rule (`runners/stopping.py`) says stop;
* after each sample the SM clock is read; a sample taken under the throttle floor (75 % of the
  default SM clock) is dropped and counted, and sampling pauses 50 ms to let the clock recover.

Rotating sets: `rotation_sets` picks k input sets so that k * bytes >= 4 x the cache, within the
timer's memory budget (and its `max_sets`); a rotating sample of R calls runs set i % k on
call i, R = max(k, min_calls) rounded up to a multiple of k (graph_rot: >= 50 calls;
wall_eval: >= 64).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from runners.stopping import StdRel

WARMUP_CALLS = 3
WARMUP_S = 0.1
HOST_SAMPLE_S = 0.01      # `wall` mode: a sample should last at least this long
THROTTLE_PAUSE_S = 0.05
ROTATING = ("graph_rot", "wall", "wall_eval", "metal_ts")
MODES = (*ROTATING, "cold", "eager")  # every mode `measure` knows (a timer offers some of them)


@dataclass
class Measurement:
    mode: str
    timer: str
    samples_s: list[float] = field(default_factory=list)
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


def measure(timer, mode: str, calls: list, stop: StdRel, progress=None) -> Measurement:
    """Per-call samples of `calls` in `mode`; `progress(samples, noise)` is told as it goes."""
    if mode not in timer.modes:
        raise ValueError(f"mode {mode!r} is not available on this timer ({timer.kind}); "
                         f"choose one of {', '.join(timer.modes)}")
    m = Measurement(mode=mode, timer=timer.kind, n_sets=len(calls))
    with timer.stream():
        for call in calls:  # compile, allocate, autotune: outside any capture or timing
            call()

    first = calls[0]
    n, secs = _warm(timer, first, 1)
    est = secs / n
    if mode in ROTATING:
        r = _calls_per_sample(mode, timer, calls, est)
        unit = timer.sequence([calls[i % len(calls)] for i in range(r)])
        n2, secs2 = _warm(timer, unit, r)
        n, secs = n + n2, secs + secs2
        m.calls_per_sample = r
        sample = lambda: timer.elapsed(unit) / r  # noqa: E731
    elif mode == "cold":
        def sample():
            timer.flush()
            return timer.elapsed(first)
    elif mode == "eager":
        sample = lambda: timer.elapsed(first)  # noqa: E731
    else:
        raise ValueError(f"unknown mode {mode!r}")
    m.n_warmup, m.warmup_s = n, secs

    floor = timer.throttle_floor_mhz()
    sm_seen, mem_seen = [], []
    stop.start()
    while True:
        t = sample()
        sm, mem = timer.clocks()
        if floor and sm and sm < floor:
            m.n_dropped += 1
            if stop.timed_out():
                stop.reason = "timeout"
                break
            time.sleep(THROTTLE_PAUSE_S)
            continue
        m.samples_s.append(t)
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
