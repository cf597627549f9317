"""The model-level gate on the GPU (issue 28, `models/decode.py`): the CUDA plan's decode step
as a CUDA graph computes the eager step's logits bit for bit (the step's position, length and
token read from the step buffer, not baked into the graph), after a prefill too; the CUDA plan
passes the gate and a CUDA GEMV mutant swapped in fails it; the real SmolLM2-135M where its
file is here (`KPARITY_GGUF` or the cache: the GPU machine gets it by carry).

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest

import gpu_impls
from models.decode import Decoder
from models.synthetic import config, random_weights
from verbs.cli import main

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]
MUTANTS = str(Path(__file__).with_name("mutants.py"))
SMOL = ["model", "--model", "synthetic:smollm2-135m", "--dtype", "f16", "--tokens", "16"]


@pytest.fixture(scope="module")
def smol():
    ok, why = gpu_impls.backend("cuda").available()
    if not ok:
        pytest.skip(why)
    return random_weights(config("smollm2-135m"), seed=0)


def _rows(store: Path) -> list[dict]:
    return ds.dataset(store / "model", format="parquet").to_table().to_pylist()


@pytest.mark.parametrize("prefill,batch", [(0, 1), pytest.param(7, 1, marks=pytest.mark.nightly),
                                           pytest.param(0, 3, marks=pytest.mark.nightly)])
def test_the_graph_step_is_the_eager_step_bit_for_bit(smol, prefill, batch):
    shape = (20,) if batch == 1 else (batch, 20)
    ids = np.random.default_rng(1).integers(0, smol.config.vocab, shape)
    dec = Decoder(smol, "cuda", "f16", max_len=24, batch=batch)
    eager = dec.logits(ids, prefill=prefill)
    dec.use_graph()
    graph = dec.logits(ids, prefill=prefill)
    assert dec._graph is not None  # the steps were replayed from a graph
    assert np.isfinite(graph).all() and np.array_equal(eager, graph)
    # replayed again from another load: the same logits (a new graph on the new caches)
    assert np.array_equal(dec.logits(ids, prefill=prefill), graph)


@pytest.mark.nightly  # the whole model gate twice (37-43 s on an H100): the nightly tier
def test_the_cuda_plan_passes_and_a_cuda_gemv_mutant_fails(smol, tmp_path):
    store = tmp_path / "store"
    assert main(["--store", str(store), *SMOL, "--plan", "cuda"]) == 0
    (good,) = _rows(store)
    assert good["gate"] == "pass" and good["mean_kld"] < 1e-4
    assert "cuda:kp_qgemv" in good["plan_json"]
    bad = tmp_path / "bad"
    assert main(["--store", str(bad), "--plugin", MUTANTS, *SMOL, "--plan", "cuda", "--swap",
                 "dequant_gemv=cuda:mutant_kp_qgemv_group_off_by_one"]) == 1
    (row,) = _rows(bad)
    assert row["gate"] == "fail" and row["mean_kld"] > 100 * max(good["mean_kld"], 1e-9)


def test_smollm2_cuda_plan_passes_on_a_short_text(tmp_path):
    from models.gguf_file import ENV, FILENAME, model_cache_dir

    import os

    if not (os.environ.get(ENV) or (model_cache_dir() / FILENAME).is_file()):
        pytest.skip(f"the SmolLM2 GGUF is not here (set {ENV}); nothing is downloaded here")
    store = tmp_path / "store"
    assert main(["--store", str(store), "model", "--plan", "cuda", "--dtype", "f16",
                 "--tokens", "24", "--text", "lincoln_gettysburg", "--speed",
                 "--prefill", "64"]) == 0
    (row,) = _rows(store)
    assert row["gate"] == "pass" and row["decode_mode"] == "graph"
    assert row["decode_tok_s"] > 0 and row["prefill_tokens"] == 64


def _baked_kv_update(launch, inputs, outputs, case):
    """A capturable cache update that writes at its case's `cache_lens`: Python numbers, which
    a CUDA graph bakes in (a plain copy per sequence, no host sync)."""
    kc, vc, row = inputs["k_cache"], inputs["v_cache"], 0
    for b, (start, new) in enumerate(zip(case.params["cache_lens"], case.params["new_lens"])):
        kc[b, :, start:start + new] = inputs["k"][row:row + new].transpose(0, 1)
        vc[b, :, start:start + new] = inputs["v"][row:row + new].transpose(0, 1)
        row += new
    return {"k_cache": kc, "v_cache": vc}


def test_an_impl_that_bakes_the_position_in_is_caught_and_the_step_stays_eager(smol):
    """Captured, `_baked_kv_update` would write every step into the captured slot. The first
    replay elsewhere is checked against the eager step (`Decoder._verify_replay`): the decoder
    notes it and stays eager, and its logits are the eager plan's."""
    from gpu_impls.contract import Contract, param_is
    from gpu_impls.impl import Impl
    from models.plan import plan

    impl = Impl("kv_cache_update", "torch", "test_baked_position", _baked_kv_update,
                Contract(invariants=(param_is("layout", "contiguous", "torch:kv_cache_update",
                                              other="paged"),)), doc="test only")
    if impl.id not in gpu_impls.impls():
        gpu_impls.register(impl)
    swapped = plan("cuda").swapped({"kv_update": impl.id})
    ids = np.random.default_rng(2).integers(0, smol.config.vocab, 12)
    dec = Decoder(smol, swapped, "f16", max_len=16)
    eager = dec.logits(ids)
    dec.use_graph()
    got = dec.logits(ids)
    assert dec.graph_failed and not dec.graph
    assert any("differs from the eager step" in n for n in dec.notes), dec.notes
    assert np.array_equal(got, eager)
