"""A Llama-architecture model's weights in the layouts kparity's ops take: the shared interface
between the model file readers (`models/gguf_file.py`), the synthetic random-weight models and
the decode loop (`models/decode.py`).

Every projection is a `QuantMatrix` in MLX's affine layout (`oracle/quant.py`, the layout
`dequant_gemv` and `qmm` take): codes packed LSB-first into uint32 words [out, in * bits / 32],
scales and biases [out, in / group_size] held as float64 values of `scale_dtype` (f16 for a Q4_1
GGUF: its d and m are f16, so the conversion is exact; the decode loop stores them in the case
dtype T and refuses a T that would round them). The embedding is a QuantMatrix too (rows =
vocab, gathered per token; 8-bit for a GGUF's Q8_0 embedding); a tied lm_head is the same object.
Norm weights are float64 values of their file dtype (f32 in a GGUF). Q and K rows are in the
Hugging Face order: rope pairs (x_i, x_{i + head_dim/2}), pairing "neox" (`source["rope_pairing"]`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from oracle.quant import dequantize


@dataclass(frozen=True)
class LlamaConfig:
    """The architecture numbers (read from the model file, never assumed)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float
    rms_eps: float
    tied_embeddings: bool
    bits: int = 4
    group_size: int = 32
    name: str = ""


@dataclass(frozen=True)
class QuantMatrix:
    """W [out, in] as codes (uint32 [out, in*bits/32]), scales and biases (float64 [out,
    in/group_size], values of `scale_dtype`)."""

    codes: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int
    group_size: int
    scale_dtype: str = "f16"

    @property
    def shape(self) -> tuple[int, int]:
        return self.scales.shape[0], self.scales.shape[1] * self.group_size

    def dequantized(self) -> np.ndarray:
        """s * q + b, float64 [out, in] (exact)."""
        return dequantize(self.codes, self.scales, self.biases, self.bits, self.group_size)

    def rows(self, index) -> "QuantMatrix":
        """The rows `index` (an embedding gather)."""
        return QuantMatrix(self.codes[index], self.scales[index], self.biases[index], self.bits,
                           self.group_size, self.scale_dtype)


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: np.ndarray      # [hidden]
    q: QuantMatrix             # [heads * head_dim, hidden]
    k: QuantMatrix             # [kv_heads * head_dim, hidden]
    v: QuantMatrix             # [kv_heads * head_dim, hidden]
    o: QuantMatrix             # [hidden, heads * head_dim]
    ffn_norm: np.ndarray       # [hidden]
    gate: QuantMatrix          # [intermediate, hidden]
    up: QuantMatrix            # [intermediate, hidden]
    down: QuantMatrix          # [hidden, intermediate]


@dataclass(frozen=True)
class Weights:
    config: LlamaConfig
    embedding: QuantMatrix     # [vocab, hidden]
    layers: tuple[LayerWeights, ...]
    final_norm: np.ndarray     # [hidden]
    lm_head: QuantMatrix       # [vocab, hidden]; `embedding` itself when tied
    source: dict = field(default_factory=dict)  # where it came from (file, sha256, ...)
