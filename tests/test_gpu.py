"""The GPU gate: every impl that runs on an accelerator here, on every gate case of its op.

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run instead of
passing empty. A failure names the impl, the case id, the message and a one-line repro command.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

import gpu_impls
from cases.generate import plan, sampled
from runners.correctness import check, nondeterministic_outputs
from runners.verdicts import is_failure, repro_command
from tests.conftest import tier as run_tier

pytestmark = pytest.mark.gpu
MUTANTS = Path(__file__).with_name("mutants.py")


def _on_accelerator(impl) -> bool:
    be = gpu_impls.backend(impl.backend)
    return impl.available(be)[0] and be.accelerator


@functools.lru_cache(maxsize=None)
def _gpu_work(tier: str = "commit") -> tuple:
    """The gate's work (every accelerator impl on its tier's cases), planned once per process:
    three parametrizations read it (1.3 s each on a CPU at the commit tier's 3,741 items, in
    every xdist worker's collection)."""
    impls = [i for i in gpu_impls.impls().values()
             if _on_accelerator(i) and "mutant" not in i.name]
    work = []
    for impl in sorted(impls, key=lambda i: i.id):
        items = plan([impl], tier=tier)
        work += items if impl.gate_cases_max is None else sampled(items, impl.gate_cases_max)
    return tuple(work)


class _OracleAhead:
    """The gate's `Prefetch`, started at the first case this process runs: under pytest-xdist
    every worker collects the whole gate and runs its own stretch of it, so each worker's pool
    starts where its stretch begins and has its share of the cores (`pool_size`). Started at
    the list's head, every worker's pool computed the same entries in the same order while
    the workers whose stretches lie far down the list waited for theirs."""

    def __init__(self, work: list):
        self.work = work
        self.prefetch = None

    def wait(self, w):
        from runners.oracle_cache import Prefetch, pool_size

        if self.prefetch is None:
            start = next((i for i, x in enumerate(self.work) if x is w), 0)
            peers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
            self.prefetch = Prefetch(self.work, gpu_impls.backend, workers=pool_size(peers),
                                     start=start, peers=peers, take_pending=True)
        return self.prefetch.wait(w)

    def close(self) -> None:
        if self.prefetch is not None:
            self.prefetch.close()


@pytest.fixture(scope="session")
def oracle_ahead(request):
    """The oracle entries of every selected `test_gate` case missing from the cache, computed
    in a pool of processes while the device runs the cases before them
    (`runners/oracle_cache.py`); each test waits for its own."""
    ahead = _OracleAhead([item.callspec.params["work"] for item in request.session.items
                          if getattr(item, "originalname", "") == "test_gate"
                          and hasattr(item, "callspec")])
    yield ahead
    ahead.close()


def pytest_generate_tests(metafunc):
    """test_gate over the run's tier (`--tier`, tests/conftest.py): commit by default."""
    if metafunc.function.__name__ == "test_gate":
        metafunc.parametrize("work", _gpu_work(run_tier(metafunc.config)),
                             ids=lambda w: f"{w.impl.id}-{w.case.id}")


def test_gate(work, oracle_ahead):
    oracle_ahead.wait(work)
    row = check(work, gpu_impls.backend(work.impl.backend))
    assert not is_failure(row), (
        f"{row['status']} {work.impl.id} case {work.case.id} ({work.case.short()}, "
        f"{work.case.label}): {row['message']}\n"
        f"repro: {repro_command(work.impl.id, work.case.id)}")


@pytest.mark.cuda
@pytest.mark.parametrize("mutant", ["mutant_drop_eps", "mutant_round_before_weight",
                                    "mutant_skip_lane", "mutant_kp_skip_lane",
                                    *(f"{p}_{bug}" for bug in ("nibble_order", "group_off_by_one",
                                                               "drop_bias", "skip_last_group")
                                      for p in ("mutant_gemv", "mutant_kp_qgemv",
                                                "mutant_kp_qgemv_mma")),
                                    *(f"{p}_{bug}" for bug in ("nibble_order", "group_off_by_one",
                                                               "drop_bias", "skip_last_group",
                                                               "drop_eps")
                                      for p in ("mutant_rms_qgemv", "mutant_rms_qgemv_fast",
                                                "mutant_rms_qgemv_int8")),
                                    # FFAI decode attention (tests/mutants.py FFAI_MUTANTS)
                                    "mutant_ffai_drop_sink", "mutant_ffai_window_off_by_one",
                                    "mutant_ffai_gqa_modulo", "mutant_2pass_no_rescale",
                                    "mutant_2pass_drop_sink", "mutant_2pass_window_off_by_one",
                                    "mutant_2pass_gqa_modulo", "mutant_pass2_no_rescale",
                                    "mutant_kp_rope_pairing_adjacent",
                                    "mutant_kp_rope_llama3_no_smooth",
                                    "mutant_swiglu_no_clamp",
                                    "mutant_kv_update_one_off"])
def test_cuda_mutants_go_red(mutant, pytestconfig):
    """Each mutant fails some case of the run's tier (commit: the smallest cases that cover every
    dispatch boundary; the first failure ends the test, the cases after it cost only time)."""
    gpu_impls.load_plugin(str(MUTANTS))
    impl = gpu_impls.impls()[f"cuda:{mutant}"]
    work = [w for w in plan([impl], dtypes=["bf16", "f16"], invalid=False,
                            tier=run_tier(pytestconfig))
            if w.case.dist in ("normal", "tiny", "zero_rows")]
    assert work, f"{impl.id}: no case of its op in this tier"
    assert any(check(w, gpu_impls.backend("cuda"))["status"] == "fail" for w in work), (
        f"{impl.id} passed every case ({len(work)})")


def _determinism_work():
    """Per deterministic accelerator impl: one valid case per dtype (the first of each)."""
    out = []
    for w in _gpu_work():
        if w.expect == "valid" and w.impl.deterministic and w.case.dist == "normal" and not any(
                o.impl.id == w.impl.id and o.case.dtype == w.case.dtype for o in out):
            out.append(w)
    return out


@pytest.mark.parametrize("work", _determinism_work(), ids=lambda w: f"{w.impl.id}-{w.case.id}")
def test_deterministic_impls_are_bit_identical_run_to_run(work):
    differ = nondeterministic_outputs(work.impl, gpu_impls.backend(work.impl.backend), work.case)
    assert not differ, (f"{work.impl.id} declares deterministic=True but outputs {differ} differ "
                        f"between two runs of case {work.case.id}\n"
                        f"repro: {repro_command(work.impl.id, work.case.id)}")


def _exact_peer_work():
    """Per accelerator impl with an `exact_peer`: every valid normal case of a distinct shape
    and dtype (the split covers every expert of the case's stacked set)."""
    seen, out = set(), []
    for w in _gpu_work():
        key = (w.impl.id, w.case.dtype, w.case.dim_items)
        if w.impl.exact_peer and w.expect == "valid" and w.case.dist == "normal" and \
                key not in seen:
            seen.add(key)
            out.append(w)
    return out


@pytest.mark.parametrize("work", _exact_peer_work(), ids=lambda w: f"{w.impl.id}-{w.case.id}")
def test_exact_peers_are_bit_identical(work):
    from runners.impl_vs_impl import exact_peer_mismatches

    differ = exact_peer_mismatches(work.impl, gpu_impls.backend(work.impl.backend), work.case)
    assert not differ, (f"{work.impl.id} must equal {work.impl.exact_peer.peer} bit for bit: "
                        f"{differ}\nrepro: {repro_command(work.impl.id, work.case.id)}")


@pytest.mark.cuda
def test_pdl_launch_reads_what_the_kernel_before_it_wrote():
    """kp_rms_norm launched as a programmatic dependent launch right after a CuPy kernel that
    rewrites its input reads the new values, round after round (`pdl_wait` before any load).
    The shift by i changes the normalised rows each round (a scale would not)."""
    import cupy
    import numpy as np

    from gpu_impls.cuda._module import kernel, launch
    from gpu_impls.cuda.kp_norms import pick

    rows, n, rounds = 1 << 14, 64, 20
    items, tpr = pick(n // 4, rows)  # f32: 4 elements per 16-byte vector
    k = kernel("kp_rms_norm.cu", "kp_rms_norm", "f32", (), (items, tpr))
    base = cupy.random.default_rng(0).standard_normal((rows, n), dtype=cupy.float32)
    w = cupy.ones(n, dtype=cupy.float32)
    x = cupy.empty_like(base)
    outs = [cupy.empty_like(base) for _ in range(rounds)]
    for i, out in enumerate(outs):
        cupy.add(base, np.float32(i), out=x)  # the writer, queued just before the reader
        launch(k, (rows * tpr // 64, 1, 1), (64, 1, 1), (x, w, out, np.float32(1e-6), np.float32(0.0),
                                                 np.int32(rows), np.int32(n)), pdl=True)
    for i, out in enumerate(outs):
        xi = (base + np.float32(i)).astype(cupy.float64)
        ref = xi / cupy.sqrt((xi * xi).mean(axis=1, keepdims=True) + 1e-6)
        err = float(cupy.abs(out - ref).max())
        assert err < 1e-5, f"round {i}: max |out - ref| = {err} (read a stale input?)"


@pytest.mark.cuda
def test_kp_qgemv_mma_pdl_reads_the_x_the_kernel_before_wrote():
    """kp_qgemv_mma copies its scales and biases before `griddepcontrol.wait` (they are weights,
    which no kernel before it writes), x only after. Launched as a programmatic dependent launch
    right after a CuPy kernel that rewrites x, round after round, each output equals the same
    kernel's output on that x launched alone (bit for bit: the kernel is deterministic)."""
    import cupy
    import numpy as np

    from cases.model import Case, make_inputs
    from runners.correctness import run_impl

    be = gpu_impls.backend("cuda")
    impl = gpu_impls.impls()["cuda:kp_qgemv_mma"]
    case = Case.make("dequant_gemv", {"out": 14336, "in": 4096, "bits": 4, "group_size": 64},
                     "bf16")
    inputs = make_inputs(case)
    rng = np.random.default_rng(7)
    xs = [inputs["x"][rng.permutation(inputs["x"].shape[-1])] for _ in range(8)]  # new x each
    alone = [run_impl(impl, be, case, {**inputs, "x": x})["out"].view(np.uint16) for x in xs]
    launch = impl.contract.check(impl.id, case)
    dev = {k: be.to_device(v) for k, v in inputs.items()}
    sources = [be.to_device(x) for x in xs]
    (out_t,) = case.spec.outputs
    outs = [be.to_device(np.zeros(out_t.shape_of(case), alone[0].dtype)) for _ in xs]
    be.synchronize()
    for source, out in zip(sources, outs):
        cupy.bitwise_or(source, np.uint16(0), out=dev["x"])  # the writer, just before the reader
        impl.run(launch, dev, {out_t.name: out}, case)
    be.synchronize()
    for i, (out, ref) in enumerate(zip(outs, alone)):
        differ = np.flatnonzero(out.get() != ref)
        assert differ.size == 0, (
            f"round {i}: {differ.size} rows differ from the launch alone (read a stale x?), "
            f"first {differ[:8].tolist()}\nrepro: python3 -m pytest -m gpu tests/test_gpu.py -k "
            f"test_kp_qgemv_mma_pdl_reads_the_x_the_kernel_before_wrote")


def _with_x(inputs: dict, dtype: str, kind: str) -> dict:
    """The case's inputs with x moved into or out of kp_qgemv_mma's fast-path window."""
    import numpy as np

    from oracle.dtypes import round_to

    x = inputs["x"].astype(np.float64)
    if kind == "subnormal":  # bf16: a subnormal x leaves the window; f16: one inside it
        x[0] = 2.0 ** -130 if dtype == "bf16" else 2.0 ** -20
    elif kind == "wide":     # bf16: |x| spanning 2^100; f16: |x| >= 4096
        x[1], x[2] = (2.0 ** 60, 2.0 ** -40) if dtype == "bf16" else (8192.0, -0.25)
    return {**inputs, "x": round_to(x, dtype)}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("kind", ["in_window", "subnormal", "wide"])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("n", [1536, 1152])
def test_kp_qgemv_mma_exact_paths(dtype, kind, group, n):
    """kp_qgemv_mma reads the codes without the bf16/f16 subtraction when every nonzero |x| lies
    in a window (its docstring), else through (BASE + q) - BASE. Both are within the oracle's
    bound on x inside and outside the window, and the fast path equals the subtraction path
    (built with KPARITY_DIAG_SUBTRACT) bit for bit: it is the same sum scaled by 2^(k - TINY).
    in = 1152 (9 blocks of 128 codes, which the gate's 512 and 1536 never give) takes the
    kernel's other branches: a warp's last step shorter than 4 blocks, and at G = 128 an odd
    group count (the fold's unpaired path) and a super-block cut short."""
    import numpy as np

    from cases.model import Case, make_inputs
    from gpu_impls.cuda._module import mutant
    from runners.correctness import run_impl
    from oracle.metrics import compare

    be = gpu_impls.backend("cuda")
    impl = gpu_impls.impls()["cuda:kp_qgemv_mma"]
    subtract = mutant("cuda:kp_qgemv_mma", "kp_qgemv_mma_subtract", "KPARITY_DIAG_SUBTRACT")
    case = Case.make("dequant_gemv", {"out": 24, "in": n, "bits": 4, "group_size": group},
                     dtype)
    inputs = _with_x(make_inputs(case), dtype, kind)
    exact, ref = case.spec.reference(inputs, case)
    bound = case.spec.tolerance(inputs, exact, case)["out"]
    repro = (f"repro: python3 -m pytest -m gpu tests/test_gpu.py -k "
             f"'test_kp_qgemv_mma_exact_paths and {dtype} and {kind} and {group} and {n}'")
    out = run_impl(impl, be, case, inputs)["out"]
    verdict = compare(out, ref["out"], exact["out"], bound, dtype, case.spec.inf_may_be_nan)
    assert verdict["budget"] <= 1.0 and verdict["nonfinite_mismatch"] == 0, (
        f"kp_qgemv_mma, case {case.id} with x {kind}: budget {verdict['budget']:.3g}\n{repro}")
    slow = run_impl(subtract, be, case, inputs)["out"]
    differ = np.flatnonzero(out.view(np.uint16) != slow.view(np.uint16))
    assert differ.size == 0, (
        f"case {case.id} with x {kind}: fast and subtraction paths differ at rows "
        f"{differ[:8].tolist()}: {out[differ[:4]]} vs {slow[differ[:4]]}\n{repro}")
