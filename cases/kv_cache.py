"""KV cache update cases: the models' KV heads (`cases/configs.py`), decode batches (one of them
filling its cache's last slot, one padded), ragged prefill chunks across page boundaries, both
layouts, pages of 16, 32 and 64 slots."""

from __future__ import annotations

from itertools import product

import numpy as np

from cases.configs import config
from cases.inits import init
from cases.model import Case
from cases.registry import bench_cases, gate_cases
from oracle.dtypes import FLOAT_DTYPES
from oracle.kv_cache import sequences


@init("kv_slots")
def kv_slots(shape, dtype, rng, case, drawn):
    """Each new row's slot (`oracle/kv_cache.py`), then -1 for the padding rows. Paged: each
    sequence's logical pages are a random permutation of the pool."""
    p, max_len = case.params, case.dims["max_len"]
    seqs = sequences(case)
    if p["layout"] == "paged":
        size = p["page_size"]
        pages = rng.permutation(len(seqs) * max_len // size).reshape(len(seqs), -1)
        slot = lambda b, pos: pages[b, pos // size] * size + pos % size  # noqa: E731
    else:
        slot = lambda b, pos: b * max_len + pos  # noqa: E731
    slots = [slot(b, pos) for b, (c, n) in enumerate(seqs) for pos in range(c, c + n)]
    return np.asarray(slots + [-1] * p["pad"], dtype=np.int32)


# (model, cache_lens, new_lens, max_len, pad, page_size)
STEPS = (
    # decode: a sequence starting, one at a page's last slot, one filling its cache
    ("llama-3.1-8b", (5, 0, 31, 63), (1, 1, 1, 1), 64, 0, 16),
    ("gpt-oss-20b", (7, 40), (1, 1), 64, 2, 32),          # decode padded to a graph's 4 rows
    ("gemma-3-1b", (0, 16, 30), (16, 17, 2), 64, 0, 16),  # ragged prefill across pages
    ("llama-3.1-8b", (100,), (28,), 128, 1, 64),         # a chunked prefill to the cache's end
    ("qwen3-8b", (12, 12), (4, 4), 32, 0, 16),           # equal lengths (HF's StaticCache)
)
LAYOUTS = ("contiguous", "paged")


def _case(model, cache_lens, new_lens, max_len, pad, page_size, layout, dtype, dist="normal",
          label=""):
    c = config(model)
    return Case.make("kv_cache_update", {"heads": c.kv_heads, "head_dim": c.head_dim,
                                         "max_len": max_len}, dtype, dist,
                     params={"cache_lens": cache_lens, "new_lens": new_lens, "pad": pad,
                             "layout": layout, "page_size": page_size},
                     label=label or f"preset:{model}")


@gate_cases("kv_cache_update")
def kv_cache_update_cases() -> list[Case]:
    cases = [_case(*step, layout, dtype)
             for step, layout, dtype in product(STEPS, LAYOUTS, FLOAT_DTYPES)]
    # NaN and inf rows are copied bit for bit
    return cases + [_case(*STEPS[0], layout, dtype, "nonfinite")
                    for layout, dtype in product(LAYOUTS, FLOAT_DTYPES)]


@bench_cases("kv_cache_update")
def kv_cache_update_bench() -> list[Case]:
    """A decode step of 32 sequences into 4k caches (label b32: "decode" is the CPU bench's
    default preset, the norms' small rows), and a 512-token prefill chunk."""
    decode = ((2000,) * 32, (1,) * 32, 4096, 0, 16)
    prefill = ((1024,), (512,), 4096, 0, 16)
    return [_case("llama-3.1-8b", *step, layout, "bf16", label=f"bench:llama-3.1-8b-{kind}")
            for (kind, step), layout in product((("b32", decode), ("prefill512", prefill)),
                                                LAYOUTS)]
