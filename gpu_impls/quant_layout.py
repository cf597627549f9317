"""Contract invariants every impl of a quantized op shares: the MLX affine layout itself."""

from __future__ import annotations

from gpu_impls.contract import Invariant, nearest_multiples
from oracle.quant import BITS, GROUP_SIZES

LAYOUT = (
    Invariant("bits in (2, 3, 4, 5, 6, 8)", lambda ns: ns["bits"] in BITS,
              "MLX affine quantization packs only these code widths",
              lambda ns: "bits = 4 (or 2, 3, 5, 6, 8)", {"bits": 7}, ("bits",)),
    Invariant("group_size in (32, 64, 128)", lambda ns: ns["group_size"] in GROUP_SIZES,
              "scales and biases exist per group of 32, 64 or 128 codes only",
              lambda ns: "group_size = 64 (or 32, 128)", {"group_size": 48}, ("group_size",)),
    Invariant("in % group_size == 0", lambda ns: ns["in"] % ns["group_size"] == 0,
              "a row must be whole groups: the last partial group has no scale and bias",
              lambda ns: f"in = {nearest_multiples(ns['in'], ns['group_size'])}",
              {"in": 520}, ("in", "group_size")),
)
