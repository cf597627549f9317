"""`chain` against `graph_rot` on a CUDA GPU (issue 26, part 1).

In `graph_rot` each call follows the previous call of the same impl: a programmatic dependent
launch overlaps it, so a PDL kernel (`cuda:kp_qgemv_mma` at the Llama-3-8B up projection: out
14336, in 4096, int4 g64, bf16, the GEMV bench preset llama3-8b-up) may only read slower in
`chain`, where each call follows an ordinary kernel that wrote its input. An ordinary launch
waits for the kernel before it either way: the two modes must agree within 2 %, or `chain`
changes more than the kernel each call follows (the subtraction biased, or the activation left
in the L2 by its predecessor: an RMSNorm at one decode row, whose time is its latency, showed it
at 8 %).
"""

from __future__ import annotations

import pytest

from cases.model import Case
from gpu_impls import backend, impls
from runners.bench import bench_one
from runners.stopping import StdRel

pytestmark = [pytest.mark.gpu, pytest.mark.cuda, pytest.mark.timing]

LLAMA3_8B_UP = Case.make("dequant_gemv", {"out": 14336, "in": 4096, "bits": 4, "group_size": 64},
                         "bf16", label="bench:llama3-8b-up")
DECODE_1X4096 = Case.make("rms_norm", {"rows": 1, "n": 4096}, "bf16",
                          params={"eps": 1e-6, "weight_offset": 0}, label="bench:decode-1x4096")
AGREE = 0.02


def _median_us(impl_id: str, case, mode: str) -> float:
    stop = lambda: StdRel(max_noise=0.005, min_time_s=0.3, min_samples=10, timeout_s=5.0)  # noqa
    row = bench_one(impls()[impl_id], backend("cuda"), case, mode, stop, verify=False)
    assert row["status"] == "ok", f"{impl_id} {mode}: {row['message']}"
    assert row["mode"] == mode
    if mode == "chain":
        assert row["pred_median_ns"] > 0
    return row["median_ns"] / 1e3


def test_chain_never_flatters_a_pdl_kernel():
    impl = "cuda:kp_qgemv_mma"
    chain, rot = _median_us(impl, LLAMA3_8B_UP, "chain"), _median_us(impl, LLAMA3_8B_UP,
                                                                     "graph_rot")
    print(f"{impl} llama3-8b-up bf16: chain {chain:.2f} us, graph_rot {rot:.2f} us")
    assert chain >= rot


@pytest.mark.parametrize("impl, case", [("cuda:dequant_gemv_int4_fast", LLAMA3_8B_UP),
                                        ("cuda:mt_rms_norm", DECODE_1X4096)],
                         ids=["gemv-llama3-8b-up", "rms_norm-decode-1x4096"])
def test_chain_agrees_with_graph_rot_for_an_ordinary_launch(impl, case):
    chain, rot = _median_us(impl, case, "chain"), _median_us(impl, case, "graph_rot")
    print(f"{impl} {case.label} bf16: chain {chain:.2f} us, graph_rot {rot:.2f} us")
    assert abs(chain / rot - 1) <= AGREE, f"chain {chain:.2f} us vs graph_rot {rot:.2f} us"


@pytest.mark.parametrize("case, big", [(LLAMA3_8B_UP, True), (DECODE_1X4096, False)],
                         ids=["gemv-llama3-8b-up", "rms_norm-decode-1x4096"])
def test_the_size_matched_copy_is_a_copy_at_bandwidth_and_never_beats_the_large_one(case, big):
    """`--copy-same-bytes` (runners/bench.py): at 29 MiB (the GEMV's bytes, over the L2's
    rotation) the copy kernel moves the bytes near the 1 GiB copy's rate (it is a real copy at
    bandwidth, not a no-op); at 16 KiB (one RMSNorm row) it takes at least the large copy's
    time for those bytes, and more: its launch and latency."""
    be = backend("cuda")
    timer = be.timer()
    large = timer.ceilings()["copy_gbps"]
    stop = lambda: StdRel(max_noise=0.005, min_time_s=0.3, min_samples=10, timeout_s=5.0)  # noqa
    row = bench_one(impls()["cuda:mt_rms_norm" if not big else "cuda:kp_qgemv_mma"], be, case,
                    "chain", stop, verify=False, ceilings={"copy_gbps": large}, copy_same=True)
    assert row["status"] == "ok", row["message"]
    at_large = row["bytes_model"] / large  # ns at the large copy's rate
    print(f"{case.label}: copy of {row['bytes_model']} B {row['copy_same_ns']:.0f} ns, "
          f"large-copy rate {at_large:.0f} ns, impl {row['median_ns']:.0f} ns")
    assert row["copy_same_ns"] >= 0.95 * at_large
    if big:
        assert row["copy_same_ns"] <= 1.25 * at_large
    else:
        assert row["copy_same_ns"] >= 3 * at_large
