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

# The expert-indexed GEMV reads its expert from a device buffer: a kernel does not check it (an
# index past the stack reads other memory), so the wrapper does, from the case's `expert`.
EXPERT_IN_RANGE = Invariant(
    "expert < experts", lambda ns: 0 <= ns["expert"] < ns["experts"],
    "the kernel offsets the stacked weights by expert * out rows without a bounds check: an "
    "index past the stack reads whatever memory follows",
    lambda ns: f"expert in 0..{ns['experts'] - 1}", {"expert": 1000}, ("expert", "experts"))


def expert_slabs(case, inputs: dict) -> list[tuple[str, object, dict, object, dict]]:
    """`ExactPeer.split` of an expert-indexed GEMV: for every expert e of one stacked set, (the
    indexed case and inputs selecting e, the plain dequant_gemv case and inputs of slab e)."""
    import numpy as np

    from cases.model import Case
    from oracle.gemv import expert_slab

    plain = Case.make("dequant_gemv", {k: v for k, v in case.dims.items() if k != "experts"},
                      case.dtype, case.dist, case.seed, label=case.label)
    out = []
    for e in range(case.dims["experts"]):
        own = {**inputs, "expert_index": np.full_like(inputs["expert_index"], e)}
        out.append((f"expert {e}", case.replace(expert=e), own, plain, expert_slab(own)))
    return out

# The same layout for a table gathered by rows (`quant_embedding`): rows of `hidden` codes.
ROW_LAYOUT = (
    *LAYOUT[:2],
    Invariant("hidden % group_size == 0", lambda ns: ns["hidden"] % ns["group_size"] == 0,
              "a row must be whole groups: the last partial group has no scale and bias",
              lambda ns: f"hidden = {nearest_multiples(ns['hidden'], ns['group_size'])}",
              {"hidden": 520}, ("hidden", "group_size")),
)
