"""Impl-vs-impl exactness: an impl that declares an `ExactPeer` must equal that peer bit for bit
(tolerance 0) on every sub-problem its `split` lists, e.g. the expert-indexed GEMV against the
plain GEMV on each expert's slab of one stacked set. Both run on the same backend."""

from __future__ import annotations

from cases.model import make_inputs
from gpu_impls import impls
from runners.correctness import run_impl


def exact_peer_mismatches(impl, backend, case) -> list[str]:
    """'label: output (n of m elements differ)' for every sub-problem where `impl` and its peer
    differ in any bit; [] when they agree everywhere."""
    peer = impls()[impl.exact_peer.peer]
    bad = []
    for label, own_case, own_inputs, peer_case, peer_inputs in impl.exact_peer.split(
            case, make_inputs(case)):
        ours = run_impl(impl, backend, own_case, own_inputs)
        theirs = run_impl(peer, backend, peer_case, peer_inputs)
        for name, a in ours.items():
            b = theirs[name]
            differ = int((a.view(f"u{a.itemsize}") != b.view(f"u{b.itemsize}")).sum())
            if differ:
                bad.append(f"{label}: {name} ({differ} of {a.size} elements differ from "
                           f"{peer.id})")
    return bad
