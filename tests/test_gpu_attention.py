"""The attention properties on the GPU, for kparity's CUDA split-KV decode kernel
(`gpu_impls/cuda/kp_attention.py`): split invariance (any split count within the single-pass
oracle's bound; more splits than keys leaves splits empty), paging invariance (permuting the
physical pages changes no output bit) and the CUDA mutants going red.

`pytest -m gpu` selects it; without an accelerator the conftest guard fails the run.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpu_impls
from cases.attention import SMALL
from cases.generate import plan
from cases.model import Case, make_inputs
from runners.correctness import check, oracle_for, run_impl
from runners.verdicts import repro_command
from tests.test_attention import assert_paging_invariant
from tests.gpu_helpers import cuda_backend as _cuda

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]
MUTANTS = "tests/mutants.py"
PAGED = {"batch": 6, "heads": 8, "kv_heads": 2, "head_dim": 64, "page_size": 16,
         "max_pages": 4, "num_pages": 30}
# Llama-3.1-8B's heads over 300 keys (GQA groups of 4); GPT-OSS's 64/8 (two chunks of 4)
CASES = (("sdpa_decode", {**SMALL, "max_len": 300}, "near_tie", {}),
         ("sdpa_decode", {**SMALL, "max_len": 300}, "outlier_rows",
          {"sinks": 1, "window": 40, "sink_end": 4}),
         ("sdpa_decode", {"batch": 2, "heads": 64, "kv_heads": 8, "head_dim": 64,
                          "max_len": 200}, "normal", {"sinks": 1, "window": 128}),
         ("sdpa_decode_paged", PAGED, "normal", {}))


@pytest.mark.parametrize("op, dims, dist, params", CASES)
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_split_invariance(op, dims, dist, params, dtype):
    """1 to 64 splits, and 300 (more than any sequence's keys): every output within the bound."""
    from gpu_impls.cuda.kp_attention import decode_impl

    backend = _cuda()
    case = Case.make(op, dims, dtype, dist, params=params)
    inputs = make_inputs(case)
    for splits in (1, 2, 3, 7, 64, 300):
        impl = decode_impl(op, f"kp_split{splits}", splits)
        exact, _, bound = oracle_for(impl, backend, case, inputs)
        out = np.asarray(run_impl(impl, backend, case, inputs)["out"]).astype(np.float64)
        ok = np.isfinite(exact["out"])
        budget = np.max(np.abs(out - exact["out"])[ok] / bound["out"][ok])
        assert budget <= 1.0, f"{splits} splits: budget {budget:.3f} ({case.to_json()})"


def test_paging_invariance():
    """Permuting the physical pages (the table renamed with them) changes no output bit."""
    backend = _cuda()
    impl = gpu_impls.impls()["cuda:kp_sdpa_decode_paged"]
    assert_paging_invariant(impl, backend, Case.make("sdpa_decode_paged", PAGED, "bf16",
                                                     params={"sinks": 1, "window": 40}))


@pytest.mark.parametrize("mutant", ["mutant_kp_sdpa_drop_sink", "mutant_kp_sdpa_window_off_by_one",
                                    "mutant_kp_sdpa_gqa_modulo", "mutant_kp_sdpa_no_rescale",
                                    "mutant_kp_combine_no_rescale"])
def test_attention_mutants_go_red(mutant):
    backend = _cuda()
    gpu_impls.load_plugin(MUTANTS)
    impl = gpu_impls.impls()[f"cuda:{mutant}"]
    work = plan([impl], dtypes=["bf16"], invalid=False)  # 27 sdpa cases, 10 combine
    rows = [check(w, backend) for w in work]
    assert any(r["status"] == "fail" for r in rows), (
        f"{impl.id} passed all {len(rows)} cases; repro: "
        f"{repro_command(impl.id, work[0].case.id) if work else 'no case'}")
