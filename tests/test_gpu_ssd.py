"""`cuda:kp_ssd_chunked` on the GPU (issue 30, `gpu_impls/cuda/ssd.py`), beyond the gate
(tests/test_gpu.py runs it over ssd_chunked's gate cases):

* the op's oracle through the runner on cases that reach each part of the kernels: T not a
  multiple of the chunk or of 64, chunks of 64, 128 and 256 over several chunks, G = 1 and
  G = 8 (Nemotron-3-Nano's head shape: the 16-byte load paths at N = 128, P = 64; its 64 heads
  are the gate's, at T = 2), the gate on and
  off, the dt clamp, a large initial state, each dtype, dots "f32" and "T", the element-load
  paths (P and N not multiples of the vector), several P tiles with a partial one, a batch, and
  grid.y capped below the blocks (they stride);
* chunk-size invariance: one draw in chunks of 64, 128 and 256, each pair within the sum of
  their bounds;
* the chunked form against the float64 recurrence within the chunked bound (widened by the
  oracles' float64 difference, as tests/test_ssd.py does for torch), and the bound not vacuous;
* the mutants (tests/mutants.py): the group index h % G and the D skip dropped go red on the
  gate cases, which the real kernels pass.

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpu_impls
from cases.generate import Work, plan
from cases.model import Case, make_inputs
from runners.correctness import check, run_impl
from runners.oracle_cache import reference_and_bounds
from runners.verdicts import repro_command
from tests.test_ssd import _recurrence, _truth_budget
from tests.gpu_helpers import cuda_backend as _cuda

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]
MUTANTS = "tests/mutants.py"
IMPL = "cuda:kp_ssd_chunked"
TINY = {"heads": 4, "dim_p": 8, "groups": 2, "dim_n": 16}
# Nemotron-3-Nano's head shape (P 64, N 128, G 8) with fewer heads than its 64, so that the
# oracle's interval model (Q² H P values a chunk) stays seconds on the host: 2 and 1 heads a group
NEMOTRON16 = {"heads": 16, "dim_p": 64, "groups": 8, "dim_n": 128}
NEMOTRON8 = {**NEMOTRON16, "heads": 8}
GIVEN = {"initial_state": "given"}


def _impl(impl_id: str = IMPL):
    if "mutant" in impl_id:
        gpu_impls.load_plugin(MUTANTS)
    return gpu_impls.impls()[impl_id]


def _case(heads: dict, tokens: int, dtype: str, params: dict, batch: int = 1,
          label: str = "") -> Case:
    return Case.make("ssd_chunked", {**heads, "batch": batch, "tokens": tokens}, dtype,
                     params=params, label=label)


def _assert_passes(case: Case, impl_id: str = IMPL):
    row = check(Work(_impl(impl_id), case, "valid"), _cuda())
    assert row["status"] == "pass", (f"{row['status']} {impl_id} on {case.short()} "
                                     f"{dict(case.param_items)}: {row['message']}\n"
                                     f"case: {case.to_json()}")


# (id, heads, tokens, dtype, params, batch)
CASES = (
    ("t65", TINY, 65, "f32", GIVEN, 1),
    ("t65-gate", TINY, 65, "f16", {"gate": True}, 1),
    ("t1", TINY, 1, "bf16", GIVEN, 1),
    ("chunk128-t300", TINY, 300, "bf16", {"chunk": 128, **GIVEN}, 1),
    ("chunk256-t600", TINY, 600, "f32", {"chunk": 256, "dt": "slow", **GIVEN}, 1),
    ("chunk256-t259", TINY, 259, "f16", {"chunk": 256, "gate": True}, 1),
    ("g1-t130", {**TINY, "groups": 1}, 130, "bf16", GIVEN, 1),
    # Nemotron's heads (12-16 s each): the nightly tier
    pytest.param("nemotron16-t130", NEMOTRON16, 130, "bf16", {"gate": True, **GIVEN}, 1,
                 marks=pytest.mark.nightly),
    pytest.param("nemotron8-t200-chunk128", NEMOTRON8, 200, "f32", {"chunk": 128, **GIVEN}, 1,
                 marks=pytest.mark.nightly),
    ("dt-clamp", TINY, 130, "bf16", {"dt_min": 0.01, "dt_max": 0.1}, 1),
    ("dt-max-fast", TINY, 130, "f32", {"dt": "fast", "dt_max": 0.5, **GIVEN}, 1),
    ("state-large", TINY, 130, "f32", {"initial_state": "large"}, 1),
    ("state-large", TINY, 130, "bf16", {"initial_state": "large", "gate": True}, 1),
    ("dots-T", TINY, 130, "bf16", {"dots": "T", **GIVEN}, 1),
    ("dots-T", TINY, 130, "f16", {"dots": "T", "chunk": 128, **GIVEN}, 1),
    ("odd-t200", {"heads": 6, "dim_p": 3, "groups": 3, "dim_n": 5}, 200, "f32",
     {"gate": True, **GIVEN}, 1),
    ("p130-n100", {"heads": 2, "dim_p": 130, "groups": 1, "dim_n": 100}, 70, "bf16", GIVEN, 1),
    ("p36-n128", {"heads": 3, "dim_p": 36, "groups": 3, "dim_n": 128}, 66, "bf16",
     {"dt": "fast", **GIVEN}, 1),
    ("batch3", TINY, 100, "f16", GIVEN, 3),
)


@pytest.mark.parametrize("name, heads, tokens, dtype, params, batch", CASES,
                         ids=[f"{v[0]}-{v[3]}" for v in (getattr(c, "values", c) for c in CASES)])
def test_against_the_oracle(name, heads, tokens, dtype, params, batch):
    _assert_passes(_case(heads, tokens, dtype, params, batch, label=f"edge-{name}"))


def test_strides_past_a_capped_grid(monkeypatch):
    """Past CUDA's 65535 on grid.y the wrapper caps each grid and the blocks stride over the
    rest: here with the cap lowered to 2 (cb: 2 x 2 groups, state and out: 2 x 4 heads)."""
    from gpu_impls.cuda import ssd

    monkeypatch.setattr(ssd, "GRID_Y_MAX", 2)
    case = _case(TINY, 150, "bf16", {"gate": True, **GIVEN}, batch=2)
    launch = _impl().contract.check(IMPL, case)
    assert [v.grid[1] for v in launch.values()] == [2, 2, 2]
    _assert_passes(case)


def _outputs(case: Case, inputs: dict) -> tuple[dict, dict, dict]:
    """(the kernel's outputs, the oracle's exact outputs, the bound), as the runner judges."""
    impl, backend = _impl(), _cuda()
    exact, _, bound, _ = reference_and_bounds(case, inputs, impl.numerics_for(case),
                                              ftz=backend.flushes_subnormals)
    got = run_impl(impl, backend, case, inputs)
    return {k: np.asarray(v).astype(np.float64) for k, v in got.items()}, exact, bound


def test_chunk_size_invariance():
    """Chunks of 64, 128 and 256 over T = 300 (a tail in each), one draw: the kernel's results
    are within the sum of their bounds of each other, and not bit-identical (the chunk
    boundaries move the roundings)."""
    base = _case(TINY, 300, "f32", GIVEN)
    inputs = make_inputs(base)
    runs = {c: _outputs(base.replace(chunk=c), inputs) for c in (64, 128, 256)}
    for a, b in ((64, 128), (64, 256), (128, 256)):
        (ga, _, ba), (gb, _, bb) = runs[a], runs[b]
        for name in ("y", "state"):
            assert np.all(np.abs(ga[name] - gb[name]) <= ba[name] + bb[name]), (a, b, name)
    assert not np.array_equal(runs[64][0]["state"], runs[256][0]["state"])


@pytest.mark.parametrize("tokens", [1, 63, 64, 65, 130, 1000])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_chunked_is_within_its_bound_of_the_recurrence(tokens, dtype):
    """The kernel against the float64 recurrence (the truth), slow decay from a given state (the
    state remembers: errors accumulate across chunks): within the chunked bound widened by
    |chunk oracle − recurrence|; in f32 the kernel uses a visible share of it (not vacuous)."""
    case = _case(TINY, tokens, dtype, {"dt": "slow", **GIVEN})
    inputs = make_inputs(case)
    got, exact, bound = _outputs(case, inputs)
    budget = _truth_budget(got, exact, bound, _recurrence(inputs, case))
    assert budget <= 1.0, budget
    if dtype == "f32":
        assert budget > 0.005, budget


@pytest.mark.parametrize("mutant", ["mutant_kp_ssd_chunked_group_modulo",
                                    "mutant_kp_ssd_chunked_drop_d_skip"])
def test_mutants_go_red_on_the_gate_cases(mutant):
    """Each mutant fails at least one of ssd_chunked's gate cases (which the real kernels pass:
    tests/test_gpu.py): head h reading group h % G, y without D·x."""
    backend = _cuda()
    impl = _impl(f"cuda:{mutant}")
    work = plan([impl], dtypes=["bf16"], invalid=False)
    rows = [check(w, backend) for w in work]
    assert any(r["status"] == "fail" for r in rows), (
        f"{impl.id} passed all {len(rows)} cases; repro: "
        f"{repro_command(impl.id, work[0].case.id) if work else 'no case'}")
