"""Gated DeltaNet's intra-chunk CUDA stages on the GPU (issue 29, `gpu_impls/cuda/gdn_intra.py`),
beyond the gate (tests/test_gpu.py runs the four over their ops' gate cases at tiny heads):

* each stage against its oracle at the seed's heads (K = V = 128: kkt's 32 k-vectors a row, two
  64-column tiles each of w and u) with T not a multiple of the chunk, chunks of 16, 32 and 64,
  batch 2, and in f32, f16 and bf16;
* GQA 4 with K and V off the 64-column tiles (K = 36: one partial w tile; V = 72: a second u
  tile of 8 columns, whose second 4-column group is past V), and Hk == Hv;
* every stage with grid.y capped below the chunks (the blocks stride);
* kkt's decay-sign mutant (tests/mutants.py GDN_INTRA_CUDA_MUTANTS) goes red on the gate cases.

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run.
"""

from __future__ import annotations

import pytest

from cases.generate import plan
from cases.model import Case
from runners.correctness import check
from runners.verdicts import repro_command
from tests.gpu_helpers import cuda_backend as _cuda, impl as _impl, assert_passes as _assert_passes

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]
SEED = {"heads_k": 2, "heads_v": 4, "dim_k": 128, "dim_v": 128}  # the seed tests' heads
STAGES = {"kp_gdn_chunk_cumsum": "gdn_chunk_cumsum", "kp_gdn_kkt": "gdn_kkt",
          "kp_gdn_solve_tril": "gdn_solve_tril", "kp_gdn_wy": "gdn_wy"}


# (heads, batch, tokens, chunk, dtype): two chunks and a tail of 2; a tail of 31 over a batch
# of 2; one token; a whole number of chunks of 16; GQA 4 with K and V off the wy tiles; Hk == Hv
CASES = (
    (SEED, 1, 130, 64, "bf16"),
    (SEED, 2, 95, 32, "f16"),
    (SEED, 1, 1, 64, "f32"),
    (SEED, 1, 64, 16, "bf16"),
    ({"heads_k": 1, "heads_v": 4, "dim_k": 36, "dim_v": 72}, 1, 70, 16, "f32"),
    ({"heads_k": 3, "heads_v": 3, "dim_k": 64, "dim_v": 100}, 1, 45, 32, "bf16"),
)


@pytest.mark.parametrize("name", STAGES)
@pytest.mark.parametrize("heads, batch, tokens, chunk, dtype", CASES,
                         ids=[f"hk{h['heads_k']}-hv{h['heads_v']}-k{h['dim_k']}-v{h['dim_v']}"
                              f"-b{b}-t{t}-c{c}-{d}" for h, b, t, c, d in CASES])
def test_stage_against_its_oracle(name, heads, batch, tokens, chunk, dtype):
    dims = {**heads, "batch": batch, "tokens": tokens}
    _assert_passes(f"cuda:{name}", Case.make(STAGES[name], dims, dtype, params={"chunk": chunk}))


@pytest.mark.parametrize("name", STAGES)
def test_stage_distributions(name):
    """The decay and beta extremes at the seed's heads (the gate has them at K = 16):
    decay near zero makes gc reach ~-1000 in a chunk (exp of the differences underflows)."""
    for params in ({"decay": "near_zero"}, {"decay": "near_one", "beta": "near_one"},
                   {"l2norm": False}):
        case = Case.make(STAGES[name], {**SEED, "batch": 1, "tokens": 65}, "bf16",
                         params={"chunk": 64, **params})
        _assert_passes(f"cuda:{name}", case)


@pytest.mark.parametrize("name", [n for n in STAGES if n != "kp_gdn_chunk_cumsum"])
def test_strides_past_a_capped_grid(name, monkeypatch):
    """Past CUDA's 65535 on grid.y (chunks) the wrapper caps the grid and each block strides
    over the rest: here with the cap lowered to 2 (6 chunks of 16, the last one partial)."""
    from gpu_impls.cuda import gdn_intra

    monkeypatch.setattr(gdn_intra, "GRID_YZ_MAX", 2)
    dims = {**SEED, "batch": 2, "tokens": 81, "dim_v": 72}
    case = Case.make(STAGES[name], dims, "bf16", params={"chunk": 16})
    assert _impl(f"cuda:{name}").contract.check(f"cuda:{name}", case).grid[1] == 2
    _assert_passes(f"cuda:{name}", case)


def test_kkt_decay_sign_mutant_goes_red():
    backend = _cuda()
    impl = _impl("cuda:mutant_kp_gdn_kkt_decay_sign")
    work = plan([impl], dtypes=["bf16", "f16"], invalid=False)
    rows = [check(w, backend) for w in work]
    assert any(r["status"] == "fail" for r in rows), (
        f"{impl.id} passed all {len(rows)} cases; repro: "
        f"{repro_command(impl.id, work[0].case.id) if work else 'no case'}")
