"""Synthetic Llama models: random int4 weights of a real model's shape, for the decode loop's
tests (`tiny`) and its speed target (`llama3-8b`: the roofline needs the shape, not the weights).

`random_weights(config, seed)` draws every projection as MLX affine int4 (`oracle/quant.py`):
codes uniform in [0, 15] (uniform uint32 words), per group a scale s and a bias b that centre
the codes, w = s·q + b with b ≈ -7.5 s, so each weight is ~uniform on ±7.5 s (std ≈ 4.6 s).
Scales follow the fan-in n so that activations stay O(1) through the layers:

    q, k, v, gate, up    s ≈ 1 / (4.6 √n)               a normed input (RMS 1) gives outputs
                                                        of RMS ~1
    o, down              s ≈ 1 / (4.6 √n √(2 L))        each of the 2 L residual writes adds
                                                        ~1/(2 L): the stream stays RMS ~1
    lm_head              s ≈ 3 / (4.6 √hidden)          logits of std ~3: a softmax that is
                                                        neither one-hot nor flat
    embedding (untied)   s ≈ 1 / 4.6                    rows of RMS ~1

each times a per-group log-normal factor (`GROUP_SPREAD`: a kernel that takes a neighbouring
group's scale is visibly wrong, as it would be on a real checkpoint). Scales and biases are
values exact in both f16 and bf16 (`both_exact`), so one synthetic model runs at either T;
norm weights are 1 + N(0, 0.05²).
"""

from __future__ import annotations

import numpy as np

from models.weights import LayerWeights, LlamaConfig, QuantMatrix, Weights
from oracle.dtypes import round_to

CONFIGS = {c.name: c for c in (
    # the tests' model: every op at a few microseconds, two layers so a layer boundary exists
    LlamaConfig(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                vocab=256, rope_theta=10000.0, rms_eps=1e-5, tied_embeddings=False,
                bits=4, group_size=32, name="tiny"),
    # SmolLM2-135M's shape (issue 28's model; its Q4_1 GGUF is group 32, tied embeddings)
    LlamaConfig(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536,
                vocab=49152, rope_theta=100000.0, rms_eps=1e-5, tied_embeddings=True,
                bits=4, group_size=32, name="smollm2-135m"),
    # Llama-3-8B's shape at int4 g64 (the roofline speed target; ~4.5 GB of codes and scales:
    # never built in CPU tests)
    LlamaConfig(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
                vocab=128256, rope_theta=500000.0, rms_eps=1e-5, tied_embeddings=False,
                bits=4, group_size=64, name="llama3-8b"),
)}

CODE_STD = 4.6  # std of q - 7.5 for q uniform on 0..15: sqrt((16^2 - 1) / 12)
# Per-group scales spread log-normally (sigma 0.5: neighbouring groups differ by ~1.6x, as a
# trained checkpoint's do across channels), divided by exp(sigma^2) so E[s^2] keeps the target.
GROUP_SPREAD = 0.5


def config(name: str) -> LlamaConfig:
    """The synthetic config `name` (`CONFIGS`)."""
    if name not in CONFIGS:
        from cases.casefile import closest

        raise ValueError(f"unknown synthetic model {name!r}; known (closest first): "
                         f"{closest(name, CONFIGS)}")
    return CONFIGS[name]


def both_exact(values: np.ndarray) -> np.ndarray:
    """`values` rounded to numbers exact in bf16 and in f16 (float64): bf16 first (8 significant
    bits), then f16, which keeps a bf16 value in its normal range and rounds one below 2^-14 to
    a coarser grid (fewer bits still: exact in bf16 too)."""
    return round_to(round_to(values, "bf16").astype(np.float64), "f16").astype(np.float64)


def random_matrix(rng: np.random.Generator, out: int, n: int, scale: float, cfg: LlamaConfig
                  ) -> QuantMatrix:
    """W [out, n] as int4 codes with per-group scale ~`scale` (module docstring)."""
    if cfg.bits != 4:
        raise ValueError(f"random_matrix: synthetic weights are int4; config {cfg.name} has "
                         f"bits={cfg.bits}")
    groups = n // cfg.group_size
    codes = rng.integers(0, 1 << 32, (out, n * cfg.bits // 32), dtype=np.uint32)
    spread = np.exp(GROUP_SPREAD * rng.standard_normal((out, groups)) - GROUP_SPREAD ** 2)
    s = both_exact(scale * spread)
    b = both_exact(-s * (7.5 + 0.5 * rng.standard_normal((out, groups))))
    return QuantMatrix(codes, s, b, cfg.bits, cfg.group_size, scale_dtype="f16")


def _norm(rng: np.random.Generator, n: int) -> np.ndarray:
    return both_exact(1.0 + 0.05 * rng.standard_normal(n))


def random_weights(cfg: LlamaConfig, seed: int = 0) -> Weights:
    """A Llama of shape `cfg` with random int4 weights (module docstring), deterministic in
    `seed`."""
    rng = np.random.default_rng(seed)
    h, qd, kvd, inter = cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, \
        cfg.intermediate
    fan = lambda n: 1.0 / (CODE_STD * np.sqrt(n))  # noqa: E731
    residual = 1.0 / np.sqrt(2 * cfg.layers)
    layers = tuple(LayerWeights(
        attn_norm=_norm(rng, h),
        q=random_matrix(rng, qd, h, fan(h), cfg),
        k=random_matrix(rng, kvd, h, fan(h), cfg),
        v=random_matrix(rng, kvd, h, fan(h), cfg),
        o=random_matrix(rng, h, qd, fan(qd) * residual, cfg),
        ffn_norm=_norm(rng, h),
        gate=random_matrix(rng, inter, h, fan(h), cfg),
        up=random_matrix(rng, inter, h, fan(h), cfg),
        down=random_matrix(rng, h, inter, fan(inter) * residual, cfg),
    ) for _ in range(cfg.layers))
    lm_head = random_matrix(rng, cfg.vocab, h, 3.0 * fan(h), cfg)
    embedding = lm_head if cfg.tied_embeddings else \
        random_matrix(rng, cfg.vocab, h, 1.0 / CODE_STD, cfg)
    return Weights(cfg, embedding, layers, _norm(rng, h), lm_head,
                   source={"kind": "synthetic", "config": cfg.name, "seed": seed})
