"""Summation orders that several of kparity's CUDA kernels share, as `oracle.numerics.plan`s
(each kernel's own are beside its launcher: `kp_norms.sum_order`, `gemv.kp_sum_orders`)."""

from __future__ import annotations

from oracle.numerics import Reduction, plan


def vector_width(per_lane: int) -> int:
    """W: the widest of 4, 2, 1 floats dividing a lane's share (the kernels' `constexpr W`)."""
    return 4 if per_lane % 4 == 0 else 2 if per_lane % 2 == 0 else 1


def warp_of_vectors(per_lane: int) -> Reduction:
    """A dot over 32 * per_lane elements held by one warp as W-float vectors: lane l holds
    elements (32 j + l) W + w; it sums its own in (j, w) order from 0, then the warp adds the
    lanes' partials by xor butterfly, offsets 16 down to 1 (gdn_step.cu's and ssm_step.cu's
    hpn `warp_sums`)."""
    w = vector_width(per_lane)
    return plan({"j": per_lane // w, "lane": 32, "w": w}, ("j w", "sequential"),
                ("lane", "butterfly"))
