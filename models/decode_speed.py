"""How fast the decode loop runs (`models/decode.py`): wall time per decode step
(`time_decode`) and of the prefill pass (`time_prefill`), and the bytes a step moves by the
ops' own models (`step_bytes`, a bandwidth roofline's numerator).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from models.decode import Decoder
from models.plan import ModelError


def step_bytes(decoder: Decoder, position: int) -> int:
    """Bytes one decode step at `position` moves by the ops' own models (`OpSpec.bytes`: each
    input read once, each output written once: every weight, the activations), attention
    charged for the position + 1 keys the step reads rather than the cache's capacity: the
    numerator of a bandwidth roofline (÷ a copy ceiling in bytes/s: the step's lower bound)."""
    total = 0
    for (role, _), op in decoder.ops.items():
        case, _ = op.at(position)
        if role == "attention":
            case = case.replace(max_len=position + 1)
        total += int(case.spec.bytes(case))
    return total


# --- speed ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DecodeTiming:
    """Wall time per decode step, each step between two synchronizes of every backend the plan
    runs on: the median (`ms_per_token`: per step, a token of each of `batch` sequences) and
    10th/90th percentiles over the steps after the warm-up, every step's time, and tokens/s
    (batch x steps per second)."""

    plan: str
    device: str
    dtype: str
    steps: int
    warmup: int
    ms_per_token: float
    p10_ms: float
    p90_ms: float
    tokens_per_s: float
    samples_ms: tuple[float, ...]
    batch: int = 1


def time_decode(decoder: Decoder, tokens, warmup: int = 3, prefill: int = 0) -> DecodeTiming:
    """Teacher-forced decode over `tokens` (position i gets token i), the first `prefill` of
    them in one untimed prefill pass, timing each step after the first `warmup` steps: see
    `DecodeTiming`."""
    decoder.load(tokens, prefill)
    if decoder.steps - prefill <= warmup:
        raise ModelError(f"time_decode: {decoder.steps} tokens, {prefill} of them prefilled, "
                         f"leave no step after {warmup} warm-up steps")
    if prefill:
        decoder.synchronize(decoder.prefill(prefill))
    samples = []
    for p in range(prefill, decoder.steps):
        decoder.synchronize()
        t0 = time.perf_counter()
        decoder.synchronize(decoder.forward(p))
        if p - prefill >= warmup:
            samples.append((time.perf_counter() - t0) * 1e3)
        decoder.tokens_done(decoder.batch)
    devices = sorted({b.device() for b in decoder.backends.values()})
    return decode_timing(decoder.plan.name, ", ".join(devices), decoder.dtype, samples, warmup,
                         decoder.batch)


def decode_timing(plan: str, device: str, dtype: str, samples: list[float], warmup: int,
                  batch: int = 1) -> DecodeTiming:
    """A `DecodeTiming` of per-step milliseconds `samples`: the median, and the 10th and 90th
    percentiles within the samples ("inclusive": the default method extrapolates beyond them
    on few samples, a negative 10th percentile on four)."""
    q = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 \
        else list(samples) * 9
    median = statistics.median(samples)
    return DecodeTiming(plan, device, dtype, len(samples), warmup, median, q[0], q[-1],
                        batch * 1e3 / median, tuple(samples), batch)


@dataclass(frozen=True)
class PrefillTiming:
    """Wall time of the prefill pass over a prompt of `tokens` tokens (its lm_head over every
    row included), between two synchronizes of every backend: the median and extremes over
    `repeats` runs after `warmup` runs, each on empty caches."""

    plan: str
    device: str
    dtype: str
    tokens: int
    repeats: int
    warmup: int
    ms: float
    min_ms: float
    max_ms: float
    tokens_per_s: float
    samples_ms: tuple[float, ...]


def time_prefill(decoder: Decoder, tokens, repeats: int = 5, warmup: int = 1) -> PrefillTiming:
    """The prefill pass over all of `tokens`, `warmup` + `repeats` times: see
    `PrefillTiming`."""
    samples = []
    for i in range(warmup + repeats):
        decoder.load(tokens, prefill=len(tokens))
        decoder.synchronize()
        t0 = time.perf_counter()
        decoder.synchronize(decoder.prefill(len(tokens)))
        if i >= warmup:
            samples.append((time.perf_counter() - t0) * 1e3)
        decoder.tokens_done(len(tokens))
    median = statistics.median(samples)
    devices = sorted({b.device() for b in decoder.backends.values()})
    return PrefillTiming(decoder.plan.name, ", ".join(devices), decoder.dtype, len(tokens),
                         repeats, warmup, median, min(samples), max(samples),
                         len(tokens) * 1e3 / median, tuple(samples))
