"""One table of model configs: every family's presets and the model runner read their shapes here.

Values from the models' public `config.json` and, where they state a shape, the metaltile/FFAI
seed repos: `docs/model_shapes.md` gives each value's source. A family's presets pick models by
name and take the fields they need (`config("qwen3-8b").intermediate`), so a shape is written once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class ModelConfig:
    """The shapes and constants of one model that kernels see."""

    name: str
    hidden: int
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    intermediate: int | None = None      # dense MLP (or the shared expert's)
    vocab: int | None = None
    experts: int | None = None
    top_k: int | None = None
    moe_intermediate: int | None = None
    rope_theta: float | None = None
    rope_scaling: Mapping[str, float] = field(default_factory=dict)
    rope_type: str = "none"              # frequency scaling: "none", "llama3" or "yarn"
    partial_rotary: float = 1.0          # the share of head_dim that RoPE rotates
    ssm: Mapping[str, int] = field(default_factory=dict)  # Mamba-2 / GDN dims
    eps: float = 1e-6                    # RMSNorm eps
    weight_offset: int = 0               # Gemma's (1 + w) norm weight


MODELS = {c.name: c for c in (
    ModelConfig("smollm2-135m", 576, 9, 3, 64, 1536, 49152, eps=1e-5),
    ModelConfig("qwen2.5-0.5b", 896, 14, 2, 64, 4864, 151936),
    ModelConfig("qwen2.5-32b", 5120, 40, 8, 128, 27648, 152064, rope_theta=1e6),
    ModelConfig("qwen3-0.6b", 1024, 16, 8, 128, 3072, 151936, rope_theta=1e6),
    ModelConfig("qwen3-1.7b", 2048, 16, 8, 128, 6144, 151936, rope_theta=1e6),
    ModelConfig("qwen3-4b", 2560, 32, 8, 128, 9728, 151936, rope_theta=1e6),
    ModelConfig("qwen3-8b", 4096, 32, 8, 128, 12288, 151936, rope_theta=1e6),
    ModelConfig("qwen3-14b", 5120, 40, 8, 128, 17408, 151936, rope_theta=1e6),
    ModelConfig("qwen3-30b-a3b", 2048, 32, 4, 128, None, 151936, experts=128, top_k=8,
                moe_intermediate=768, rope_theta=1e6),
    ModelConfig("qwen3-next-80b-a3b", 2048, 16, 2, 256, 5120, 151936, experts=512, top_k=10,
                moe_intermediate=512, rope_theta=1e7, partial_rotary=0.25,
                ssm={"linear_key_heads": 16, "linear_value_heads": 32, "linear_key_dim": 128,
                     "linear_value_dim": 128, "conv_kernel": 4}),
    ModelConfig("llama-3.1-8b", 4096, 32, 8, 128, 14336, 128256, rope_theta=500000.0,
                rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}, rope_type="llama3",
                eps=1e-5),
    ModelConfig("llama-3.2-1b", 2048, 32, 8, 64, 8192, 128256, rope_theta=500000.0,
                rope_scaling={"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}, rope_type="llama3",
                eps=1e-5),
    ModelConfig("llama-3.2-3b", 3072, 24, 8, 128, 8192, 128256, eps=1e-5),
    ModelConfig("llama-3-70b", 8192, 64, 8, 128, 28672, 128256, eps=1e-5),
    ModelConfig("gemma-3-1b", 1152, 4, 1, 256, 6912, 262144, rope_theta=1e6, weight_offset=1),
    ModelConfig("gemma-4-31b", 5376, head_dim=256, weight_offset=1),
    ModelConfig("gpt-oss-20b", 2880, 64, 8, 64, 2880, 201088, experts=32, top_k=4,
                rope_theta=150000.0, rope_type="yarn",
                rope_scaling={"factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                              "original_max_position_embeddings": 4096, "truncate": 0}),
    ModelConfig("nemotron-3-nano-30b-a3b", 2688, 32, 2, 128, 3712, experts=128, top_k=6,
                moe_intermediate=1856,
                ssm={"inner": 4096, "state": 128, "groups": 8, "conv_kernel": 4,
                     "time_step_rank": 64}),
)}


def config(name: str) -> ModelConfig:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
