"""Quantized embedding gather, `quant_embedding`: the token embedding of a quantized model (a
GGUF's Q4_1 `token_embd`, MLX's quantized `embed_tokens`), each token's row dequantized.

    w [vocab, hidden * bits / 32] u32      codes in MLX's affine layout (`oracle/quant.py`)
    scales, biases [vocab, hidden / G] T   one pair per group of G codes along hidden
    ids [tokens] i32                       the token ids, each in [0, vocab)

    out[t, d] = q[ids[t], d] · s[ids[t], g(d)] + b[ids[t], g(d)]          g(d) = d // G

in float64 from the stored codes, scales and biases; one rounding to T at the store (the
decode loop's first op, `models/decode.py`: the residual stream starts in T).

Kernel model (`embedding_kernel`, `oracle/numerics.py`): q · s (one f32 rounding), + b (one),
the store. An FMA (one rounding) is inside that bound. With s a T value of f16/bf16 and q below
2^8, q · s is exact in f32; the charge is an upper bound there, and binds for f32 scales.

An id outside [0, vocab) is outside the contract: the impls index with it (torch raises, a
kernel reads another row), and the oracle raises.
"""

from __future__ import annotations

import numpy as np

from oracle.builders import kernel_view
from oracle.quant import unpack
from oracle.spec import OpSpec, TensorSpec, register


def _ids(inputs: dict, case) -> np.ndarray:
    ids = np.asarray(inputs["ids"]).astype(np.int64)
    vocab = case.dims["vocab"]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"quant_embedding: ids {ids.tolist()} outside [0, vocab={vocab})")
    return ids


def gathered(inputs: dict, case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, s, b) of the tokens' rows, float64 [tokens, hidden] each (s and b repeated over
    their group), as the kernel reads them (`kernel_view`: FTZ where the case says)."""
    ids = _ids(inputs, case)
    bits, group = case.dims["bits"], case.dims["group_size"]
    q = unpack(np.asarray(inputs["w"])[ids], bits, case.dims["hidden"]).astype(np.float64)
    v = kernel_view({"scales": np.asarray(inputs["scales"])[ids],
                     "biases": np.asarray(inputs["biases"])[ids]}, case)
    return q, np.repeat(v["scales"], group, axis=-1), np.repeat(v["biases"], group, axis=-1)


def quant_embedding(inputs: dict, case) -> dict:
    q, s, b = gathered(inputs, case)
    return {"out": q * s + b}


def embedding_kernel(A, inputs: dict, case) -> dict:
    q, s, b = gathered(inputs, case)
    return {"out": A.load(q) * A.load(s) + A.load(b)}


W_ROWS = lambda d: (d["vocab"], d["hidden"] * d["bits"] // 32)  # noqa: E731
GROUP_ROWS = lambda d: (d["vocab"], d["hidden"] // d["group_size"])  # noqa: E731


def _bytes(case) -> int:
    """The gathered rows read (codes, scales, biases), the ids, the output written: a gather
    reads `tokens` rows, not the table."""
    d, t = case.dims, case.dims["tokens"]
    item = 4 if case.dtype == "f32" else 2
    row = d["hidden"] * d["bits"] // 8 + 2 * item * d["hidden"] // d["group_size"]
    return t * (row + 4 + item * d["hidden"])


register(OpSpec(
    name="quant_embedding", family="embedding",
    dims=("tokens", "vocab", "hidden", "bits", "group_size"),
    inputs=(TensorSpec("w", W_ROWS, role="u32", init="codes"),
            TensorSpec("scales", GROUP_ROWS, init="qscale"),
            TensorSpec("biases", GROUP_ROWS, init="qbias"),
            TensorSpec("ids", lambda d: (d["tokens"],), role="i32", init="token_ids",
                       adversarial=False)),
    outputs=(TensorSpec("out", lambda d: (d["tokens"], d["hidden"])),),
    oracle=quant_embedding, tolerance=None, kernel=embedding_kernel, bytes=_bytes,
    flops=lambda case: 2 * case.dims["tokens"] * case.dims["hidden"],
    params={"ftz": 0}, doc=__doc__, chain_input="ids"))
