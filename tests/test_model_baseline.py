"""The transformers baseline of `kparity model` (issue 28, `models/baseline_hf.py`): its decode
loop against its own one-forward logits on a tiny random Llama, the real SmolLM2 GGUF loaded by
transformers in f32 against kparity's reference (the conversion check), and bad arm names."""

from __future__ import annotations

import numpy as np
import pytest

from verbs.cli import main

TINY = ["model", "--model", "synthetic:tiny", "--tokens", "4"]


def test_decode_steps_match_the_one_forward_logits_and_are_timed():
    """A tiny random Llama in f32: the token-by-token decode (DynamicCache, what `time` runs)
    gives the one causal forward's logits. The two differ by f32 summation order only:
    |Δ| ~ u·√K·|terms| ≈ 6e-8 · √128 · O(1) ≈ 1e-6 on these O(1) logits; 1e-5 leaves 10x.
    A step at the wrong position or with a stale cache moves them by O(0.1)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from models.baseline_hf import Baseline, HFArm

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, tie_word_embeddings=True)
    arm = HFArm(Baseline("hf-test", "f32"), transformers.LlamaForCausalLM(cfg).eval(), 8)
    ids = np.random.default_rng(0).integers(0, 128, 8)
    one = arm.logits(ids)
    assert one.shape == (8, 128) and one.dtype == np.float64
    assert np.abs(arm.step_logits(ids) - one).max() < 1e-5
    assert np.abs(one[1:] - one[:-1]).max() > 0.1  # the positions differ: the check can fail
    timing = arm.time(ids)
    assert timing.steps == 8 - 3 and timing.p10_ms <= timing.ms_per_token <= timing.p90_ms
    weights = sum(p.numel() * 4 for p in arm.model.parameters())
    assert arm.step_bytes(3) == weights + 2 * 2 * 2 * 16 * 4 * 4  # + K, V of positions 0..3


# nightly: the real model file (32 s on a 2-core CPU); the tiny model's tests cover the path
@pytest.mark.nightly
def test_hf_f32_matches_the_reference_in_f32(tmp_path):
    """The real SmolLM2 Q4_1 file, loaded by transformers and run in f32, against kparity's
    reference plan at T = f32 on 6 random token ids (random ids: the tokenizer is not what is
    checked here, and loading it costs seconds). Both compute the same model in f32 or better
    (the reference: float64 oracles rounded to f32 at each op; transformers: f32 throughout), so
    their KLD is f32 arithmetic alone. Bound, by `models.metrics.gate`'s reasoning (KLD ≈ ½ ε²
    L², L ≈ 20 the logits' magnitude): f32 accumulation over K <= 1536 is at worst ~u·√K ≈ 2e-6
    relative per GEMV, ~15x that (√(30 layers x 7 GEMVs)) at the logits: ε ≈ 3.5e-5, KLD ≈ 2.5e-7.
    1e-6 leaves 4x, and sits 10x below one f16 rounding of the logits alone (≈ 1e-5), so a
    conversion that lost precision, let alone a Q/K row order or RoPE pairing mismatch
    (KLD O(0.1-1)), fails it. (Measured: ~1e-11.)"""
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from models.gate import Model, evaluate
    from models.gguf_file import SHA256, fetch, load_weights

    path = fetch()
    model = Model("smollm2", load_weights(path), None, SHA256, 0, path)
    ids = np.random.default_rng(0).integers(0, model.weights.config.vocab, 6)
    (row,) = evaluate(model, ["hf-f32"], "f32", {"random-0": ids})
    assert row["plan"] == "hf-f32" and row["dtype"] == "f32" and row["positions"] == 5
    assert row["gate"] == "report" and row["gate_reasons"].startswith("baseline: transformers")
    assert row["mean_kld"] < 1e-6 and row["same_top_p"] == 1.0


@pytest.mark.parametrize("argv, rc, said", [
    (["--plan", "hf-bf17"], 2, "hf-bf16"),            # unknown: the closest names first
    (["--plan", "torch,hf-f32"], 2, "--model smollm2"),  # a synthetic model has no GGUF file
])
def test_bad_arm_is_refused(tmp_path, capsys, argv, rc, said):
    assert main(["--store", str(tmp_path / "s"), *TINY, *argv]) == rc
    out = capsys.readouterr().out
    assert "error:" in out and said in out


def test_compiled_baseline_says_it_needs_cuda(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the compiled baseline runs")
    assert main(["--store", str(tmp_path / "s"), *TINY, "--plan", "hf-bf16-compiled"]) == 3
    assert "torch.compile baselines run on CUDA only" in capsys.readouterr().out
