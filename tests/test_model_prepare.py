"""Prepared weights (`Impl.prepare`, `models.decode.Decoder._prepare`): the model's decode loop
dequantizes each matrix of torch:dequant_linear / torch:qmm_dequant_linear once per decoder,
not at every call (issue 50: a SmolLM2 step re-dequantized all its weights, 0.9 tok/s on a
CPU), with the same bits as the per-call path; the op itself, as check and bench run it,
still dequantizes at every call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gpu_impls
import gpu_impls.torch.gemv as torch_gemv
import models.decode as decode
from cases.model import Case, make_inputs
from models.decode import Decoder
from models.role_cases import matrices
from models.synthetic import config, random_weights

TOKENS = np.random.default_rng(2).integers(0, 256, 8)


@pytest.fixture(scope="module")
def weights():
    return random_weights(config("tiny"), seed=0)


@pytest.fixture
def dequantized(monkeypatch):
    """The number of matrices torch's dequantization has made so far (a list of one count)."""
    count = [0]
    real = torch_gemv.dequantize_f32

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_gemv, "dequantize_f32", counting)
    return count


def test_the_torch_plan_dequantizes_each_matrix_once_per_decoder(weights, dequantized):
    """A regression to per-call dequantization makes the count grow with the steps."""
    n = len(matrices(weights)) - 1  # the embedding is gathered by quant_embedding, not prepared
    dec = Decoder(weights, "torch", "f32", max_len=16)
    assert dequantized[0] == n  # at build time
    dec.logits(TOKENS)
    dec.logits(TOKENS, prefill=3)  # the prefill's qmm shares the decode step's W_hat
    assert dequantized[0] == n
    assert not dec.notes


def test_prepared_weights_give_the_per_call_bits(weights, monkeypatch):
    """The decoder past its budget prepares nothing (each call dequantizes, as before the
    change): the logits, decoded and prefilled, are the same bits."""
    prepared = Decoder(weights, "torch", "f16", max_len=16)
    monkeypatch.setattr(decode, "PREPARE_BYTES", 0)
    per_call = Decoder(weights, "torch", "f16", max_len=16)
    assert any("prepared at each call" in n for n in per_call.notes)
    for prefill in (0, 3):
        assert np.array_equal(prepared.logits(TOKENS, prefill=prefill),
                              per_call.logits(TOKENS, prefill=prefill))


@pytest.mark.parametrize("impl_id, dims", [
    ("torch:dequant_linear", {"out": 64, "in": 128, "bits": 4, "group_size": 32}),
    ("torch:qmm_dequant_linear", {"m": 3, "out": 64, "in": 128, "bits": 4, "group_size": 32}),
])
def test_the_op_dequantizes_at_every_call_and_prepare_changes_no_bit(impl_id, dims,
                                                                      dequantized):
    """check and bench call `run` on the raw inputs: every call does the whole op."""
    impl = gpu_impls.impls()[impl_id]
    case = Case.make(impl.op, dims, "bf16", label="t")
    backend = gpu_impls.backend("torch")
    inputs = {k: backend.to_device(v) for k, v in make_inputs(case).items()}
    launch = impl.contract.check(impl.id, case)
    first = impl.run(launch, inputs, None, case)["out"]
    impl.run(launch, inputs, None, case)
    assert dequantized[0] == 2
    extra = impl.prepare({k: inputs[k] for k in ("w", "scales", "biases")}, case)
    again = impl.run(launch, {**inputs, **extra}, None, case)["out"]
    assert dequantized[0] == 3 and torch.equal(first, again)


def test_a_weight_written_during_a_run_is_refused(weights):
    dec = Decoder(weights, "torch", "f32", max_len=16)
    dec.logits(TOKENS)
    dec.ops[("q_proj", 0)].static["scales"].mul_(1)  # an in-place write: the version moves
    with pytest.raises(RuntimeError, match="L0.q was written during the run"):
        dec.logits(TOKENS)
