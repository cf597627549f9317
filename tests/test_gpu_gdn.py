"""Gated DeltaNet's CUDA impls on the GPU (issue 29, `gpu_impls/cuda/gdn.py`), beyond the gate
(tests/test_gpu.py runs both over their ops' gate cases):

* `cuda:kp_gdn_step` at every instance (K / 32 in 1..8, the float4 / float2 / scalar row layouts)
  and at V that leaves rows of a warp and whole warps of a block empty; over every value
  distribution at the seed's heads; applied T times, feeding its state back, it follows the
  recurrence: the outputs and the final state within `gdn_recurrent`'s own bound (and its
  decay-after-update mutant does not);
* `cuda:gdn_chunk_o` at one V tile and at the seed's largest V (8 tiles), one and two chunks,
  and with its grid capped below the chunks and heads (batch 2: the blocks stride);
* the CUDA mutants (tests/mutants.py GDN_CUDA_MUTANTS) go red on the gate cases.

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run.
"""

from __future__ import annotations

import numpy as np
import pytest

from cases.gdn import STEP_DISTS
from cases.generate import plan
from cases.model import Case, make_inputs
from runners.correctness import check, oracle_for, run_impl
from runners.verdicts import repro_command
from tests.gpu_helpers import cuda_backend as _cuda, impl as _impl, assert_passes as _assert_passes

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]
SEED = {"heads_k": 2, "heads_v": 4, "dim_k": 128, "dim_v": 128}  # the seed tests' heads


# --- kp_gdn_step ---------------------------------------------------------------------------------

# (dim_k, dim_v): every instance K / 32 = 1..8 (vectors of 1, 2 and 4 floats; two float4 a lane at
# 256), and V below, at and past the 16 rows of a block, not a multiple of a warp's 4 rows
STEP_SHAPES = ((32, 8), (64, 20), (96, 34), (128, 36), (160, 16), (192, 17), (224, 5),
               (256, 40))


@pytest.mark.parametrize("dim_k, dim_v", STEP_SHAPES)
def test_step_every_instance_and_partial_blocks(dim_k, dim_v):
    dims = {"batch": 3, "heads_k": 2, "heads_v": 4, "dim_k": dim_k, "dim_v": dim_v}
    _assert_passes("cuda:kp_gdn_step", Case.make("gdn_step", dims, "bf16"))


@pytest.mark.parametrize("name, params", STEP_DISTS, ids=[n for n, _ in STEP_DISTS])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_step_distributions_at_the_seed_heads(name, params, dtype):
    """The gate's distribution cases run at tiny heads (K = 16), which the kernel's contract
    rejects: here the same distributions at the seed's heads."""
    _assert_passes("cuda:kp_gdn_step", Case.make("gdn_step", {"batch": 2, **SEED}, dtype,
                                                 params=params, label=f"dist:{name}"))


def _steps(impl, backend, case: Case, inputs: dict) -> dict:
    """`impl` (op gdn_step) applied to each token of the gdn_recurrent `case` in turn, its
    state_out fed back as the next state_in: {"o": [B, T, Hv, V], "state": the last state}."""
    dims = {k: v for k, v in case.dims.items() if k != "tokens"}
    params = {k: case.params[k] for k in ("scale", "l2norm", "ftz")}
    step = Case.make("gdn_step", dims, case.dtype, params=params, label="steps")
    state, outs = np.asarray(inputs["h0"], dtype=np.float32), []
    for t in range(case.dims["tokens"]):
        x = {name: np.ascontiguousarray(inputs[name][:, t])
             for name in ("q", "k", "v", "g", "beta")}
        out = run_impl(impl, backend, step, {**x, "state_in": state})
        outs.append(out["o"])
        state = out["state_out"]
    return {"o": np.stack(outs, axis=1), "state": state}


def _budgets(got: dict, exact: dict, bound: dict) -> dict:
    """Per output, the largest |got - exact| / bound over the elements (inf where an error
    meets a zero bound)."""
    out = {}
    for name in ("o", "state"):
        err = np.abs(np.asarray(got[name]).astype(np.float64) - exact[name])
        b = np.broadcast_to(bound[name], err.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(err == 0, 0.0, err / b)
        out[name] = float(np.max(np.where(np.isnan(ratio), np.inf, ratio)))
    return out


def _recurrent_case(dtype: str, params: dict) -> Case:
    return Case.make("gdn_recurrent", {"batch": 2, "tokens": 24, **SEED}, dtype,
                     params={"initial_state": "given", **params})


STEP_CHAIN_PARAMS = (("default", {}), ("decay-near-one", {"decay": "near_one"}),
                     ("unit-keys", {"l2norm": False}), ("state-large", {"initial_state": "large"}))


@pytest.mark.parametrize("name, params", STEP_CHAIN_PARAMS, ids=[n for n, _ in STEP_CHAIN_PARAMS])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_step_applied_t_times_follows_the_recurrence(name, params, dtype):
    """24 steps from a given state equal `gdn_recurrent` over the 24 tokens: every output and
    the final state within the recurrent op's bound for this impl (its declared numerics)."""
    backend = _cuda()
    impl = _impl("cuda:kp_gdn_step")
    case = _recurrent_case(dtype, params)
    inputs = make_inputs(case)
    exact, _, bound = oracle_for(impl, backend, case, inputs)
    budgets = _budgets(_steps(impl, backend, case, inputs), exact, bound)
    assert max(budgets.values()) <= 1.0, f"budgets {budgets} ({case.to_json()})"


def test_step_mutant_applied_t_times_leaves_the_recurrence():
    """The decay-after-update mutant, chained the same way, breaks the recurrent bound: the
    chain test above can fail."""
    backend = _cuda()
    impl = _impl("cuda:mutant_kp_gdn_step_decay_after_update")
    case = _recurrent_case("f32", {})
    inputs = make_inputs(case)
    exact, _, bound = oracle_for(impl, backend, case, inputs)
    budgets = _budgets(_steps(impl, backend, case, inputs), exact, bound)
    assert max(budgets.values()) > 1.0, f"budgets {budgets} ({case.to_json()})"


# --- gdn_chunk_o ---------------------------------------------------------------------------------

# (batch, tokens, dim_v): one V tile and one chunk; the seed's largest V (8 tiles) over 2 chunks
# (the float64 interval oracle costs ~0.3 s per chunk, head and 128 columns)
CHUNK_O_SHAPES = ((1, 64, 32), (1, 128, 256))


@pytest.mark.parametrize("batch, tokens, dim_v", CHUNK_O_SHAPES)
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_chunk_o_tiles_and_chunks(batch, tokens, dim_v, dtype):
    dims = {**SEED, "batch": batch, "tokens": tokens, "dim_v": dim_v}
    _assert_passes("cuda:gdn_chunk_o", Case.make("gdn_chunk_o", dims, dtype))


def test_chunk_o_strides_past_a_capped_grid(monkeypatch):
    """Past CUDA's 65535 on grid.y (chunks) or grid.z (batch x heads) the wrapper caps the grid
    and each block strides over the rest: here with the cap lowered to 2 (3 chunks, 8 heads)."""
    from gpu_impls.cuda import gdn

    monkeypatch.setattr(gdn, "GRID_YZ_MAX", 2)
    dims = {**SEED, "batch": 2, "tokens": 192, "dim_v": 64}
    case = Case.make("gdn_chunk_o", dims, "bf16")
    assert _impl("cuda:gdn_chunk_o").contract.check("cuda:gdn_chunk_o", case).grid == (2, 2, 2)
    _assert_passes("cuda:gdn_chunk_o", case)


# --- mutants ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mutant", ["mutant_gdn_chunk_o_exclusive_mask",
                                    "mutant_kp_gdn_step_decay_after_update"])
def test_gdn_mutants_go_red(mutant):
    backend = _cuda()
    impl = _impl(f"cuda:{mutant}")
    work = plan([impl], dtypes=["bf16", "f16"], invalid=False)
    rows = [check(w, backend) for w in work]
    assert any(r["status"] == "fail" for r in rows), (
        f"{impl.id} passed all {len(rows)} cases; repro: "
        f"{repro_command(impl.id, work[0].case.id) if work else 'no case'}")
