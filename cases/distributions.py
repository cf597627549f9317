"""Named value distributions. Adversarial where it matters; never zeros alone.

A distribution fills a tensor viewed as rows (last axis = the reduction axis of row ops):

| name            | what it stresses                                                          |
|-----------------|---------------------------------------------------------------------------|
| `normal`        | N(0, 1): the common case                                                   |
| `outlier_rows`  | N(0, 1) with one element per row 1000x larger: reductions dominated by one |
|                 | term, outputs up to ~sqrt(n) in magnitude                                  |
| `f16_overflow`  | |x| in [250, 350] (random signs): x^2 overflows f16 (max 65504), so a kernel |
|                 | that squares in f16 returns inf                                            |
| `tiny`          | N(0, 1) x 4 x the dtype's smallest normal: subnormals, x^2 underflows, the  |
|                 | eps term decides the result                                                |
| `zero_rows`     | N(0, 1) with every third row all zero (row 0 included): out must be 0      |
| `constant_rows` | each row one constant c_r ~ N(0, 1): closed form c*rsqrt(c^2+eps)*w         |
| `nonfinite`     | N(0, 1) with one NaN in rows 0, 4, 8..., one +inf in rows 1, 5..., one -inf |
|                 | in rows 2, 6...; rows 3, 7... clean. The oracle's IEEE float64 propagation |
|                 | is the contract (each op's docstring states what it implies)               |
| `f32_overflow`  | N(0, 1) x 1e20 (f32/bf16 only): x^2 leaves f32's range; only for ops whose   |
|                 | cases ask (the op states its verdict there: rms_norm's [0, y])             |
| `near_tie`      | N(0, 1) data; an op with logits plants two top logits within one output ULP |
|                 | (`OpSpec.plant`): an argmax flip there is a near-tie, not a failure        |
| `clear_margin`  | N(0, 1) data; the op plants a top logit far above the rest: no flip allowed |
| `quantized`     | N(0, 1) data; the op quantizes a drawn W (outlier columns) as a checkpoint |
|                 | would: level-2 loss against the unquantized W is reported (`OpSpec.loss`)   |
| `equal_keys`    | N(0, 1) data; an attention op makes every attended key of a sequence one    |
|                 | vector: all scores tie, the weights are uniform                           |
| `hot_expert`    | N(0, 1) data; a MoE routing op sends every token to one expert (skew)      |
| `exact_ties`    | N(0, 1) data; a router's k-th best logit copied into the next ones: ties   |

`values(dist, shape, dtype, rng)` draws one tensor from a distribution; the inits that take the
case's distribution ("data", "activation", and any registered with `adversarial=True`) call it.
The other inits (weights, gates, quantized GEMV codes and scales, ...) are in `cases/inits.py`.
"""

from __future__ import annotations

import numpy as np

from oracle.dtypes import is_float, tiny

DISTRIBUTIONS = ("normal", "outlier_rows", "f16_overflow", "tiny", "zero_rows", "constant_rows",
                 "nonfinite")
NONFINITE_CYCLE = (np.nan, np.inf, -np.inf, None)  # row r gets NONFINITE_CYCLE[r % 4]
# normal data; the op's `plant` does the rest (hot_expert, exact_ties: oracle/moe_route.py;
# e2m1_ties, scale_edges, one_outlier: oracle/fp4.py)
PLANTED = ("near_tie", "clear_margin", "quantized", "equal_keys", "hot_expert", "exact_ties",
           "e2m1_ties", "scale_edges", "one_outlier")
# Past an op's f32 domain, generated only where the op's cases ask for it (the op's docstring
# states its verdict there): `f32_overflow` is N(0, 1) * 1e20, whose squares leave f32's range.
DOMAIN = ("f32_overflow",)


def _rows(shape: tuple[int, ...]) -> tuple[int, int]:
    n = shape[-1] if shape else 1
    return int(np.prod(shape, dtype=np.int64)) // max(n, 1), n


def values(dist: str, shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """float64 values of distribution `dist` for one tensor (the caller rounds them to `dtype`).
    The planted distributions draw `normal` (the op's `plant` adds the structure)."""
    if dist in PLANTED:
        dist = "normal"
    if dist not in DISTRIBUTIONS + DOMAIN:
        raise ValueError(f"unknown distribution {dist!r}; valid: "
                         f"{', '.join(DISTRIBUTIONS + PLANTED + DOMAIN)}")

    rows, n = _rows(shape)
    x = rng.standard_normal((rows, n))
    if dist == "outlier_rows":
        x[np.arange(rows), rng.integers(0, n, rows)] *= 1000.0
    elif dist == "f32_overflow":
        x *= 1e20
    elif dist == "f16_overflow":
        x = rng.uniform(250.0, 350.0, (rows, n)) * rng.choice([-1.0, 1.0], (rows, n))
    elif dist == "tiny":  # an integer tensor taking data gets f32's scale
        x *= 4.0 * tiny(dtype if is_float(dtype) else "f32")
    elif dist == "zero_rows":
        x[::3] = 0.0
    elif dist == "constant_rows":
        x = np.repeat(rng.standard_normal((rows, 1)), n, axis=1)
    elif dist == "nonfinite" and n > 0:
        cols = rng.integers(0, n, rows)
        for r in range(rows):
            if NONFINITE_CYCLE[r % 4] is not None:
                x[r, cols[r]] = NONFINITE_CYCLE[r % 4]
    return x.reshape(shape)
