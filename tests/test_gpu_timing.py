"""`chain` against `graph_rot` on a CUDA GPU (issue 26, part 1), at the Llama-3-8B up projection
(out 14336, in 4096, int4 g64, bf16; the GEMV bench preset llama3-8b-up).

In `graph_rot` each call follows the previous call of the same impl: a programmatic dependent
launch overlaps it, so a PDL kernel (`cuda:kp_qgemv_mma`) may only read slower in `chain`, where
each call follows an ordinary kernel that wrote its x. An ordinary launch
(`cuda:dequant_gemv_int4_fast`) waits for the kernel before it either way: the two modes must
agree, within 2 %, or the subtraction is biased.
"""

from __future__ import annotations

import pytest

from cases.model import Case
from gpu_impls import backend, impls
from runners.bench import bench_one
from runners.stopping import StdRel

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

LLAMA3_8B_UP = {"out": 14336, "in": 4096, "bits": 4, "group_size": 64}
AGREE = 0.02


def _median_us(impl_id: str, mode: str) -> float:
    case = Case.make("dequant_gemv", LLAMA3_8B_UP, "bf16", label="bench:llama3-8b-up")
    stop = lambda: StdRel(max_noise=0.005, min_time_s=0.3, min_samples=10, timeout_s=5.0)  # noqa
    row = bench_one(impls()[impl_id], backend("cuda"), case, mode, stop, verify=False)
    assert row["status"] == "ok", f"{impl_id} {mode}: {row['message']}"
    assert row["mode"] == mode
    if mode == "chain":
        assert row["pred_median_ns"] > 0
    return row["median_ns"] / 1e3


def test_chain_never_flatters_a_pdl_kernel():
    chain, rot = _median_us("cuda:kp_qgemv_mma", "chain"), _median_us("cuda:kp_qgemv_mma",
                                                                      "graph_rot")
    print(f"cuda:kp_qgemv_mma llama3-8b-up bf16: chain {chain:.2f} us, graph_rot {rot:.2f} us")
    assert chain >= rot


def test_chain_agrees_with_graph_rot_for_an_ordinary_launch():
    impl = "cuda:dequant_gemv_int4_fast"
    chain, rot = _median_us(impl, "chain"), _median_us(impl, "graph_rot")
    print(f"{impl} llama3-8b-up bf16: chain {chain:.2f} us, graph_rot {rot:.2f} us")
    assert abs(chain / rot - 1) <= AGREE, f"chain {chain:.2f} us vs graph_rot {rot:.2f} us"
