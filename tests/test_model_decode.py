"""The model-level decode loop (`models/decode.py`) on the tiny synthetic Llama: the reference
plan is the exact composition (against a Llama forward written here in NumPy), the torch and
MLX plans land within a small KL divergence of it, a planted wrong GEMV moves the logits by
orders of magnitude more, an exact swap moves nothing, and bad input is refused by name."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gpu_impls
from models.decode import Decoder
from models.decode_speed import step_bytes, time_decode, time_prefill
from models.role_cases import matrices, plan_impls
from models.plan import REFERENCE_IMPL, ModelError, NotHere, plan
from models.synthetic import config, random_weights
from oracle.dtypes import round_to

TOKENS = np.random.default_rng(1).integers(0, 256, 12)
MAX_LEN = 16


@pytest.fixture(scope="module")
def weights():
    return random_weights(config("tiny"), seed=0)


@pytest.fixture(scope="module")
def reference(weights):
    return Decoder(weights, "reference", "bf16", MAX_LEN).logits(TOKENS)


def log_softmax(z):
    return z - np.logaddexp.reduce(z, axis=-1, keepdims=True)


def kld(ref, got):
    """Per position KL(ref || got) of the softmaxes, float64."""
    lp, lq = log_softmax(ref), log_softmax(got)
    return (np.exp(lp) * (lp - lq)).sum(axis=-1)


# --- an independent Llama forward, with the ops' rounding points ----------------------------

def numpy_llama(weights, tokens, dtype):
    """Teacher-forced logits of `weights`, float64 NumPy, every op's output rounded to `dtype`
    (the loop's rounding points), written without kparity's oracles: int4 codes unpacked here,
    RMSNorm with eps read as f32, neox RoPE, GQA softmax attention, SwiGLU."""
    cfg = weights.config
    T = lambda x: round_to(x, dtype).astype(np.float64)  # noqa: E731

    def dense(m):
        nibbles = (m.codes[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 15
        q = nibbles.reshape(m.codes.shape[0], -1).astype(np.float64)
        return q * np.repeat(m.scales, m.group_size, -1) + np.repeat(m.biases, m.group_size, -1)

    eps = float(np.float32(cfg.rms_eps))

    def norm(x, w):
        return x / np.sqrt(np.mean(x * x) + eps) * T(w)

    hq, hkv, d = cfg.heads, cfg.kv_heads, cfg.head_dim
    inv = cfg.rope_theta ** (-np.arange(0, d, 2) / d)

    def rope(x, p):
        x1, x2 = x[:, :d // 2], x[:, d // 2:]
        c, s = np.cos(p * inv), np.sin(p * inv)
        return T(np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1))

    layers = [{k: dense(getattr(lw, k)) for k in ("q", "k", "v", "o", "gate", "up", "down")}
              for lw in weights.layers]
    emb, head = dense(weights.embedding), dense(weights.lm_head)
    keys = [np.zeros((len(tokens), hkv, d)) for _ in layers]
    values = [np.zeros((len(tokens), hkv, d)) for _ in layers]
    scale = float(np.float32(1 / np.sqrt(d)))
    out = []
    for p, tok in enumerate(tokens):
        r = T(emb[tok])
        y = None
        for l, (lw, W) in enumerate(zip(weights.layers, layers)):
            if y is not None:
                s = r + y
                r, x = T(s), T(norm(s, lw.attn_norm))
            else:
                x = T(norm(r, lw.attn_norm))
            q = rope(T(W["q"] @ x).reshape(hq, d), p)
            keys[l][p] = rope(T(W["k"] @ x).reshape(hkv, d), p)
            values[l][p] = T(W["v"] @ x).reshape(hkv, d)
            a = np.empty((hq, d))
            for h in range(hq):
                kv = h // (hq // hkv)
                z = keys[l][:p + 1, kv] @ q[h] * scale
                w = np.exp(z - z.max())
                a[h] = w @ values[l][:p + 1, kv] / w.sum()
            o = T(W["o"] @ T(a).reshape(-1))
            s = r + o
            r, x = T(s), T(norm(s, lw.ffn_norm))
            g, u = T(W["gate"] @ x), T(W["up"] @ x)
            y = T(W["down"] @ T(g / (1 + np.exp(-g)) * u))
        x = T(norm(r + y, weights.final_norm))
        out.append(T(head @ x))
    return np.stack(out)


def test_reference_plan_is_the_exact_composition(weights, reference):
    want = numpy_llama(weights, TOKENS, "bf16")
    assert np.max(np.abs(reference - want)) <= 1e-12 * np.max(np.abs(want))
    assert 1.0 < np.std(want) < 10.0  # O(1) logits: the synthetic scales keep them so


def test_a_prefill_pass_is_the_same_composition(weights, reference):
    """The first 5 tokens in one pass (qmm projections, sdpa_prefill_varlen, rows of norms),
    the rest decoded: the reference's logits are the token-by-token ones, bit for bit."""
    decoder = Decoder(weights, "reference", "bf16", MAX_LEN)
    assert np.array_equal(decoder.logits(TOKENS, prefill=5), reference)
    assert np.array_equal(decoder.logits(TOKENS, prefill=len(TOKENS)), reference)


# --- impl plans against the reference ------------------------------------------------------

# bf16's rounding noise in the logits alone (|Δ| ~ 2^-9 |logit|, logits of std ~3) is a KLD of
# ~1e-4; MLX's half-precision GEMV (mlx:quantized_matmul_half, rounding inside its product)
# adds ~10x that. A wrong kernel is orders of magnitude above either.
SMALL_KLD = {"torch": 1e-3, "mlx": 1e-2}


@pytest.mark.parametrize("name", ["torch", "mlx"])
def test_impl_plans_are_within_a_small_kld_of_the_reference(weights, reference, name):
    impl = gpu_impls.impls()[plan(name).candidates("silu_mul")[0]]
    ok, why = impl.available(gpu_impls.backend(impl.backend))
    if not ok:
        pytest.skip(why)
    decoder = Decoder(weights, name, "bf16", MAX_LEN)
    for prefill in (0, 5):
        got = decoder.logits(TOKENS, prefill=prefill)
        assert 0 < kld(reference, got).mean() < SMALL_KLD[name]
        assert (got.argmax(-1) == reference.argmax(-1)).mean() >= 0.9


def test_a_planted_wrong_gemv_moves_the_logits_by_orders_of_magnitude(weights, reference):
    gpu_impls.load_plugin("tests.mutants")
    base = kld(reference, Decoder(weights, "torch", "bf16", MAX_LEN).logits(TOKENS)).mean()
    wrong = plan("torch").swapped({"dequant_gemv": "torch:mutant_gemv_group_off_by_one"})
    moved = kld(reference, Decoder(weights, wrong, "bf16", MAX_LEN).logits(TOKENS)).mean()
    assert moved > 100 * base, (moved, base)


def test_an_exact_swap_leaves_the_logits_unchanged(weights, reference):
    """kv_cache_update is a copy: HF's index_copy_ for torch's own, and a torch impl inside the
    reference plan (values crossing NumPy <-> torch) give the same bits."""
    torch_logits = Decoder(weights, "torch", "bf16", MAX_LEN).logits(TOKENS)
    swapped = plan("torch").swapped({"kv_update": "torch:static_cache_index_copy"})
    assert np.array_equal(Decoder(weights, swapped, "bf16", MAX_LEN).logits(TOKENS),
                          torch_logits)
    mixed = plan("reference").swapped({"kv_cache_update": "torch:kv_cache_update"})
    decoder = Decoder(weights, mixed, "bf16", MAX_LEN)
    assert decoder.impls["kv_update"] == ["torch:kv_cache_update"]
    assert np.array_equal(decoder.logits(TOKENS), reference)
    assert np.array_equal(decoder.logits(TOKENS, prefill=5), reference)


# --- plans, swaps and refusals -------------------------------------------------------------

def test_swapped_pins_a_role_or_every_role_of_an_op():
    p = plan("cuda").swapped({"rms_norm": "torch:rms_norm", "lm_head": REFERENCE_IMPL})
    assert p.name == "cuda+rms_norm=torch:rms_norm+lm_head=numpy:oracle"
    assert p.candidates("attn_norm") == ("torch:rms_norm",)
    assert p.candidates("lm_head") == (REFERENCE_IMPL,)
    assert p.candidates("q_proj") == plan("cuda").candidates("q_proj")
    every = plan("torch").swapped({"add_rms_norm": "mlx:add_rms_norm"})
    assert {every.candidates(r) for r in ("attn_add_norm", "ffn_add_norm", "final_add_norm")} \
        == {("mlx:add_rms_norm",)}


@pytest.mark.parametrize("swap, message", [
    ({"rms_nrom": "torch:rms_norm"}, r"swap 'rms_nrom': not a role or an op .* \(closest "
                                     r"first\): rms_norm"),
    ({"rms_norm": "torch:rms_nrom"}, r"unknown impl; the impls of rms_norm \(closest first\): "
                                     r"torch:rms_norm"),
    ({"q_proj": "torch:rms_norm"}, r"implements rms_norm, the role runs dequant_gemv"),
])
def test_a_bad_swap_names_what_is_valid(swap, message):
    with pytest.raises(ModelError, match=message):
        plan("torch").swapped(swap)


def test_an_unknown_plan_names_the_plans():
    with pytest.raises(ModelError, match=r"unknown plan 'torhc'; plans \(closest first\): "
                                         r"torch"):
        plan("torhc")


def test_torch_sdpa_runs_its_rounding_convention(weights):
    """torch:sdpa's contract is probs='T': the role runs with it; the reference keeps f32."""
    assert Decoder(weights, "torch", "bf16", MAX_LEN).adapted == {"attention": {"probs": "T"}}


def test_a_dtype_that_would_round_the_scales_is_refused(weights):
    """f16 scales that bf16 cannot hold (a Q4_1 GGUF's): T = bf16 would change the model."""
    layer = weights.layers[0]
    scales = layer.q.scales.copy()
    scales[0, 0] = 1.0 + 2.0 ** -10  # an f16 value, not a bf16 one
    bad = dataclasses.replace(weights, layers=(dataclasses.replace(
        layer, q=dataclasses.replace(layer.q, scales=scales)), *weights.layers[1:]))
    with pytest.raises(ModelError, match=r"dtype bf16: L0.q's scales \(stored as f16\) .* use "
                                         r"dtype f16"):
        Decoder(bad, "reference", "bf16", MAX_LEN)
    Decoder(bad, "reference", "f16", MAX_LEN)  # exact there
    with pytest.raises(ModelError, match=r"dtype 'f8'"):
        Decoder(weights, "reference", "f8", MAX_LEN)


@pytest.mark.parametrize("tokens, prefill, message", [
    ([3, 256], 0, r"ids must lie in \[0, vocab=256\); got min 3, max 256"),
    (list(range(MAX_LEN + 1)), 0, r"17 tokens do not fit the KV cache of max_len=16"),
    ([1, 2], 3, r"prefill=3: the prompt is a prefix of the 2 tokens"),
])
def test_bad_tokens_are_refused(weights, tokens, prefill, message):
    with pytest.raises(ModelError, match=message):
        Decoder(weights, "reference", "bf16", MAX_LEN).logits(tokens, prefill)


@pytest.mark.parametrize("model, gemv", [("smollm2-135m", "cuda:kp_qgemv"),
                                         ("llama3-8b", "cuda:kp_qgemv_mma")])
def test_the_cuda_plan_runs_kparitys_kernels_at_the_models_shapes(model, gemv):
    """Resolved from the contracts alone (no GPU needed): every role but the embedding gather
    runs a CUDA kernel; SmolLM2's hidden 576 is no multiple of 128, so its GEMVs reading it
    fall back from kp_qgemv_mma to kp_qgemv."""
    impls = plan_impls("cuda", config(model), "bf16", 1024, here=False)
    assert impls.pop("embed") == ["torch:quant_embedding"]
    assert all(len(ids) == 1 and ids[0].startswith("cuda:") for ids in impls.values()), impls
    assert impls["q_proj"] == [gemv] and impls["down_proj"] == ["cuda:kp_qgemv_mma"]
    assert impls["attention"] == ["cuda:kp_sdpa_decode"]


def test_the_cuda_plans_prefill_runs_kp_qmm_up_to_32_rows():
    """cuda:kp_qmm takes m <= 32 rows, any K (SmolLM2's hidden 576 too): Llama-3-8B's and
    SmolLM2's 32-token prompts run it, a 512-token prompt falls back to torch."""
    cfg = config("llama3-8b")
    assert plan_impls("cuda", cfg, "bf16", 1024, False, prefill=32)["q_proj"] == ["cuda:kp_qmm"]
    long = plan_impls("cuda", cfg, "bf16", 1024, False, prefill=512)
    assert long["q_proj"] == ["torch:qmm_dequant_linear"]
    assert long["attention"] == ["torch:sdpa_varlen"] and long["rope"] == ["cuda:kp_rope"]
    smol = plan_impls("cuda", config("smollm2-135m"), "bf16", 1024, False, prefill=32)
    assert smol["q_proj"] == ["cuda:kp_qmm"]
    batch = plan_impls("cuda", config("smollm2-135m"), "f16", 1024, False, batch=8)
    assert batch["q_proj"] == batch["down_proj"] == batch["lm_head"] == ["cuda:kp_qmm"]


def test_a_plan_never_falls_back_to_another_backend_silently(weights):
    ok, why = gpu_impls.backend("cuda").available()
    if ok:
        pytest.skip("CUDA is here")
    with pytest.raises(NotHere, match=r"cuda:kp_rms_norm is not available here"):
        Decoder(weights, "cuda", "bf16", MAX_LEN)


@pytest.mark.parametrize("prefill, steps", [(0, 4), (3, 1)])
def test_time_decode_times_the_steps_after_the_warmup(weights, prefill, steps):
    timing = time_decode(Decoder(weights, "torch", "bf16", MAX_LEN), TOKENS[:6], warmup=2,
                         prefill=prefill)
    assert timing.steps == len(timing.samples_ms) == steps and timing.plan == "torch"
    assert 0 < timing.p10_ms <= timing.ms_per_token <= timing.p90_ms
    assert timing.tokens_per_s == pytest.approx(1e3 / timing.ms_per_token)
    with pytest.raises(ModelError, match=r"6 tokens, 4 of them prefilled, leave no step after "
                                         r"2 warm-up steps"):
        time_decode(Decoder(weights, "torch", "bf16", MAX_LEN), TOKENS[:6], 2, prefill=4)


def test_time_prefill_times_the_whole_prompt(weights):
    timing = time_prefill(Decoder(weights, "torch", "bf16", MAX_LEN), TOKENS[:8], repeats=2)
    assert timing.tokens == 8 and len(timing.samples_ms) == timing.repeats == 2
    assert 0 < timing.min_ms <= timing.ms <= timing.max_ms
    assert timing.tokens_per_s == pytest.approx(8e3 / timing.ms)


def test_step_bytes_reads_every_weight_once_and_the_keys_the_step_attends(weights):
    """The roofline's numerator: the codes and the T scales and biases of every matrix (the
    embedding: one row), plus activations (a tenth more at this tiny hidden size); the keys
    the step attends, not the cache's capacity: 2 (k and v) x layers x kv_heads x head_dim x 2
    bytes per key."""
    cfg, decoder = weights.config, Decoder(weights, "torch", "bf16", MAX_LEN)
    table = {k: m for k, m in matrices(weights).items() if k != "embedding"}
    weight_bytes = sum(m.codes.nbytes + 2 * 2 * m.scales.size for m in table.values())
    assert weight_bytes < step_bytes(decoder, 0) < 1.25 * weight_bytes
    per_key = 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * 2
    assert step_bytes(decoder, 9) - step_bytes(decoder, 2) == 7 * per_key


# --- a decode step over a batch of sequences ----------------------------------------------------

def test_a_batched_step_is_each_sequence_on_its_own(weights, reference):
    """Batch 3 (each projection a qmm over 3 rows, rope/kv_update/attention over 3 sequences
    at one position, caches [3, Hkv, max_len, D]): the reference plan's logits of each sequence
    are its batch-1 logits bit for bit (the oracles are per row, per sequence); the torch plan's
    batched logits are as close to the reference as its batch-1 logits (`SMALL_KLD`, bf16)."""
    other = np.random.default_rng(7).integers(0, 256, TOKENS.size)
    ids = np.stack([TOKENS, other, TOKENS[::-1]])
    dec = Decoder(weights, "reference", "bf16", MAX_LEN, batch=3)
    got = dec.logits(ids)
    assert got.shape == (3, TOKENS.size, 256)
    np.testing.assert_array_equal(got[0], reference)
    np.testing.assert_array_equal(
        got[1], Decoder(weights, "reference", "bf16", MAX_LEN).logits(other))
    torch_dec = Decoder(weights, "torch", "bf16", MAX_LEN, batch=3)
    assert torch_dec.impls["q_proj"] == ["torch:qmm_dequant_linear"]
    assert 0 < kld(got, torch_dec.logits(ids)).mean() < SMALL_KLD["torch"]
    timing = time_decode(torch_dec, ids, warmup=2)
    assert timing.batch == 3 and timing.tokens_per_s == pytest.approx(3e3 / timing.ms_per_token)


def test_a_batch_refuses_a_prefill_and_the_wrong_shape(weights):
    dec = Decoder(weights, "reference", "bf16", MAX_LEN, batch=2)
    with pytest.raises(ModelError, match=r"\[batch=2, T\]"):
        dec.load(TOKENS)
    with pytest.raises(ModelError, match="prefill=2"):
        dec.load(np.stack([TOKENS, TOKENS]), prefill=2)
    with pytest.raises(ModelError, match="batch=0"):
        Decoder(weights, "reference", "bf16", MAX_LEN, batch=0)


def test_decode_timing_deciles_lie_within_the_samples():
    """Four noisy steps (a CI run's): the default quantile method put the 10th percentile at
    -1.14 ms; the deciles are the samples' own, inclusive."""
    from models.decode_speed import decode_timing

    samples = [1.7728859966155142, 38.35182899638312, 48.16330800531432, 7.592374000523705]
    t = decode_timing("torch", "cpu", "bf16", samples, warmup=2)
    assert min(samples) <= t.p10_ms <= t.ms_per_token <= t.p90_ms <= max(samples)
    assert t.tokens_per_s == pytest.approx(1e3 / t.ms_per_token) and t.batch == 1
    assert decode_timing("x", "cpu", "bf16", [2.0], 0, batch=8).tokens_per_s == 4e3
