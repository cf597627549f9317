"""`cuda:kp_gdn_chunked` (op `gdn_chunked`, `oracle/gdn_chunked.py`): the chunked Gated DeltaNet
pipeline composed of kparity's CUDA stage kernels, each of which is also an impl of its stage's op
and judged there on its own:

    q̂, k̂ = T(l2norm(q)), T(l2norm(k))     kp_gdn_l2norm (with `l2norm`)    gdn_chunk_h.py
    gc = chunk-local cumsum of g          cuda:kp_gdn_chunk_cumsum         gdn_intra.py
    A  = β (k̂ k̂ᵀ) e^(gc_i − gc_j), j < i  cuda:kp_gdn_kkt                  gdn_intra.py
    Ai = (I + A)^-1 in T                  cuda:kp_gdn_solve_tril           gdn_intra.py
    w, u                                  cuda:kp_gdn_wy                   gdn_intra.py
    h, v_new, state                       cuda:kp_gdn_chunk_h              gdn_chunk_h.py
    o                                     cuda:gdn_chunk_o (the seed port) gdn.py

The intermediates live in a workspace kept per shape (allocated once, outside timed regions).
The seed's chunk_o has no row guard (T % 64 == 0): where T is not a multiple of 64 the inputs are
copied zero-padded to the next multiple (q, k, v, beta and g zero: the oracle's own padding, so
the first T rows of o and the final state are those of the unpadded pipeline: a padded token has
β = 0 (no update) and g = 0 (no decay)) and o's first T rows are copied out. The contract is the
union of the stages' (chunk_o's K == 128, V % 32 == 0, V <= 256, chunk 64, f16 / bf16), less
chunk_o's T % 64 == 0, which the padding lifts.
"""

from __future__ import annotations

from types import SimpleNamespace

from gpu_impls import register
from gpu_impls.contract import NO_CONTRACT, Contract
from gpu_impls.cuda import gdn, gdn_chunk_h, gdn_intra
from gpu_impls.cuda._module import cuda_impl

BT = gdn.CHUNK_O_BT
_WORKSPACE: dict = {}

# chunk_o's invariants but the padding's: every other one the composition keeps
CHUNK_O_PADDED = Contract(
    invariants=tuple(inv for inv in gdn.CHUNK_O_INVARIANTS if not inv.name.startswith("tokens")),
    geometry=gdn._chunk_o_geometry, dtypes=gdn.CHUNK_O_CONTRACT.dtypes)


def _geometry_only(contract: Contract) -> Contract:
    """A stage's launch without its invariants: K == 128 and V % 32 == 0 (chunk_o's) imply
    every one of them (K % 4, K % 8, K <= 256, V % 4, the shared memory at K = 128), so none
    could be broken alone."""
    return Contract(geometry=contract.geometry, dtypes=contract.dtypes)


LAUNCHES = {"cumsum": _geometry_only(gdn_intra.CUMSUM_CONTRACT),
            "kkt": _geometry_only(gdn_intra.KKT_CONTRACT),
            "solve": _geometry_only(gdn_intra.SOLVE_CONTRACT),
            "wy": _geometry_only(gdn_intra.WY_CONTRACT),
            "chunk_h": _geometry_only(gdn_chunk_h.CHUNK_H_CONTRACT), "chunk_o": CHUNK_O_PADDED}


def _workspace(case, tokens: int) -> dict:
    """The stored intermediates of one shape, in the layouts of the stage ops."""
    import cupy

    d, t = case.dims, case.dtype
    key = (cupy.cuda.Device().id, t, tokens, *(d[n] for n in ("batch", "heads_k", "heads_v",
                                                             "dim_k", "dim_v")))
    if key not in _WORKSPACE:
        b, hk, hv, dk, dv = (d[n] for n in ("batch", "heads_k", "heads_v", "dim_k", "dim_v"))
        bits = cupy.uint16 if t in ("f16", "bf16") else cupy.float32
        nt = tokens // BT
        _WORKSPACE[key] = {
            "q": cupy.empty((b, tokens, hk, dk), bits), "k": cupy.empty((b, tokens, hk, dk), bits),
            "v": cupy.empty((b, tokens, hv, dv), bits),
            "g": cupy.empty((b, tokens, hv), cupy.float32),
            "beta": cupy.empty((b, tokens, hv), cupy.float32),
            "gc": cupy.empty((b, tokens, hv), cupy.float32),
            "A": cupy.empty((b, tokens, hv, BT), cupy.float32),
            "Ai": cupy.empty((b, tokens, hv, BT), bits),
            "w": cupy.empty((b, tokens, hv, dk), bits), "u": cupy.empty((b, tokens, hv, dv), bits),
            "h": cupy.empty((b, nt, hv, dv, dk), bits),
            "v_new": cupy.empty((b, tokens, hv, dv), bits),
            "o": cupy.empty((b, tokens, hv, dv), bits)}
    return _WORKSPACE[key]


def _chunked(defines: tuple = ()):
    cumsum, kkt, solve, wy = (gdn_intra._cumsum(defines), gdn_intra._kkt(defines),
                              gdn_intra._solve(defines), gdn_intra._wy(defines))
    chunk_h, chunk_o = gdn_chunk_h._chunk_h(defines), gdn._chunk_o(defines)

    def run(launch, inputs, outputs, case):
        t = case.dims["tokens"]
        tokens = -(-t // BT) * BT
        ws = _workspace(case, tokens)
        padded = tokens != t
        src = {n: inputs[n] for n in ("q", "k", "v", "g", "beta")}
        if padded:  # zero-padded copies (the tail zeroed each call: the workspace is shared by
            for n in src:  # every T that pads to these tokens)
                ws[n][:, :t] = inputs[n]
                ws[n][:, t:] = 0
                src[n] = ws[n]
        if case.params["l2norm"]:  # in place on the padded copies (l2norm(0) = 0), else into ws
            for n in ("q", "k"):
                gdn_chunk_h.l2norm(src[n], ws[n], gdn.EPS, case.dtype)
                src[n] = ws[n]
        q, k = src["q"], src["k"]
        stage = SimpleNamespace(dims={**case.dims, "tokens": tokens}, params=case.params,
                                dtype=case.dtype)
        # every stage over the padded tokens: its grid from the padded dims (the checked
        # `launch` covers the case's own T; the invariants are the same for both)
        params = {**case.params, "dtype": case.dtype}
        launch = {name: c.geometry(stage.dims, params)[1] for name, c in LAUNCHES.items()}
        o = ws["o"] if padded else outputs["o"]
        cumsum(launch["cumsum"], {"g": src["g"]}, {"gc": ws["gc"]}, stage)
        kkt(launch["kkt"], {"k": k, "beta": src["beta"], "gc": ws["gc"]}, {"A": ws["A"]}, stage)
        solve(launch["solve"], {"A": ws["A"]}, {"Ai": ws["Ai"]}, stage)
        wy(launch["wy"], {"k": k, "v": src["v"], "beta": src["beta"], "gc": ws["gc"],
                          "Ai": ws["Ai"]}, {"w": ws["w"], "u": ws["u"]}, stage)
        chunk_h(launch["chunk_h"], {"k": k, "w": ws["w"], "u": ws["u"], "gc": ws["gc"],
                                    "h0": inputs["h0"]},
                {"h": ws["h"], "v_new": ws["v_new"], "state": outputs["state"]}, stage)
        chunk_o(launch["chunk_o"], {"q": q, "k": k, "v_new": ws["v_new"], "h": ws["h"],
                                    "gc": ws["gc"]}, {"o": o}, stage)
        if padded:
            outputs["o"][...] = o[:, :t]
    return run


register(
    cuda_impl("kp_gdn_chunked", "gdn_chunked", NO_CONTRACT, _chunked,
              "kparity's chunked GDN: l2norm, cumsum, kkt, solve_tril, wy, chunk_h (kparity's "
              "CUDA stage kernels), then the seed's chunk_o port; T padded to a multiple of 64",
              launches=LAUNCHES),
)
