"""`--devices` on CPU, with stand-in devices (indices no GPU backs: the workers get
CUDA_VISIBLE_DEVICES all the same): the dealer's rows equal the plain run's, each tagged with its
device, both devices used, each worker pinned; a crash replaces that device's worker only; a
device found unusable hands its cases to the others; `--resume` across devices; bad values exit
2 naming the fix; the xdist worker's GPU. The faults are tests/faults.py's."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from results.store import Store
from runners import devices
from runners.devices import Batches, Dealer, Device, parse_devices, xdist_gpu
from runners.limits import BadInput, DeviceUnusable
from verbs.cli import main

FAULTS = str(Path(__file__).with_name("faults.py"))
CASES = ["--preset", "qwen3-0.6b", "--dtype", "bf16"]


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    """No GPU visible: the indices are stand-ins, whatever the machine."""
    monkeypatch.setattr(devices, "visible_gpus", lambda: [])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def rows(store: Path) -> list[dict]:
    return Store(store).read("correctness").to_pylist()


def test_two_devices_give_the_plain_rows_tagged_and_a_crash_replaces_one_worker(
        tmp_path, monkeypatch):
    replaced = []  # the device (its CUDA_VISIBLE_DEVICES) of each worker replaced
    original = devices._DeviceRunner._replace

    def spy(self):
        replaced.append(self.visible)
        original(self)
    monkeypatch.setattr(devices._DeviceRunner, "_replace", spy)
    impls = "torch:fault_segv,torch:fault_none,torch:fault_pinned"
    assert main(["--store", str(tmp_path / "dealt"), "--plugin", FAULTS, "check", "--impl",
                 impls, *CASES, "--devices", "0,1"]) == 1
    got = rows(tmp_path / "dealt")
    n = len(got) // 3
    by = Counter((r["impl"], r["status"]) for r in got)
    assert by[("torch:fault_segv", "crash")] == 1 and by[("torch:fault_segv", "pass")] == n - 1
    assert by[("torch:fault_none", "pass")] == n  # no row lost, none twice
    assert len({(r["impl"], r["case_id"]) for r in got}) == 3 * n
    assert {r["device_index"] for r in got} == {0, 1}  # every row tagged, both devices used
    for r in got:  # each worker pinned: fault_pinned fails exactly where the pin is 1
        if r["impl"] == "torch:fault_pinned":
            assert r["status"] == ("error" if r["device_index"] == 1 else "pass"), r["message"]
    crash = next(r for r in got if r["status"] == "crash")
    assert replaced == [str(crash["device_index"])]  # that device's worker, no other

    assert main(["--store", str(tmp_path / "plain"), "--plugin", FAULTS, "check", "--impl",
                 "torch:fault_none", *CASES]) == 0
    plain = rows(tmp_path / "plain")
    assert {r["device_index"] for r in plain} == {None}
    assert (sorted((r["case_id"], r["status"]) for r in plain)
            == sorted((r["case_id"], r["status"]) for r in got if r["impl"] == "torch:fault_none"))


def test_resume_across_devices_gives_the_unbroken_runs_rows(tmp_path, capsys):
    impls = ["--impl", "torch:fault_sticky,torch:fault_none", *CASES, "--isolate", "none"]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    assert main(["--store", str(whole), "--plugin", FAULTS, "check", *impls]) == 1
    assert main(["--store", str(broken), "--plugin", FAULTS, "check", *impls,
                 "--maxfail", "1"]) == 1
    kept = rows(broken)
    assert 0 < len(kept) < len(rows(whole))
    assert main(["--store", str(broken), "--plugin", FAULTS, "check", "--resume", "last",
                 "--devices", "0,1"]) == 1
    after = rows(broken)
    assert (Counter((r["impl"], r["case_id"], r["status"]) for r in after)
            == Counter((r["impl"], r["case_id"], r["status"]) for r in rows(whole)))
    fresh = [r for r in after if r["device_index"] is not None]
    assert len(fresh) == len(after) - len(kept) and {r["device_index"] for r in fresh} == {0, 1}


@pytest.mark.parametrize("value, says", [
    ("x", "'x' is not a device index"), ("0,0", "device 0 twice"),
    ("all", "--devices all: no GPU visible here"), ("0,-1", "'-1' is not a device index")])
def test_bad_devices_exit_2_naming_the_fix(tmp_path, capsys, value, says):
    assert main(["--store", str(tmp_path / "s"), "check", "--impl", "torch:rms_norm", *CASES,
                 "--devices", value]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert says in out and "e.g. --devices 0,1" in out
    assert not (tmp_path / "s" / "correctness").exists()  # refused before anything ran


def test_devices_need_worker_processes(tmp_path, capsys):
    assert main(["--store", str(tmp_path / "s"), "check", "--impl", "torch:rms_norm", *CASES,
                 "--devices", "0,1", "--isolate", "none"]) == 2
    assert "--isolate case" in capsys.readouterr().out


def test_parse_devices_on_gpus(monkeypatch):
    monkeypatch.setattr(devices, "visible_gpus", lambda: ["3", "5"])
    assert parse_devices("all", accelerated=True) == [Device(0, "3"), Device(1, "5")]
    assert parse_devices("1", accelerated=True) == [Device(1, "5")]
    with pytest.raises(BadInput, match=r"no device 2 here \(2 visible .*indices 0 to 1\)"):
        parse_devices("0,2", accelerated=True)
    assert parse_devices("0,2", accelerated=False) == [Device(0, "3"), Device(2, "2")]


class FakeRunner:
    """A device's runner without a process: device 1 is unusable after its first case."""

    def __init__(self, device: Device):
        self.device, self.ran, self.closed = device, 0, False

    def run(self, w, run_id):
        if self.device.index == 1 and self.ran == 1:
            raise DeviceUnusable(f"device {self.device.index} broke")
        self.ran += 1
        time.sleep(0.005 if self.device.index == 0 else 0)
        return {"item": w, "thread": threading.current_thread().name}

    def close(self):
        self.closed = True

    def interrupt(self):
        pass


def test_an_unusable_device_hands_its_cases_to_the_others():
    said, runners = [], []

    def open_runner(halt, device):
        runners.append(FakeRunner(device))
        return runners[-1]
    dealer = Dealer([Device(0, "0"), Device(1, "1")], open_runner, batch=2,
                    say=lambda text, **_: said.append(text))
    got = list(dealer.rows(list(range(40)), lambda w, run: run(w, "run")))
    dealer.stop()
    assert sorted(w for w, _ in got) == list(range(40))  # each once, the broken batch's too
    assert Counter(r["device_index"] for _, r in got)[1] == 1
    assert any("device 1 stopped" in s and "go to the other devices (0)" in s for s in said)
    assert all(r.closed for r in runners)


def test_a_device_keeps_to_its_impl_and_steals_only_at_the_end():
    """Affinity: each impl's set-up is paid on one worker while impls are left to start."""
    work = [("a", i) for i in range(6)] + [("b", i) for i in range(4)] + [("c", 0)]
    batches = Batches(work, batch=2, group=lambda item: item[0])
    held = {0: None, 1: None}

    def take(device):
        taken = batches.take(held[device])
        if taken is None:
            return None
        held[device], batch = taken
        return batch
    assert take(0) == [("a", 0), ("a", 1)]
    assert take(1) == [("b", 0), ("b", 1)]       # the next impl nobody started
    assert take(0) == [("a", 2), ("a", 3)]       # device 0 stays on a
    assert take(1) == [("b", 2), ("b", 3)]
    assert take(1) == [("c", 0)]                 # b is done: c is still unstarted
    assert take(1) == [("a", 4), ("a", 5)]       # nothing unstarted: steal a's last batch
    assert take(0) is None and take(1) is None   # all dealt
    batches.hand_back(held[0], [("a", 2)])       # a batch a broken device did not run
    assert take(1) == [("a", 2)]


def test_stealing_takes_from_the_end_of_the_longest_impl():
    work = [("a", i) for i in range(8)] + [("b", i) for i in range(2)]
    batches = Batches(work, batch=1, group=lambda item: item[0])
    held_a, first = batches.take(None)
    held_b, _ = batches.take(None)
    assert first == [("a", 0)] and held_b == ("b", False)
    held_b, _ = batches.take(held_b)
    held_b, stolen = batches.take(held_b)        # b done: the thief takes a's last item
    assert stolen == [("a", 7)] and held_b == ("a", True)
    assert batches.take(held_b)[1] == [("a", 6)]  # and goes on from a's end
    assert batches.take(held_a)[1] == [("a", 1)]  # while a's first device goes on from its front


def test_every_item_is_dealt_once_across_impls():
    work = [(impl, i) for impl in "abcde" for i in range(7)]

    def open_runner(halt, device):
        return FakeRunner(Device(device.index + 2, "x"))  # never unusable
    dealer = Dealer([Device(0, "0"), Device(1, "1"), Device(2, "2")], open_runner, batch=3,
                    group=lambda item: item[0])
    got = list(dealer.rows(work, lambda w, run: run(w, "run")))
    dealer.stop()
    seen = sorted(w for w, _ in got)
    assert seen == sorted(work)


def test_no_device_left_stops_the_sweep():
    class Broken(FakeRunner):
        def run(self, w, run_id):
            raise DeviceUnusable("broke")
    dealer = Dealer([Device(0, "0"), Device(1, "1")], lambda halt, d: Broken(d), batch=1)
    with pytest.raises(DeviceUnusable):
        list(dealer.rows(list(range(4)), lambda w, run: run(w, "run")))
    dealer.stop()


def test_each_xdist_worker_takes_one_gpu():
    assert [xdist_gpu(f"gw{n}", ["0", "1"]) for n in range(4)] == ["0", "1", "0", "1"]
    assert xdist_gpu("gw5", ["GPU-a", "GPU-b", "GPU-c"]) == "GPU-c"
    assert xdist_gpu(None, ["0", "1"]) is None and xdist_gpu("gw0", []) is None


def overlapping(log: Path) -> list[tuple]:
    """Pairs of logged measurements (tests/faults.py's hook) of two workers that overlap."""
    spans = [tuple(map(float, line.split()[:2])) + (line.split()[2],)
             for line in log.read_text().splitlines()]
    return [(a, b) for a in spans for b in spans
            if a[2] < b[2] and a[0] < b[1] and b[0] < a[1]]


def test_bench_on_devices_times_one_device_at_a_time(tmp_path, monkeypatch, capsys):
    log = tmp_path / "measures"
    monkeypatch.setenv("KPARITY_FAULT_MEASURE_LOG", str(log))
    assert main(["--store", str(tmp_path / "s"), "--plugin", FAULTS, "bench", "--impl",
                 "torch:rms_norm", "--preset", "decode-1x", "--dtype", "f32,f16,bf16",
                 "--min-time", "0", "--timeout", "0.1", "--min-samples", "2", "--no-verify",
                 "--devices", "0,1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "timing one device at a time (GPUs of one host share power and PCIe): " \
           "--concurrent-timing to overlap" in out
    got = Store(tmp_path / "s").read("bench").to_pylist()
    assert len(got) == 3 and {r["status"] for r in got} == {"ok"}
    assert {r["device_index"] for r in got} == {0, 1}
    assert len({line.split()[2] for line in log.read_text().splitlines()}) == 2  # two workers
    assert overlapping(log) == []


def test_concurrent_timing_needs_devices(tmp_path, capsys):
    assert main(["--store", str(tmp_path / "s"), "bench", "--impl", "torch:rms_norm",
                 "--concurrent-timing"]) == 2
    assert "only with --devices" in capsys.readouterr().out


def test_nightly_hands_devices_to_its_steps(tmp_path, capsys):
    pytest.importorskip("plotly")
    assert main(["--store", str(tmp_path / "s"), "nightly", "--out", str(tmp_path / "site"),
                 "--impl", "torch:rms_norm", "--devices", "0,0"]) == 2
    assert "device 0 twice" in capsys.readouterr().out


def _hold_and_die(lock, ready):
    """Takes the timing lock and dies holding it, as a worker killed mid-measurement does."""
    with lock:
        ready.set()
        os._exit(1)


def test_the_timing_lock_is_released_when_its_holder_dies(tmp_path):
    """A worker killed while it times (a hang past its limit, a crash) must not leave the lock
    held: every other device would wait on it for the rest of the sweep."""
    import multiprocessing

    from runners.devices import HostLock

    ctx = multiprocessing.get_context("spawn")
    lock, ready = HostLock(str(tmp_path / "lock")), ctx.Event()
    holder = ctx.Process(target=_hold_and_die, args=(lock, ready))
    holder.start()
    assert ready.wait(60)
    holder.join(60)
    assert holder.exitcode == 1
    taken = threading.Event()
    waiter = threading.Thread(target=lambda: (lock.__enter__(), taken.set(), lock.__exit__()),
                              daemon=True)
    waiter.start()
    assert taken.wait(10), "the lock stayed held after its holder died"


@pytest.mark.parametrize("workers, shared", [(4, True), (2, False)])
def test_timing_tests_skip_where_xdist_workers_share_a_gpu(monkeypatch, workers, shared):
    """gw3 of `workers` on two GPUs takes GPU 1; with more workers than GPUs the `timing` tests
    get a skip reason (their kernels would overlap), with a worker per GPU they run."""
    from tests import conftest

    monkeypatch.setattr(devices, "visible_gpus", lambda: ["0", "1"])  # two GPUs seen
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    monkeypatch.setattr(conftest, "SHARED_GPU", None)
    conftest.pin_xdist_worker()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert bool(conftest.SHARED_GPU) == shared
    if shared:
        assert "-n 2" in conftest.SHARED_GPU


@pytest.mark.parametrize("args, dist, expected", [
    (["-n", "2"], "load", "worksteal"),           # -n alone: xdist's default, replaced
    (["-n", "2", "--dist", "load"], "load", "load"),   # asked for: kept
    (["-n", "2", "--dist=loadfile"], "loadfile", "loadfile"),
    ([], "no", "no"),                             # no xdist run: nothing to schedule
])
def test_the_gate_under_xdist_steals_work_unless_told_otherwise(monkeypatch, args, dist,
                                                                expected):
    """Test times run from milliseconds to 20 s: idle workers take the others' pending tests."""
    from types import SimpleNamespace

    from tests import conftest

    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    config = SimpleNamespace(invocation_params=SimpleNamespace(args=args),
                             option=SimpleNamespace(dist=dist), getini=lambda name: [])
    conftest.steal_work(config)
    assert config.option.dist == expected
    # --dist given elsewhere than the command line is kept too
    config.option.dist = dist
    monkeypatch.setenv("PYTEST_ADDOPTS", "-q --dist load")
    conftest.steal_work(config)
    assert config.option.dist == dist


@pytest.mark.parametrize("method, threads", [("run", 8), ("bench", None)])
def test_checking_workers_share_the_cores_and_timing_workers_keep_plain_benchs(
        monkeypatch, method, threads):
    """`check --devices` workers start with cores / devices BLAS threads each; `bench --devices`
    ones with what a plain bench has (they time one at a time: CPU timings stay comparable)."""
    from argparse import Namespace

    from runners import threads as thread_shares

    made = {}

    class Recorder:
        def __init__(self, devices, open_runner, batch, say, method, group):
            self.batch = batch
            open_runner(None, devices[0])

        def rows(self, work, one):
            return iter(())

        def stop(self):
            pass

    monkeypatch.setattr(thread_shares, "cores", lambda: 16)
    monkeypatch.setattr(devices, "Dealer", Recorder)
    monkeypatch.setattr(devices, "_DeviceRunner", lambda halt, **kw: made.update(kw))
    args = Namespace(devices=[Device(0, "0"), Device(1, "1")], plugin=None)
    with devices._dealt(args, {"torch"}, 8, lambda *a, **k: None, "items", method=method):
        pass
    assert made["threads"] == threads


@pytest.mark.parametrize("markexpr, gpus, expected", [
    ("gpu", ["0", "1"], 2),            # the gate: a worker per GPU
    ("gpu and not timing", ["3"], 1),
    ("gpu", [], None),                 # no GPU seen: xdist's own count (the guard then speaks)
    ("not gpu", ["0", "1"], None),     # the CPU tests: one worker per core
    ("", ["0", "1"], None),
])
def test_n_auto_under_the_gate_is_one_worker_per_gpu(monkeypatch, markexpr, gpus, expected):
    from types import SimpleNamespace

    from tests import conftest

    monkeypatch.setattr(devices, "visible_gpus", lambda: gpus)
    config = SimpleNamespace(getoption=lambda name: markexpr)
    assert conftest.pytest_xdist_auto_num_workers(config) == expected


def test_under_xdist_the_long_tests_run_first_longest_first(monkeypatch):
    from types import SimpleNamespace

    from tests import conftest

    table = json.loads((Path(conftest.__file__).with_name("long_tests.json")).read_text())
    shorter_long, longer_long = sorted(table, key=table.get)[-2:]  # two of the table's tests
    names = ["tests/test_a.py::t1", shorter_long, "tests/test_a.py::t2", longer_long]
    items = [SimpleNamespace(nodeid=n) for n in names]
    conftest.long_first(items)
    longer = max(names[1], names[3], key=table.get)
    assert [i.nodeid for i in items][:2] == [longer, ({names[1], names[3]} - {longer}).pop()]
    assert [i.nodeid for i in items][2:] == ["tests/test_a.py::t1", "tests/test_a.py::t2"]


@pytest.mark.parametrize("n, workers", [(10, 4), (4968, 8), (3, 8), (7, 3), (5, 1)])
def test_xdist_chunks_are_what_worksteal_sends_first(n, workers):
    """scripts/simulate_worksteal.py's model of the first distribution (`xdist_chunks`)
    against pytest-xdist's own scheduler over `workers` idle workers (stand-in nodes; the
    scheduler's code is xdist's): contiguous stretches, in order."""
    from types import SimpleNamespace

    from xdist.scheduler import WorkStealingScheduling

    from scripts.simulate_worksteal import xdist_chunks

    class Node:
        shutting_down = False

        def __init__(self, i):
            self.sent, self.gateway = [], SimpleNamespace(id=f"gw{i}")

        def send_runtest_some(self, indices):
            self.sent.extend(indices)

        def shutdown(self):  # a worker given nothing is shut down
            self.shutting_down = True

    sched = WorkStealingScheduling.__new__(WorkStealingScheduling)
    sched.numnodes, sched.node2collection, sched.node2pending = workers, {}, {}
    sched.pending, sched.collection, sched.config = [], None, None
    sched.log, sched.steal_requested_from_node = (lambda *a: None), None
    nodes = [Node(i) for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, [f"t{i}" for i in range(n)])
    sched.schedule()
    assert [len(node.sent) for node in nodes] == xdist_chunks(n, workers)
    assert [i for node in nodes for i in node.sent] == list(range(n))  # contiguous, in order


def test_the_long_tests_table_names_tests_that_exist():
    """A renamed test would silently lose its place: every entry's file defines its function."""
    from tests import conftest

    table = json.loads((Path(conftest.__file__).with_name("long_tests.json")).read_text())
    assert table, "tests/long_tests.json is empty"
    root = Path(conftest.__file__).resolve().parent.parent
    for node, seconds in table.items():
        path, *names = node.split("::")
        function = names[-1].split("[")[0]
        assert f"def {function}(" in (root / path).read_text(), node
        assert seconds >= 5.0, node


def test_the_time_line_splits_the_wall_time_and_sums_each_devices_rows(monkeypatch):
    from verbs import console as common

    monkeypatch.setattr(common, "COMMAND_STARTED", 100.0)
    monkeypatch.setattr(common.time, "monotonic", lambda: 290.0)
    rows = [{"seconds": 70.0, "device_index": 0}, {"seconds": 80.5, "device_index": 1},
            {"seconds": 4.25, "device_index": 1}]
    assert common.time_line(112.0, 283.0, rows) == (
        "time: 190 s: 12 s until the first row, 171 s of rows (device 0: 70 s, device 1: 85 s "
        "inside the workers), 7.0 s after the last")
    assert common.time_line(None, None, []) == "time: 190 s, no row"
    assert "(3.5 s inside the workers)" in common.time_line(101.0, 105.0, [{"seconds": 3.5}])


def test_pytest_runs_without_xdist():
    """The gate runs straight from a checkout with pytest alone: xdist's hook in conftest must
    not make pytest refuse to start (an unknown hook is an error unless optional)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist",
                           "-p", "no:cacheprovider", "tests/test_threads.py", "-k", "share_splits"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
