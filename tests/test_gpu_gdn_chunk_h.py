"""`cuda:kp_gdn_chunk_h` and the l2norm kernel on the GPU (issue 29,
`gpu_impls/cuda/gdn_chunk_h.py`), beyond the gate (tests/test_gpu.py runs the impl over the op's gate cases: tiny heads, K = 16,
V = 8):

* the op's oracle through the runner on cases that reach each part of the kernel: T not a
  multiple of the chunk (the last chunk's padding), chunks of 16 / 32 / 64, GQA groups of 2 and
  4, every instance (K padded to 32, 64, 128, 256), V that leaves a partial tile of rows, each
  dtype, a given and a large (N(0, 1000²)) initial state, one token, the Qwen3-Next heads (all
  128 blocks), and a grid.y capped below B * Hv (the blocks stride);
* the unscaled-state mutant (tests/mutants.py) goes red on the gate cases;
* the l2norm kernel against `oracle.gdn_math.l2norm` within its derived bound (f32 sum of
  squares and rsqrt, then T's rounding), in place and not.

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run.
"""

from __future__ import annotations

import numpy as np
import pytest

from cases.generate import plan
from cases.model import Case
from oracle.dtypes import round_to, spacing
from oracle.gdn import EPS
from oracle.gdn_chunked_stage_bounds import gamma, half_ulp_rel
from oracle.gdn_math import l2norm as l2norm_exact
from oracle.numerics import U
from runners.correctness import check
from runners.verdicts import repro_command
from tests.gpu_helpers import cuda_backend as _cuda, impl as _impl, assert_passes as _assert_passes

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]
IMPL = "cuda:kp_gdn_chunk_h"
SEED = {"batch": 1, "heads_k": 2, "heads_v": 4, "dim_k": 128, "dim_v": 128}


# (id, dims over SEED, dtype, params)
CASES = (
    ("t130-partial-chunk", {"tokens": 130}, "bf16", {}),
    ("chunk16-t100", {"tokens": 100}, "f16", {"chunk": 16}),
    ("chunk32-t70", {"tokens": 70}, "f32", {"chunk": 32}),
    ("gqa4-k64-v48", {"tokens": 77, "heads_k": 1, "dim_k": 64, "dim_v": 48}, "bf16",
     {"chunk": 32}),
    ("gqa4-b2-k96", {"batch": 2, "tokens": 64, "heads_v": 8, "dim_k": 96}, "f16",
     {"initial_state": "given"}),
    ("state-large", {"tokens": 130}, "f32", {"initial_state": "large"}),
    ("state-large", {"tokens": 130}, "bf16", {"initial_state": "large"}),
    ("k256-v40", {"tokens": 130, "dim_k": 256, "dim_v": 40}, "bf16", {}),
    ("k256-v40", {"tokens": 65, "dim_k": 256, "dim_v": 40}, "f32", {"initial_state": "given"}),
    ("k8-v1-t17", {"tokens": 17, "dim_k": 8, "dim_v": 1}, "f32", {"chunk": 16}),
    ("t1", {"tokens": 1}, "bf16", {"chunk": 16, "initial_state": "given"}),
    pytest.param("qwen-t512", {"tokens": 512, "heads_k": 16, "heads_v": 32}, "bf16", {},
                 marks=pytest.mark.nightly),  # Qwen3.5's heads at 512 tokens: the nightly tier
)


@pytest.mark.parametrize("name, dims, dtype, params", CASES,
                         ids=[f"{v[0]}-{v[2]}" for v in (getattr(c, "values", c) for c in CASES)])
def test_chunk_h_against_the_oracle(name, dims, dtype, params):
    _assert_passes(IMPL, Case.make("gdn_chunk_h", {**SEED, **dims}, dtype, params=params,
                                   label=f"edge-{name}"))


def test_chunk_h_strides_past_a_capped_grid(monkeypatch):
    """Past CUDA's 65535 on grid.y (batch x heads) the wrapper caps the grid and each block
    strides over the rest: here with the cap lowered to 2 (8 heads, 2 V tiles, 5 chunks)."""
    from gpu_impls.cuda import gdn_chunk_h

    monkeypatch.setattr(gdn_chunk_h, "GRID_Y_MAX", 2)
    case = Case.make("gdn_chunk_h", {**SEED, "batch": 2, "tokens": 150, "dim_v": 64}, "bf16",
                     params={"chunk": 32})
    assert _impl(IMPL).contract.check(IMPL, case).grid == (2, 2, 1)
    _assert_passes(IMPL, case)


def test_unscaled_state_mutant_goes_red():
    """The state carried into the next chunk without exp(gc_last) (issue 29 "Done when" 2)
    fails on the gate cases, which the real kernel passes (tests/test_gpu.py)."""
    backend = _cuda()
    impl = _impl("cuda:mutant_kp_gdn_chunk_h_unscaled_state")
    work = plan([impl], dtypes=["bf16", "f16"], invalid=False)
    rows = [check(w, backend) for w in work]
    assert any(r["status"] == "fail" for r in rows), (
        f"{impl.id} passed all {len(rows)} cases; repro: "
        f"{repro_command(impl.id, work[0].case.id) if work else 'no case'}")


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", [(2, 33, 16, 128), (1, 7, 2, 16), (1, 5, 1, 300)])
def test_l2norm_against_the_oracle(dtype, shape):
    """T(x · rsqrt(Σx² + eps)): within δ|y| of the exact y = gdn_math.l2norm(x), δ = γ_K / 2 +
    6u (the f32 sum of squares, halved by the root; rsqrt's 2 ULPs and the product), then T's
    rounding (u_T relative, or half a subnormal spacing); a zero row gives zeros (eps). In place
    (x_out = x_in) the same bits."""
    import cupy

    from gpu_impls.cuda.gdn_chunk_h import l2norm

    backend = _cuda()
    rng = np.random.default_rng(29)
    x = rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 50.0], size=shape[:-1] + (1,))
    x[0, 0, 0] = 0.0
    xs = round_to(x, dtype)
    x_dev = backend.to_device(xs)
    y_dev = cupy.empty_like(x_dev)
    l2norm(x_dev, y_dev, EPS, dtype)
    got = backend.to_host(y_dev, dtype).astype(np.float64)
    exact = l2norm_exact(xs.astype(np.float64), EPS)
    delta = gamma(shape[-1]) / 2 + 6 * U
    bound = ((half_ulp_rel(dtype) * (1 + delta) + delta) * np.abs(exact)
             + 0.5 * float(spacing(np.zeros(1), dtype)[0]))
    err = np.abs(got - exact)
    assert (err <= bound).all(), (f"{dtype} {shape}: largest error / bound "
                                  f"{np.max(err / bound):.3g}")
    assert not got[0, 0, 0].any()
    l2norm(x_dev, x_dev, EPS, dtype)
    assert np.array_equal(cupy.asnumpy(x_dev), cupy.asnumpy(y_dev))
