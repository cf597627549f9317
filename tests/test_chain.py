"""The `chain` timing mode on CPU: the mode table, every op's chain input, the subtraction over a
fake timer that charges known times, and `bench_one`'s use of it (issue 26, part 1)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from cases.model import Case
from gpu_impls.timer import Timer
from oracle.pipeline import Pipeline, Stage
from oracle.spec import _REGISTRY, get_op, registry
from runners.stopping import StdRel
from runners.timing import MODES, measure

PRED_S = 2e-6       # the predecessor kernel
CALL_S = 5e-6       # the call after an ordinary kernel
OVERLAP_S = 4e-6    # the call after its own previous call: a PDL kernel's best case


class Pred:
    """A predecessor of set `i` (what `FakeChainTimer.predecessor` hands out)."""

    def __init__(self, i: int, log: list):
        self.i, self.log = i, log

    def __call__(self):
        self.log.append(("pred", self.i))


class Unit(list):
    """A 'graph' (or, `captured` False, a plain loop): the calls, run in order when elapsed."""

    captured = True


class FakeChainTimer(Timer):
    """Charges PRED_S per predecessor and, per call, OVERLAP_S right after another call (a PDL
    impl overlapping its own previous call) or CALL_S after anything else; no clock drops."""

    kind = "fake_cuda"
    modes = ("chain", "graph_rot", "cold", "eager")
    min_calls = 50
    max_sets = 8

    def __init__(self):
        self.log = []
        self.units = []
        self.made = 0

    def cache_bytes(self):
        return 4096

    def memory_budget(self):
        return 64 << 20

    def predecessor(self, array):
        self.made += 1
        return Pred(self.made - 1, self.log)

    def sequence(self, calls, capture=True):
        unit = Unit(calls)
        unit.captured = capture
        self.units.append(unit)
        return unit

    def elapsed(self, fn):
        calls = fn if isinstance(fn, Unit) else [fn]
        total, prev = 0.0, None
        for c in calls:
            c()
            if isinstance(c, Pred):
                total += PRED_S
            else:
                total += OVERLAP_S if prev == "call" else CALL_S
            prev = "pred" if isinstance(c, Pred) else "call"
        return total


def _stop():
    return StdRel(min_time_s=0.0, min_samples=5, timeout_s=5.0)


class SetCall:
    def __init__(self, i: int, log: list):
        self.i, self.log = i, log

    def __call__(self):
        self.log.append(("call", self.i))


def test_chain_is_the_cuda_timers_primary_and_graph_rot_stays():
    from gpu_impls._cuda_timer import CudaTimer
    from gpu_impls.cuda._timer import CupyTimer
    from gpu_impls.torch._timer import TorchCudaTimer

    for timer in (CudaTimer, CupyTimer, TorchCudaTimer):
        assert timer.modes[0] == "chain"
        assert "graph_rot" in timer.modes
    assert "chain" in MODES
    assert "chain" not in Timer.modes  # the host timer has no graphs


def test_every_op_declares_an_activation_as_its_chain_input():
    # the project's own ops (oracle/): test example ops come from tests/ as modules or as
    # plugin files (kparity_plugin_*), and which of them earlier tests loaded varies
    ops = {name: s for name, s in registry().items() if s.oracle.__module__.startswith("oracle.")}
    assert len(ops) >= 11
    for name, spec in ops.items():
        inputs = {t.name: t for t in spec.inputs}
        assert spec.chain_input in inputs, f"{name}: chain_input {spec.chain_input!r}"
        t = inputs[spec.chain_input]
        assert t.init not in ("weight", "codes", "qscale", "qbias") and t.role != "u32", \
            f"{name}: chain input {t.name} is a weight"


def test_an_unknown_chain_input_is_refused_naming_the_inputs():
    with pytest.raises(ValueError, match="chain_input 'nope' is not an input; inputs: x, w"):
        dataclasses.replace(get_op("rms_norm"), chain_input="nope")


def test_a_pipelines_chain_input_is_its_first_stages_under_its_pipeline_name():
    p = Pipeline("chain_p", "test", (Stage("n1", "rms_norm", wires={"x": "h"}),
                                     Stage("n2", "rms_norm", wires={"x": "n1.out", "w": "w2"})))
    assert p.spec().chain_input == "h"


def test_chain_subtracts_the_predecessors_own_graph():
    """graph_rot charges the PDL overlap (4 us); chain the call after an ordinary kernel (5 us),
    the predecessor's 2 us subtracted and kept beside it."""
    timer = FakeChainTimer()
    log = timer.log
    calls = [SetCall(i, log) for i in range(3)]
    preds = [Pred(i, log) for i in range(3)]
    m = measure(timer, "chain", calls, _stop(), before=preds)
    r = m.calls_per_sample
    assert r % 3 == 0 and r >= 50 and m.mode == "chain"
    assert m.samples_s and all(s == pytest.approx(CALL_S) for s in m.samples_s)
    assert len(m.pred_samples_s) == len(m.samples_s)
    assert all(p == pytest.approx(PRED_S) for p in m.pred_samples_s)
    alone, chained = timer.units  # the predecessors alone, then each call after its own
    assert [p.i for p in alone] == [i % 3 for i in range(r)]
    assert [(type(c).__name__, c.i) for c in chained] == [
        (kind, i % 3) for i in range(r) for kind in ("Pred", "SetCall")]

    rot = measure(FakeChainTimer(), "graph_rot", calls, _stop())
    assert all(s == pytest.approx((CALL_S + (r - 1) * OVERLAP_S) / r) for s in rot.samples_s)
    assert not rot.pred_samples_s


def test_chain_without_one_predecessor_per_set_is_refused():
    calls = [SetCall(i, []) for i in range(2)]
    with pytest.raises(ValueError, match="one predecessor per input set: 2 sets, none"):
        measure(FakeChainTimer(), "chain", calls, _stop())
    with pytest.raises(ValueError, match="2 sets, 1 predecessors"):
        measure(FakeChainTimer(), "chain", calls, _stop(), before=[Pred(0, [])])


def _bench(monkeypatch, mode):
    from gpu_impls import backend, impls
    from runners.bench import bench_one

    be = backend("torch")
    timer = FakeChainTimer()
    monkeypatch.setattr(be, "timer", lambda: timer)
    case = Case.make("rms_norm", {"rows": 2, "n": 64}, "f32", label="bench:tiny")
    return bench_one(impls()["torch:rms_norm"], be, case, mode, _stop, verify=False), timer


def test_bench_one_times_chain_on_the_ops_chain_input(monkeypatch):
    row, timer = _bench(monkeypatch, "chain")
    assert row["status"] == "ok", row["message"]
    assert row["mode"] == "chain" and row["message"] == ""
    assert row["median_ns"] == pytest.approx(CALL_S * 1e9)
    assert row["pred_median_ns"] == pytest.approx(PRED_S * 1e9)
    chained = timer.units[1]
    assert sum(isinstance(c, Pred) for c in chained) == row["calls_per_sample"]


COPY_S = 4e-6  # the size-matched copy after an ordinary kernel


class Copy:
    """A size-matched copy call (`CopyTimer.copy_calls`)."""

    def __call__(self):
        pass


class CopyTimer(FakeChainTimer):
    """FakeChainTimer with a size-matched copy charged COPY_S where a call is charged CALL_S."""

    def copy_calls(self, nbytes, k):
        self.copy_args = (nbytes, k)
        return [(Copy(), object()) for _ in range(k)]

    def elapsed(self, fn):
        calls = fn if isinstance(fn, Unit) else [fn]
        copies = sum(isinstance(c, Copy) for c in calls)
        return super().elapsed(fn) - copies * (CALL_S - COPY_S)


def test_copy_same_bytes_times_a_copy_of_the_rows_bytes_in_the_same_mode(monkeypatch):
    from gpu_impls import backend, impls
    from runners.bench import bench_one

    be = backend("torch")
    timer = CopyTimer()
    monkeypatch.setattr(be, "timer", lambda: timer)
    case = Case.make("rms_norm", {"rows": 2, "n": 64}, "f32", label="bench:tiny")
    row = bench_one(impls()["torch:rms_norm"], be, case, "chain", _stop, verify=False,
                    copy_same=True)
    assert row["status"] == "ok", row["message"]
    assert timer.copy_args == (row["bytes_model"], row["n_sets"])  # same bytes, same rotation
    assert row["copy_same_ns"] == pytest.approx(COPY_S * 1e9)  # after its own predecessor
    assert row["pct_copy_same"] == pytest.approx(100 * COPY_S / CALL_S)
    plain = bench_one(impls()["torch:rms_norm"], be, case, "chain", _stop, verify=False)
    assert "copy_same_ns" not in plain  # only when asked


def test_copy_same_bytes_is_null_on_a_timer_without_one(monkeypatch):
    from gpu_impls import backend, impls
    from runners.bench import bench_one

    be = backend("torch")
    monkeypatch.setattr(be, "timer", lambda: FakeChainTimer())  # the base Timer's copy_calls
    case = Case.make("rms_norm", {"rows": 2, "n": 64}, "f32", label="bench:tiny")
    row = bench_one(impls()["torch:rms_norm"], be, case, "chain", _stop, verify=False,
                    copy_same=True)
    assert row["status"] == "ok" and row["copy_same_ns"] is None
    assert row.get("pct_copy_same") is None


def test_an_op_without_a_chain_input_falls_back_to_graph_rot_and_says_so(monkeypatch):
    monkeypatch.setitem(_REGISTRY, "rms_norm",
                        dataclasses.replace(get_op("rms_norm"), chain_input=""))
    row, _ = _bench(monkeypatch, "chain")
    assert row["status"] == "ok", row["message"]
    assert row["mode"] == "graph_rot" and row.get("pred_median_ns") is None
    assert "op rms_norm declares no chain input" in row["message"]
    assert "timed in graph_rot" in row["message"]


def test_bench_items_fold_a_chain_fallback_into_graph_rot_once():
    from verbs.timing import _timed_items

    bare = dataclasses.replace(get_op("rms_norm"), chain_input="")
    w = SimpleNamespace(case=SimpleNamespace(spec=bare, op="rms_norm"))
    v = SimpleNamespace(case=SimpleNamespace(spec=get_op("rms_norm"), op="rms_norm"))
    items, why = _timed_items([(w, "chain"), (w, "graph_rot"), (w, "cold"), (v, "chain")])
    assert items == [(w, "graph_rot"), (w, "cold"), (v, "chain")]
    assert list(why) == ["rms_norm"]


# --- impls that sync with the host: timed uncaptured ---------------------------------------------

class WideTimer(FakeChainTimer):
    """A fake GPU timer whose rotation would take thousands of sets (a large cache, no cap)."""

    max_sets = 1 << 16

    def cache_bytes(self):
        return 1 << 20


class CaptureRefusingTimer(FakeChainTimer):
    """Fails any capture as CuPy does when a call syncs with the host mid-capture."""

    def sequence(self, calls, capture=True):
        if capture:
            raise RuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted "
                               "when stream is capturing")
        return super().sequence(calls, capture)


def _bench_host_sync(monkeypatch, timer, mode, host_sync):
    from gpu_impls import backend, impls
    from runners.bench import bench_one

    be = backend("torch")
    monkeypatch.setattr(be, "timer", lambda: timer)
    impl = dataclasses.replace(impls()["torch:rms_norm"], host_sync=host_sync)
    case = Case.make("rms_norm", {"rows": 2, "n": 64}, "f32", label="bench:tiny")
    return bench_one(impl, be, case, mode, _stop, verify=False)


@pytest.mark.parametrize("mode", ["chain", "graph_rot"])
def test_a_host_syncing_impl_is_timed_uncaptured_on_a_capped_rotation(monkeypatch, mode):
    from runners.timing import UNCAPTURED_SETS

    captured = _bench_host_sync(monkeypatch, WideTimer(), mode, "")
    assert captured["status"] == "ok" and captured["n_sets"] > UNCAPTURED_SETS
    timer = WideTimer()
    row = _bench_host_sync(monkeypatch, timer, mode, "it reads the row count back")
    assert row["status"] == "ok", row["message"]
    assert timer.units and not any(u.captured for u in timer.units)
    assert row["n_sets"] == UNCAPTURED_SETS
    assert row["message"].startswith("timed uncaptured: it reads the row count back")
    if mode == "chain":  # the same subtraction, over plain loops
        assert row["median_ns"] == pytest.approx(CALL_S * 1e9)


def test_an_undeclared_impl_that_cannot_be_captured_is_told_the_fix(monkeypatch):
    row = _bench_host_sync(monkeypatch, CaptureRefusingTimer(), "chain", "")
    assert row["status"] == "error"
    assert "could not be captured in a CUDA graph" in row["message"]
    assert "Impl(host_sync='why')" in row["message"]
    declared = _bench_host_sync(monkeypatch, CaptureRefusingTimer(), "chain", "reads back")
    assert declared["status"] == "ok", declared["message"]


def test_the_torch_moe_loops_declare_their_host_reads():
    from gpu_impls import impls

    registered = impls()
    for name in ("torch:moe_dispatch", "torch:grouped_linear", "torch:grouped_dequant_linear",
                 "torch:experts_linear_loop"):
        assert registered[name].host_sync, name
    for name in ("torch:grouped_mm", "torch:moe_router", "torch:rms_norm"):
        assert not registered[name].host_sync, name


def test_the_copy_beside_an_uncaptured_impl_is_launched_uncaptured_too(monkeypatch):
    from gpu_impls import backend, impls
    from runners.bench import bench_one

    be = backend("torch")
    timer = CopyTimer()
    monkeypatch.setattr(be, "timer", lambda: timer)
    impl = dataclasses.replace(impls()["torch:rms_norm"], host_sync="it reads a count back")
    case = Case.make("rms_norm", {"rows": 2, "n": 64}, "f32", label="bench:tiny")
    row = bench_one(impl, be, case, "chain", _stop, verify=False, copy_same=True)
    assert row["status"] == "ok" and row["copy_same_ns"] == pytest.approx(COPY_S * 1e9)
    copies = [u for u in timer.units if any(isinstance(c, Copy) for c in u)]
    assert copies and not any(u.captured for u in timer.units)
