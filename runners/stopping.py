"""When to stop sampling: nvbench's `stdrel` criterion (NVIDIA/nvbench
`nvbench/detail/stdrel_criterion.cxx`; its defaults in `docs/cli_help.md`).

Samples are per-call times. After each one:

* never stop before `min_samples` samples and `min_time_s` of accumulated measured time;
* stop ("converged") once the relative standard deviation (Bessel) of all samples is
  below `max_noise`;
* otherwise, once more than 64 noise estimates exist, every 16 samples look at the last 512
  estimates: if they have levelled off (their own relative stdev is under 5 %), stop
  ("plateau": the noise will not go down by sampling longer);
* stop ("timeout") after `timeout_s` of wall-clock time, converged or not.

The measured time counts every call a sample stands for (`add(sample, calls)`), so a CUDA-graph
sample of R calls contributes R times its per-call time, as nvbench counts a batch.

Only "converged" meets the noise target. `shortfall` says, for the status column, how a
measurement that stopped otherwise falls short of it: a timeout at 23 % noise is not an `ok`
like a converged one.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class StdRel:
    max_noise: float = 0.005
    min_time_s: float = 0.5
    min_samples: int = 10
    timeout_s: float = 15.0
    plateau_window: int = 512
    plateau_every: int = 16
    plateau_min: int = 64
    plateau_noise: float = 0.05
    clock: object = time.perf_counter

    _n: int = 0
    _mean: float = 0.0
    _m2: float = 0.0
    _measured_s: float = 0.0
    _started: float | None = None
    _noise: deque = field(default_factory=deque)
    reason: str = ""

    def add(self, sample_s: float, calls: int = 1) -> bool:
        """Record one sample (seconds per call); True when sampling should stop."""
        if self._started is None:
            self._started = self.clock()
        self._n += 1  # Welford: numerically stable running mean and variance
        delta = sample_s - self._mean
        self._mean += delta / self._n
        self._m2 += delta * (sample_s - self._mean)
        self._measured_s += sample_s * calls
        noise = self.noise
        if math.isfinite(noise):
            self._noise.append(noise)
            if len(self._noise) > self.plateau_window:
                self._noise.popleft()
        self.reason = self._decide(noise)
        return bool(self.reason)

    def start(self) -> None:
        """Start the wall clock now (otherwise the first sample starts it)."""
        self._started = self.clock()

    @property
    def noise(self) -> float:
        """Relative standard deviation of the samples so far (NaN below two samples)."""
        if self._n < 2 or self._mean <= 0:
            return math.nan
        return math.sqrt(self._m2 / (self._n - 1)) / self._mean

    @property
    def samples(self) -> int:
        return self._n

    @property
    def measured_s(self) -> float:
        return self._measured_s

    def timed_out(self) -> bool:
        return self._started is not None and self.clock() - self._started >= self.timeout_s

    def _decide(self, noise: float) -> str:
        if self.timed_out():
            return "timeout"
        if self._n < self.min_samples or self._measured_s < self.min_time_s:
            return ""
        if noise < self.max_noise:
            return "converged"
        if len(self._noise) > self.plateau_min and self._n % self.plateau_every == 0:
            window = list(self._noise)
            mean = sum(window) / len(window)
            var = sum((x - mean) ** 2 for x in window) / (len(window) - 1)
            if mean > 0 and math.sqrt(var) / mean < self.plateau_noise:
                return "plateau"
        return ""


def _pct(x: float) -> str:
    return f"{100 * x:.3g} %"


def shortfall(stop_reason: str, noise: float | None, samples: int, max_noise: float) -> str:
    """How a measurement that stopped on `stop_reason` falls short of the noise target
    `max_noise`, or "" when it met it ("converged"). `noise`: the relative stdev of its samples
    (None or NaN below two samples). A plateau is named apart from a timeout: the rule stopped
    there on purpose (sampling longer would not lower the noise), a timeout just ran out of time."""
    if stop_reason == "converged":
        return ""
    if noise is None or not math.isfinite(noise):
        return f"not converged ({samples} sample{'' if samples == 1 else 's'}: no noise estimate)"
    above = f"noise {_pct(noise)} > {_pct(max_noise)}"
    if stop_reason == "plateau":
        return f"noise plateau ({above})"
    if noise >= max_noise:
        return f"not converged ({above})"
    return (f"not converged (time limit after {samples} samples, before --min-samples or "
            "--min-time)")
