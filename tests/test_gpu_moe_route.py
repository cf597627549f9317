"""The CUDA MoE routing impls on the GPU (issue 31, `gpu_impls/cuda/moe_route.py`), beyond the gate
(tests/test_gpu.py runs them over their ops' gate cases too):

* `cuda:kp_moe_router`: every scoring at the models' shapes at T = 1 and 2048 in every dtype;
  skewed routing, exact ties and non-finite logits at T = 2048; group-limited selection
  (DeepSeek-V3's 8 groups of 32, 4 kept; groups of one expert; the 32-group limit); E below a
  warp, k = E, E = 1024 and k = 32 (the contract's limits). Ties go to the smaller id exactly
  (not as a near-tie), NaN is never chosen while k finite scores remain;
* `cuda:kp_moe_dispatch`: T = 1 (most experts empty), T = 2048 at k = 8 / E = 128 and k = 10 /
  E = 512 (every warp of a block holds slots), one hot expert, every token on the same k experts,
  slot counts that leave warps partial or empty: counts, offsets, perm and inv_perm exact;
* `cuda:kp_moe_permute`, `cuda:kp_moe_unpermute`, `cuda:kp_moe_scatter_add`: T = 1 and 2048 at
  the models' k and H, every dtype, H with a partial 16-byte chunk, the element path on
  unaligned buffers (the same bits as the vector path); unpermute and scatter-add bit for bit
  equal to a NumPy f32 emulation of their declared orders; the round trip dispatch -> permute ->
  unpermute / scatter-add with weights 1/k (k a power of two: exact in f32) returns x bit for bit;
* determinism: the scatter-add is bit-identical over repeated runs at T = 2048, k = 8, while the
  atomic mutant (tests/mutants.py MOE_ROUTE_CUDA_MUTANTS) passes each single run (inside the
  bound) and fails `--repeat`'s determinism check. That catch is probabilistic: it needs the
  atomics' arrival order to differ between runs, which 512 Ki f32 outputs each receiving 8
  concurrent atomic adds from threads of different blocks make overwhelmingly likely (three
  runs are compared).

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gpu_impls
from cases.configs import config
from cases.generate import Work, plan
from cases.model import Case, make_inputs
from cases.moe_route import MODELS, router
from runners.correctness import check, repeated_row, run_impl
from runners.verdicts import is_failure, repro_command
from tests.gpu_helpers import assert_passes, cuda_backend, impl

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]
IMPLS = ("cuda:kp_moe_router", "cuda:kp_moe_dispatch", "cuda:kp_moe_permute",
         "cuda:kp_moe_unpermute", "cuda:kp_moe_scatter_add")
NUMPY = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


# --- the gate cases -------------------------------------------------------------------------------

def _gate_work() -> list[Work]:
    registered = gpu_impls.impls()
    return [w for name in IMPLS for w in plan([registered[name]])]


@pytest.mark.parametrize("work", _gate_work(), ids=lambda w: f"{w.impl.id}-{w.case.label}-"
                                                             f"{w.case.dtype}-{w.case.id[:8]}")
def test_gate_cases(work):
    """Every gate case of the ops (valid: within the oracle's bound or exact; violating:
    rejected before any launch)."""
    row = check(work, cuda_backend())
    assert not is_failure(row), (f"{row['status']} {work.impl.id} {work.case.short()} "
                                 f"({work.case.label}): {row['message']}\n"
                                 f"repro: {repro_command(work.impl.id, work.case.id)}")


# --- the router -----------------------------------------------------------------------------------

def _model_router(m: str, t: int, dtype: str, dist: str = "normal") -> Case:
    scoring, norm, scale = MODELS[m]
    c = config(m)
    return router(t, c.experts, c.top_k, scoring, norm, scale, dtype, f"gpu:{m}", dist)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("tokens", [1, 2048])
@pytest.mark.parametrize("model", list(MODELS))
def test_router_at_the_models(model, tokens, dtype):
    """Nemotron-3-Nano (sigmoid + bias, E 128, k 6, scale 2.5), Qwen3-30B-A3B (softmax_topk,
    E 128, k 8) and Qwen3-Next (softmax, E 512, k 10) at decode and prefill."""
    assert_passes("cuda:kp_moe_router", _model_router(model, tokens, dtype))


@pytest.mark.parametrize("dist", ["hot_expert", "exact_ties", "nonfinite"])
@pytest.mark.parametrize("model", list(MODELS))
def test_router_distributions_at_2048_tokens(model, dist):
    assert_passes("cuda:kp_moe_router", _model_router(model, 2048, "bf16", dist))


# (tokens, experts, top_k, groups, topk_group): DeepSeek-V3's 8 groups of 32 experts, 4 kept, at
# decode, a partial router block and prefill; groups of one expert (a group's score its only
# one); the limit of 32 groups; 2 groups, one kept (the kept group must supply all k)
GROUPED = ((1, 256, 8, 8, 4), (7, 256, 8, 8, 4), (2048, 256, 8, 8, 4), (64, 16, 4, 16, 5),
           (64, 1024, 32, 32, 8), (64, 64, 8, 2, 1))


@pytest.mark.parametrize("shape", GROUPED, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_router_group_limited(shape, dtype):
    t, e, k, groups, topk_group = shape
    for norm in (0, 1):
        assert_passes("cuda:kp_moe_router", router(t, e, k, "sigmoid_bias", norm, 2.5, dtype,
                                                   "gpu:grouped", groups=groups,
                                                   topk_group=topk_group))


# (experts, top_k): fewer experts than a warp's lanes, k = E, E no multiple of 32, the limits
EDGES = ((8, 8), (5, 1), (20, 7), (100, 32), (1024, 32), (1024, 1), (33, 2))


@pytest.mark.parametrize("shape", EDGES, ids=lambda s: f"E{s[0]}-k{s[1]}")
@pytest.mark.parametrize("scoring", ["softmax_topk", "softmax", "sigmoid_bias"])
def test_router_edges(shape, scoring):
    e, k = shape
    for t, dtype in ((1, "f32"), (9, "bf16")):
        assert_passes("cuda:kp_moe_router", router(t, e, k, scoring, 1, 1.0, dtype,
                                                   "gpu:edges"))


def _route(case: Case, inputs: dict) -> dict:
    return run_impl(impl("cuda:kp_moe_router"), cuda_backend(), case, inputs)


@pytest.mark.parametrize("scoring", ["softmax_topk", "sigmoid_bias"])
def test_router_ties_go_to_the_smaller_id(scoring):
    """Equal scores: the smaller id wins, exactly (no near-tie): all-equal rows choose 0..k-1;
    the `exact_ties` rows (the k-th logit copied into the next three) the oracle's own set."""
    case = router(64, 128, 8, scoring, 1, 1.0, "bf16", "gpu:ties", "exact_ties")
    inputs = make_inputs(case)
    if scoring == "sigmoid_bias":  # equal logits tie only without the bias
        inputs = {**inputs, "correction_bias": np.zeros_like(inputs["correction_bias"])}
    got = _route(case, inputs)["ids"]
    want = case.spec.oracle(inputs, case)["ids"].astype(np.int64)
    np.testing.assert_array_equal(np.sort(got, axis=1), np.sort(want, axis=1))
    flat = {**inputs, "logits": np.zeros_like(inputs["logits"])}
    np.testing.assert_array_equal(_route(case, flat)["ids"],
                                  np.broadcast_to(np.arange(8), (64, 8)))


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid_bias"])
def test_router_never_chooses_nan(scoring):
    """Rows with NaN logits at the otherwise best experts: the k chosen are the best finite
    ones. Under softmax every weight of such a row is NaN (the softmax over a NaN row, as the
    oracle's); under sigmoid_bias the chosen weights are finite."""
    case = router(16, 64, 6, scoring, 1, 1.0, "f32", "gpu:nan")
    inputs = make_inputs(case)
    logits = np.asarray(inputs["logits"]).copy()
    best = np.argsort(-logits, axis=1, kind="stable")[:, :3]
    np.put_along_axis(logits, best, np.nan, axis=1)
    inputs = {**inputs, "logits": logits,
              "correction_bias": np.zeros_like(inputs["correction_bias"])}
    out = _route(case, inputs)
    finite = np.where(np.isnan(logits), -np.inf, logits)
    want = np.argsort(-finite, axis=1, kind="stable")[:, :6]
    np.testing.assert_array_equal(np.sort(out["ids"], axis=1), np.sort(want, axis=1))
    assert np.isnan(out["weights"]).all() if scoring == "softmax" else \
        np.isfinite(out["weights"]).all()


# --- dispatch -------------------------------------------------------------------------------------

def _dispatch_case(t: int, e: int, k: int, dist: str = "normal") -> Case:
    return Case.make("moe_dispatch", {"tokens": t, "experts": e, "top_k": k}, "f32", dist,
                     label="gpu:dispatch")


# (tokens, experts, top_k): decode (most experts empty), prefill at Qwen3-30B-A3B and
# Qwen3-Next, Nemotron's k 6, slot counts that leave a block's 8 warps partial or empty (each
# warp owns ceil(n / 256) * 32 slots: n = 300 -> 64 a warp, warps 0-3 whole, 4 partial, 5-7
# empty; n = 222 -> 32, warp 6 partial, 7 empty; n = 8000 -> 1024, warp 7 partial), one expert
DISPATCH = ((1, 128, 8), (1, 512, 10), (2048, 128, 8), (2048, 512, 10), (2048, 128, 6),
            (300, 4, 1), (37, 128, 6), (1000, 16, 8), (5, 1, 1))


@pytest.mark.parametrize("shape", DISPATCH, ids=lambda s: "-".join(map(str, s)))
def test_dispatch_shapes(shape):
    assert_passes("cuda:kp_moe_dispatch", _dispatch_case(*shape))


@pytest.mark.parametrize("tokens", [7, 2048])
def test_dispatch_skewed(tokens):
    """One hot expert (every token's first choice), and every token on the same k experts (one
    block places all T slots of its expert, the other E - k experts are empty)."""
    assert_passes("cuda:kp_moe_dispatch", _dispatch_case(tokens, 128, 8, "hot_expert"))
    case = _dispatch_case(tokens, 128, 8)
    same = {"ids": np.broadcast_to(np.array([5, 3, 120, 0, 64, 7, 127, 9], np.int32),
                                   (tokens, 8)).copy()}
    got = run_impl(impl("cuda:kp_moe_dispatch"), cuda_backend(), case, same)
    want = case.spec.oracle(same, case)
    for name in ("counts", "offsets", "perm", "inv_perm"):
        np.testing.assert_array_equal(got[name], want[name].astype(np.int32), err_msg=name)


# --- permute, unpermute, scatter-add --------------------------------------------------------------

ROW_OPS = ("moe_permute", "moe_unpermute", "moe_scatter_add")


def _rows_case(op: str, t: int, k: int, h: int, dtype: str = "bf16",
               dist: str = "normal") -> Case:
    return Case.make(op, {"tokens": t, "top_k": k, "hidden": h}, dtype, dist, label="gpu:rows")


# (model, tokens, dtype): every model at decode in every dtype and at a short prefill (67 rows:
# many blocks, a partial last one) in bf16 on every commit; at a real prefill (2048, 3-6 s a
# test) in bf16 (and one in f32: the widest rows) nightly
NIGHTLY = pytest.mark.nightly
MODEL_ROWS = ([(m, 1, dtype) for m in MODELS for dtype in ("f32", "f16", "bf16")]
              + [(m, 67, "bf16") for m in MODELS]
              + [pytest.param(m, 2048, "bf16", marks=NIGHTLY) for m in MODELS]
              + [pytest.param("qwen3-30b-a3b", 2048, "f32", marks=NIGHTLY)])


@pytest.mark.parametrize("model, tokens, dtype", MODEL_ROWS,
                         ids=lambda v: str(v))
@pytest.mark.parametrize("op", ROW_OPS)
def test_rows_at_the_models(op, model, tokens, dtype):
    c = config(model)
    assert_passes(f"cuda:kp_{op}", _rows_case(op, tokens, c.top_k, c.hidden, dtype))


@pytest.mark.parametrize("hidden", [1, 3, 100, 2050])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("op", ROW_OPS)
def test_rows_partial_chunks(op, dtype, hidden):
    """H no multiple of the 16-byte vector: the element path, the last chunk partial."""
    for dist in ("normal", "nonfinite"):
        assert_passes(f"cuda:kp_{op}", _rows_case(op, 9, 4, hidden, dtype, dist))


def _run_unaligned(impl_id: str, case: Case, inputs: dict) -> dict:
    """`impl_id` run on device copies of `inputs` and outputs that start one element past a
    16-byte boundary (the element path), its outputs back on the host."""
    import cupy

    backend, im = cuda_backend(), impl(impl_id)

    def shifted(shape, dtype) -> object:
        size = int(np.prod(shape))
        return cupy.empty(size + 16, dtype=dtype)[1:1 + size].reshape(shape)

    dev = {}
    for name, a in inputs.items():
        d = backend.to_device(a)
        dev[name] = shifted(d.shape, d.dtype)
        dev[name][...] = d
    spec = case.spec
    storage = {"f32": np.float32, "f16": np.uint16, "bf16": np.uint16}  # CuPy's dtypes
    out = {t.name: shifted(t.shape_of(case), storage[t.dtype(case)]) for t in spec.outputs}
    im.run(im.contract.check(im.id, case), dev, out, case)
    backend.synchronize()
    return {t.name: backend.to_host(out[t.name], t.dtype(case)) for t in spec.outputs}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("op", ROW_OPS)
def test_rows_element_path_on_unaligned_buffers_is_the_vector_path(op, dtype):
    case = _rows_case(op, 33, 8, 256, dtype)
    inputs = make_inputs(case)
    aligned = run_impl(impl(f"cuda:kp_{op}"), cuda_backend(), case, inputs)
    unaligned = _run_unaligned(f"cuda:kp_{op}", case, inputs)
    for name in aligned:
        np.testing.assert_array_equal(_bits(unaligned[name]), _bits(aligned[name]),
                                      err_msg=name)


def _f32_combine(y: np.ndarray, w: np.ndarray, rows: np.ndarray, dtype: str,
                 from_zero: bool) -> np.ndarray:
    """out[t] = (w[t, 0] y[rows[t, 0]] + w[t, 1] y[rows[t, 1]]) + ... (from 0 + the first
    product where `from_zero`: the scatter-add's declared start), each product and each sum
    rounded to f32 (the kernels' __fmul_rn / __fadd_rn), then rounded to T once."""
    y = np.asarray(y).astype(np.float32)
    out = np.zeros((rows.shape[0], y.shape[1]), np.float32) if from_zero else None
    for j in range(rows.shape[1]):
        prod = (w[:, j:j + 1].astype(np.float32) * y[rows[:, j]]).astype(np.float32)
        out = prod if out is None else (out + prod).astype(np.float32)
    return out.astype(NUMPY[dtype])


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("tokens", [1, 67, pytest.param(2048, marks=NIGHTLY)])
def test_combines_are_their_declared_f32_orders_bit_for_bit(tokens, dtype):
    """unpermute: the products summed in j order; scatter-add: in the order of their sorted
    positions, from 0. Normal data: no subnormal product for -ftz to flush."""
    k, h = 8, 2048
    case = _rows_case("moe_unpermute", tokens, k, h, dtype)
    inputs = make_inputs(case)
    got = run_impl(impl("cuda:kp_moe_unpermute"), cuda_backend(), case, inputs)["out"]
    rows = np.asarray(inputs["inv_perm"]).astype(np.int64).reshape(tokens, k)
    want = _f32_combine(inputs["y_sorted"], np.asarray(inputs["weights"]), rows, dtype, False)
    np.testing.assert_array_equal(_bits(got), _bits(want))

    case = _rows_case("moe_scatter_add", tokens, k, h, dtype)
    inputs = make_inputs(case)
    got = run_impl(impl("cuda:kp_moe_scatter_add"), cuda_backend(), case, inputs)["out"]
    perm = np.asarray(inputs["perm"]).astype(np.int64)
    inv = np.argsort(perm).reshape(tokens, k)
    order = np.argsort(inv, axis=1)  # each token's slots in sorted-position order
    rows = np.take_along_axis(inv, order, 1)
    w = np.take_along_axis(np.asarray(inputs["weights"]), order, 1)
    want = _f32_combine(inputs["y_sorted"], w, rows, dtype, True)
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("k", [1, 8])
@pytest.mark.parametrize("tokens", [1, 2048])
def test_dispatch_permute_combine_round_trip(tokens, k):
    """Random routing through the CUDA dispatch, permute, then unpermute and scatter-add with
    weights 1/k: x bit for bit (k x/k summed in f32 is exact for bf16 x, k a power of two)."""
    backend, e, h = cuda_backend(), 128, 2048
    rng = np.random.default_rng(31)
    ids = np.stack([rng.permutation(e)[:k] for _ in range(tokens)]).astype(np.int32)
    layout = run_impl(impl("cuda:kp_moe_dispatch"), backend,
                      Case.make("moe_dispatch", {"tokens": tokens, "experts": e, "top_k": k},
                                "f32"), {"ids": ids})
    rows = {"tokens": tokens, "top_k": k, "hidden": h}
    x = make_inputs(Case.make("moe_permute", rows, "bf16"))["x"]
    x_sorted = run_impl(impl("cuda:kp_moe_permute"), backend,
                        Case.make("moe_permute", rows, "bf16"),
                        {"x": x, "perm": layout["perm"]})["x_sorted"]
    w = np.full((tokens, k), 1.0 / k, np.float32)
    back = run_impl(impl("cuda:kp_moe_unpermute"), backend,
                    Case.make("moe_unpermute", rows, "bf16"),
                    {"y_sorted": x_sorted, "weights": w, "inv_perm": layout["inv_perm"]})
    np.testing.assert_array_equal(_bits(back["out"]), _bits(x))
    added = run_impl(impl("cuda:kp_moe_scatter_add"), backend,
                     Case.make("moe_scatter_add", rows, "bf16"),
                     {"y_sorted": x_sorted, "weights": w, "perm": layout["perm"]})
    np.testing.assert_array_equal(_bits(added["out"]), _bits(x))


# --- determinism and the atomic mutant ------------------------------------------------------------

def _determinism_case() -> Case:
    """T = 2048, k = 8 (every output element receives 8 products), f32 out (an f32 sum's last
    bit is not hidden by a rounding to bf16)."""
    return _rows_case("moe_scatter_add", 2048, 8, 256, "f32")


def _repeats(impl_id: str, n: int = 3) -> dict:
    """`check --repeat n`'s row for `impl_id` on the determinism case (each repeat checked
    against the oracle, then the outputs' bits compared)."""
    work = Work(impl(impl_id), _determinism_case(), "valid")
    rows = [check(work, cuda_backend()) for _ in range(n)]
    assert all(r["status"] == "pass" for r in rows), [r["message"] for r in rows]
    return repeated_row(work.impl, rows, n)


def test_scatter_add_is_bit_identical_across_runs():
    row = _repeats("cuda:kp_moe_scatter_add")
    assert row["status"] == "pass" and "nondeterministic" not in row["flags"], row["message"]


def test_atomic_scatter_add_mutant_fails_only_the_determinism_check():
    """Each run of the atomic mutant is inside the bound (an order of the same k-term f32 sum);
    its bits differ between runs, which `--repeat` fails for an impl declaring determinism."""
    row = _repeats("cuda:mutant_kp_moe_scatter_add_atomic")
    assert row["status"] == "fail" and "nondeterministic: out differ" in row["message"], (
        f"the atomic scatter-add gave the same bits 3 times: {row['status']} {row['flags']}")


# --- no host sync: the premise of the speed table's route + sort rows -----------------------------

BUSY_S = 0.2


def _host_seconds_behind_a_busy_gpu(impl_id: str, case: Case) -> float:
    """Host seconds one call of `impl_id` takes while the GPU still runs a ~BUSY_S kernel queued
    before it (torch.cuda._sleep on the legacy default stream, which CuPy's launches follow): a
    call that waits for the GPU (a host sync, e.g. a device count read back to size a buffer)
    takes the rest of that kernel; one that only enqueues returns in microseconds."""
    import time

    import torch

    im = impl(impl_id)
    backend = gpu_impls.backend(im.backend)
    inputs = make_inputs(case)
    launch = im.contract.check(im.id, case)
    dev_in = {k: backend.to_device(v) for k, v in inputs.items()}
    outs = ({t.name: backend.guarded(t.shape_of(case), t.dtype(case)).array
             for t in case.spec.outputs} if backend.writes_in_place else None)
    im.run(launch, dev_in, outs, case)  # compiled, workspaces allocated
    backend.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles = int(10_000_000 * BUSY_S / (start.elapsed_time(end) / 1e3))
    torch.cuda._sleep(cycles)
    t0 = time.perf_counter()
    im.run(launch, dev_in, outs, case)
    host = time.perf_counter() - t0
    backend.synchronize()
    return host


@pytest.mark.parametrize("tokens", (1, 2048))
def test_kp_route_and_sort_never_wait_for_the_gpu_and_torchs_dispatch_does(tokens):
    """cuda:kp_moe_router and cuda:kp_moe_dispatch enqueue and return while the GPU is busy;
    torch:moe_dispatch (`torch.bincount` on CUDA reads the ids' max back to size its output)
    waits: the host sync the speed table's torch rows pay."""
    cuda_backend()
    m = "nemotron-3-nano-30b-a3b"
    c = config(m)
    route = _host_seconds_behind_a_busy_gpu("cuda:kp_moe_router",
                                            router(tokens, c.experts, c.top_k, *MODELS[m],
                                                   "bf16", "sync-probe"))
    sort_case = Case.make("moe_dispatch", {"tokens": tokens, "experts": c.experts,
                                           "top_k": c.top_k}, "f32", label="sync-probe")
    sort = _host_seconds_behind_a_busy_gpu("cuda:kp_moe_dispatch", sort_case)
    assert route < BUSY_S / 4 and sort < BUSY_S / 4, (route, sort)
    torch_sort = _host_seconds_behind_a_busy_gpu("torch:moe_dispatch", sort_case)
    assert torch_sort > BUSY_S / 2, f"torch:moe_dispatch returned in {torch_sort:.4f} s"
