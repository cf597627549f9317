"""`softcap` cases at Gemma 2's two uses: the final logits of one decode token (n = the
vocabulary, 256000; cap 30) and one layer's attention scores (8 heads' rows over 4096 keys; cap
50), every dtype and distribution; block edges; inputs spread over the cap (`capped`), so that
tanh's linear part, its bend and its saturation all occur."""

from __future__ import annotations

from itertools import product

from cases.distributions import DISTRIBUTIONS
from cases.distributions import values as distribution_values
from cases.inits import init
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES

# Gemma 2 (2B, 9B, 27B): vocabulary 256000, final_logit_softcapping 30.0,
# attn_logit_softcapping 50.0 (the models' config.json)
USES = {"logits": ({"rows": 1, "n": 256000}, 30.0), "attention": ({"rows": 8, "n": 4096}, 50.0)}
EDGE_N = (1, 31, 32, 33, 255, 256, 257)  # within +-1 of a warp and a 256-thread block


@init("capped", adversarial=True)
def capped(shape, dtype, rng, case, drawn, dist):
    """The case's distribution times cap: x / cap follows it, about 5 % of normal values past
    the bend of tanh at |x / cap| = 2."""
    return distribution_values(dist, shape, dtype, rng) * case.params["cap"]


@gate_cases("softcap")
def softcap_cases() -> list[Case]:
    uses = [Case.make("softcap", dims, dtype, dist, params={"cap": cap},
                      label=f"preset:gemma-2-{use}")
            for (use, (dims, cap)), dtype, dist in product(USES.items(), FLOAT_DTYPES,
                                                           DISTRIBUTIONS)]
    edges = [Case.make("softcap", {"rows": 2, "n": n}, dtype, label="edge")
             for n, dtype in product(EDGE_N, FLOAT_DTYPES)]
    return uses + edges


@bench_cases("softcap")
def softcap_bench() -> list[Case]:
    """The final logits of a 32-token decode batch, and one prefill chunk's attention scores."""
    return [Case.make("softcap", {"rows": rows, "n": n}, dtype, params={"cap": cap},
                      label=f"bench:gemma-2-{use}")
            for (use, rows, n, cap), dtype in product(
                (("logits32", 32, 256000, 30.0), ("attention512", 8 * 512, 4096, 50.0)),
                FLOAT_DTYPES)]
