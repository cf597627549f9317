"""Mamba-2's chunked SSD, the state-space-duality form of the scan (issue 30; mamba_ssm's
`ssd_minimal_discrete` and `mamba_chunk_scan_combined`), as its own op with its own oracle: the
chunk-level math, so a chunked impl is judged on its contract; that it equals the recurrence
(`oracle/ssd_math.py`) is a property (`tests/test_ssd.py`).
`ssd_chunked`: the inputs and outputs of `ssd_scan` (`oracle/ssd.py`: x, dt_raw, A_log, dt_bias,
Bm, Cm, D, z, h0 -> y, state; same dtypes, params and domain) plus param `chunk` in {64, 128,
256} (T need not be a multiple: the chunks are zero-padded inside). With a_t = dt_t A and, in
chunk n (Q tokens, l, s local indices), cs_l = Σ_{m<=l} a_m and seg(l, s) = Σ_{s<m<=l} a_m:

    L        = exp(seg)  masked causal (s <= l)         the stable segsum (`ssd_math.segsum`)
    Y_diag_l = Σ_{s<=l} (C_l·B_s) L_ls dt_s x_s          the intra-chunk "attention"
    st_n     = Σ_s exp(cs_last − cs_s) dt_s x_s ⊗ B_s     the chunk's own state
    S_{n+1}  = exp(cs_last) S_n + st_n                  state passing (S_0 = h0), f32
    Y_off_l  = exp(cs_l) (S_n C_l)                      the state before the chunk
    y        = Y_diag + Y_off + D x;  y *= silu(z) with the gate;  the final state S_NT

Rounding points (the contract): inputs as stored; dt, the cumsums and the chunk and passed
states in f32; y rounded to T once, at the store; the final state stored in f32. The oracle is
the chunk math above in float64 (`ssd_math.chunked`; equal to the recurrence in exact
arithmetic). Param `dots`: "f32" (the default: every dot's operands in f32, as the torch listing
holds them) or "T": mamba_ssm's Triton kernels round three operands to T for the tensor-core dots
(`_chunk_scan_fwd`: the tile (C·B) L dt before the dot with x; `_chunk_state_fwd`: B·exp(..)·dt
before the dot with x; `_state_passing_fwd`'s states, read by Y_off in C's dtype); with "T" an
impl MAY round there or keep f32, the bound covers both (`Val.may_round`) and the oracle does
not round there. (A kernel rounding them declares `dots="T"` in its contract.)

Tolerance: the admissible kernel (`chunked_kernel`) in `oracle/numerics.py`'s interval
arithmetic, chunk by chunk, so `tests/test_bounds_corners.py` covers it. It admits two forms
(`either`), the bound the larger:

* the kernel path (mamba_ssm's `mamba_chunk_scan_combined`): dt as in `ssd_scan` (softplus as
  log(1 + exp(z)), the clamp), a = dt·A, cs by any f32 scan, seg as cs_l − cs_s (the Triton form;
  the stable segsum's sum over s < m <= l of same-signed terms has a bound no larger, a subset's,
  so the model need not form it), exp; C·B the N-term dot in any order, the tile's three-factor
  product in any association, may round to T (`dots`), then the tile·x terms and Y_off as Q + 1
  terms summed in any order (the Triton loop adds its tile blocks onto the accumulator holding
  Y_off); the chunk state B·(exp(cs_last − cs_s)·dt), may round to T, its Q-term dot with x;
  the passing S = exp(cs_last) S + st, sequential; Y_off = (Σ_n C·T?(S)) exp(cs_l); then D·x
  added, the gate (`ssd_scan`'s silu forms) and T's store.
* the torch listing (`ssd_minimal_discrete`, torch.einsum contracting left to right): X = dt·x,
  Y_diag = Σ_s (C·B ∘ L) X_s, the chunk state Σ_s (B·decay) X_s, and the passing as the listing
  does it: S_z = Σ_{c<=z} exp(Σ_{c<=j<z} cs_last_j) states_c (the stable segsum of the chunk
  totals, an exp, then a dot over the chunks).

The bound is the worse of the two forms, unless the impl declares the form "kernel"
(`Numerics.form`: cuda:kp_ssd_chunked): the kernel path alone, with the orders of its dots
declared as the sums "cb" (C·B over n), "c_state" (C·S over n, Y_off) and "chunk_state"
(the chunk's state over its tokens); the cumsum and y's sum stay in any order.

Exact values stay exact: exp(0) on the diagonal and at cs_last − cs_last, the masked entries.

Non-finite inputs are outside the op's domain (`check_chunked_domain`): the listing multiplies
the masked decays (exp(−inf) = 0) by every token's X and its passing matrix by every chunk's
state, so an inf at token s turns earlier tokens NaN (0·inf); mamba_ssm's Triton kernel does so
within its diagonal block; a kernel that selects instead keeps them finite. No order-free answer
exists to check against; the sequential `ssd_scan` has the non-finite cases.

Growth with T: the state crosses chunks, element by element (the recurrence is diagonal), so its
bound obeys E_{n+1} = exp(cs_last) E_n + ℓ_n (+ the passing's own roundings): at most linear in
the number of chunks where nothing decays (E_NT <= Σ_n ℓ_n), saturating at ℓ / (1 − exp(cs_last))
where the state forgets; y's bound adds the chunk's own terms (independent of T) and the
state's through C (Y_off). Measured (`python -m scripts.ssd_chunked_budget`: H 2, P 4, G 1,
N 8, chunk 64, the first T tokens of one draw; B the bound against the recurrence; budgets
max |x − truth| / B of torch's listing and of the worst admissible kernel, all roundings up):

    f32, dt slow, h0 given   T     1       64      65      512     4096    16384
                             B_y   1.3e-5  3.4e-4  4.1e-4  2.0e-3  2.0e-3  2.0e-3  (max|y| ~9)
                             B_S   3.4e-6  1.1e-4  1.1e-4  2.6e-4  2.2e-5  2.1e-5  (max|S| 3 -> .01)
                             torch y .074 .059 .059 .059 .059 .059   S .076 .0016 .0019 .0005 .0004 .0003
                             worst y .75  .96  .96  .96  .96  .96    S .79  .96   .96   .93   .08   .11
    bf16, dt mixed           B_y   .0078 .016 .016 .016 .031 .031 (the store: torch y .74-1)

B grows with the chunks while the state remembers (x30 over one chunk, x75 at T = 512) and
saturates as it forgets (h0 decayed by T = 4096: max |S| 0.01, B_S back to 2e-5); every budget
<= 1 (the slow test runs it: KPARITY_SLOW=1), the worst admissible kernel at 0.96 of B_y (the
bound is what the contract admits; the listing's random-signed errors use 6 %). The state's
worst kernel reaches 0.1 past T = 4096, where its terms have both signs and one rounding
direction per site cancels (the search's limit, not the bound's slack alone).

Against the loosest acceptable tolerances (mamba_ssm's tests; the fork's chunked scan has only a
cosine), H 8, P 64, G 1, N 128, T = 256 in chunks of 64, CUDA's ULPs, any summation order, max
over the elements of bound / (atol + rtol |y|): mamba's selective_scan (f32 6e-4/2e-3, bf16
3e-2/5e-2): f32 1.3x (NOT within: the chunk-local f32 cumsum's worst case in the decays'
exponents, a relative error of Σ_k u C_k of the a's), f16 0.13, bf16 0.13; mamba's test_ssd
(rtol 1e-2, atol 3e-3): f32 0.48, f16 1.6x, bf16 1.2x (NOT within: the store of y near 0);
with dots="T": bf16 32x test_ssd's and 2.2x selective_scan's (a worst case of 64 aligned bf16
roundings of the tile in one dot).
"""

from __future__ import annotations

import numpy as np

from oracle import ssd_math
from oracle.builders import kernel_view
from oracle.numerics import product_into
from oracle.ssd import (COMMON, PARAM_VALUES, PARAMS, SCAN_DIMS, BC, DT, STATE, X, Z,
                        check_domain, decay_and_skip, dt_limits, exact_where, scan_inputs,
                        silu_kernel, time_step_kernel, view)
from oracle.spec import BatchDim, OpSpec, TensorSpec, register

CHUNKS = (64, 128, 256)
DOTS = ("f32", "T")


def check_chunked_domain(case) -> None:
    """`oracle.ssd.check_domain`, the chunk one of CHUNKS, and finite inputs (the module
    docstring: non-finite values have no order-free meaning in the chunked form)."""
    check_domain(case)
    if case.params["chunk"] not in CHUNKS:
        raise ValueError(f"{case.op}: chunk={case.params['chunk']!r}: one of "
                         + ", ".join(map(str, CHUNKS)))
    if case.dist == "nonfinite":
        raise ValueError(f"{case.op}: dist=nonfinite: the chunked form multiplies its masked "
                         "(zero) decays by every token of a chunk, so where a NaN or inf lands "
                         "(which earlier tokens turn NaN) depends on the kernel's masking: "
                         "run the non-finite cases on ssd_scan")


# --- the oracle --------------------------------------------------------------------------------

def ssd_chunked(inputs: dict, case) -> dict:
    x = kernel_view(inputs, case)
    dt = ssd_math.time_step(x["dt_raw"], x["dt_bias"], *dt_limits(case))
    got = ssd_math.chunked(x["x"], dt, ssd_math.decay_rate(x["A_log"]), x["Bm"], x["Cm"],
                           x["D"], case.params["chunk"],
                           x["z"] if case.params["gate"] else None, x["h0"])
    return {"y": got["y"], "state": got["state"]}


# --- the admissible kernel ---------------------------------------------------------------------

def chunk_bounds(tokens: int, chunk: int) -> list[tuple[int, int]]:
    """(first token, length) of each chunk; the last may be short (its padding is exact zeros:
    the model leaves it out)."""
    return [(lo, min(chunk, tokens - lo)) for lo in range(0, tokens, chunk)]


def _swap(v):
    """[B, Q, H, ...] -> [B, H, ..., Q]: the token axis last, for a sum over it."""
    return np.moveaxis(v, 1, -1)


def _segments(A, cs, m: int):
    """L [B, Q(l), H, Q(s)]: exp(cs_l − cs_s) for s < l, an exact 1 on the diagonal, an exact
    0 above it."""
    strict = np.tril(np.ones((m, m)), -1)[None, :, None, :]
    gi = view(cs, lambda v: v[:, :, :, None] * strict)
    gj = view(cs, lambda v: np.swapaxes(v, 1, 2)[:, None] * strict)
    big_l = view((gi - gj).exp(), lambda v: v * np.tril(np.ones((m, m)))[None, :, None, :])
    return exact_where(big_l, np.eye(m, dtype=bool)[None, :, None, :], 1.0)


def _passed(A, h0, totals: list, contributions: list):
    """The listing's state before chunk z = len(totals): Σ_{c<=z} exp(Σ_{c<=j<z} tot_j)
    states_c, states_0 = h0, states_c = contributions[c − 1] ([B, H, P, N] each)."""
    z = len(totals)
    if z == 0:
        return h0
    tot = A.concat([A.keep(t) for t in totals], axis=-1)  # [B, H, z]
    mask = (np.arange(z)[None, :] >= np.arange(z + 1)[:, None]).astype(float)  # [c, j]: j >= c
    seg = A.sum(view(tot, lambda v: v[:, :, None, :] * mask))  # [B, H, z + 1]
    decay = exact_where(seg.exp(), (np.arange(z + 1) == z)[None, None], 1.0)  # c = z: exp(0)
    states = A.concat([A.keep(s) for s in [h0, *contributions]], axis=-1)  # [B, H, P, N, z+1]
    return A.sum(states * view(decay, lambda v: v[:, :, None, None, :]))


def chunked_kernel(A, inputs: dict, case) -> dict:
    x = kernel_view(inputs, case)
    dims, q = case.dims, case.params["chunk"]
    # form "kernel" (cuda:kp_ssd_chunked): the kernel path only, not the listing's; its dots'
    # orders declared as the sums "cb", "c_state" and "chunk_state"
    own = A.m.numerics.form == "kernel"
    either = (lambda kernel, listing: kernel) if own else A.either
    # param dots="T": the three operands mamba_ssm's Triton kernels round to T may be held in T
    held = (lambda v: v.may_round(case.dtype)) if case.params["dots"] == "T" else (lambda v: v)
    heads = ssd_math.group_index(dims["heads"], dims["groups"])
    rate, d = decay_and_skip(A, x)
    d = view(d, lambda v: v[:, None])  # [H, 1]
    dt = time_step_kernel(A, x["dt_raw"], x["dt_bias"], case)  # [B, T, H]
    a = dt * rate
    h0 = A.load(x["h0"])
    s_seq, totals, contributions, ys = h0, [], [], []
    for lo, m in chunk_bounds(dims["tokens"], q):
        rows = (slice(None), slice(lo, lo + m))
        a_n, dt_n = a.at(rows), dt.at(rows)  # [B, Q, H]
        xn = x["x"][rows]  # [B, Q, H, P], exact
        bg, cg = x["Bm"][rows], x["Cm"][rows]  # [B, Q, G, N]
        s_before = s_seq if own else A.either(s_seq, _passed(A, h0, totals, contributions))
        # cs: the chunk-local inclusive cumsum, any order
        incl = np.tril(np.ones((m, m)))[None, :, None, :]
        cs = A.sum(view(a_n, lambda v: np.swapaxes(v, 1, 2)[:, None] * incl))  # [B, Q, H]
        big_l = _segments(A, cs, m)
        cb = A.sum(product_into(A, A.load(cg[:, :, :, None, :]),
                                A.load(np.swapaxes(bg, 1, 2)[:, None]), "cb"), site="cb")
        cb = view(cb, lambda v: v[:, :, heads])  # [B, Q(l), H, Q(s)]
        dt_s = view(dt_n, lambda v: np.swapaxes(v, 1, 2)[:, None])  # [B, 1, H, Q(s)]
        x_s = A.load(_swap(xn)[:, None])  # [B, 1, H, P, Q(s)]
        xdt = A.load(xn) * A.keep(dt_n)  # X = dt·x [B, Q, H, P] (the listing)
        # Y_off: (Σ_n C_l·T?(S)) exp(cs_l), as one more term of the sum over the chunk
        ch = cg[:, :, heads]  # [B, Q, H, N]
        c_s = A.sum(product_into(A, A.load(ch[:, :, :, None, :]),
                                 view(held(s_before), lambda v: v[:, None]), "c_state"),
                    site="c_state")
        y_off = c_s * A.keep(cs.exp())  # [B, Q, H, P]
        tile = held(A.prod3(cb, big_l, dt_s))  # the kernel path
        kernel_terms = view(tile, lambda v: v[:, :, :, None, :]) * x_s
        listing_terms = (view(cb * big_l, lambda v: v[:, :, :, None, :])
                         * view(xdt, lambda v: _swap(v)[:, None]))
        y = either(*(A.sum(A.concat([t, A.keep(y_off)], axis=-1))
                     for t in (kernel_terms, listing_terms)))
        y = y + d * A.load(xn)
        if case.params["gate"]:
            y = y * silu_kernel(A, A.load(x["z"][rows]))
        ys.append(y)
        # the chunk's own state: Σ_s x_s ⊗ B_s·exp(cs_last − cs_s)·dt_s
        last = cs.at((slice(None), m - 1))  # [B, H]
        decay = exact_where((view(last, lambda v: v[:, None]) - cs).exp(),
                            (np.arange(m) == m - 1)[None, :, None], 1.0)  # [B, Q(s), H]
        bh = A.load(bg[:, :, heads])  # [B, Q, H, N]
        b_kernel = held(bh * A.keep(decay * dt_n))
        b_listing = bh * A.keep(decay)
        per_pn = lambda b: view(b, lambda v: _swap(v)[:, :, None])  # noqa: E731 [B,H,1,N,Q]
        st = either(A.sum(product_into(A, A.load(_swap(xn)[:, :, :, None]), per_pn(b_kernel),
                                       "chunk_state"), site="chunk_state"),
                    A.sum(view(xdt, lambda v: _swap(v)[:, :, :, None]) * per_pn(b_listing)))
        s_seq = s_seq * A.keep(A.keep(last.exp())) + st
        totals.append(last)
        contributions.append(st)
    state = s_seq if own else A.either(s_seq, _passed(A, h0, totals, contributions))
    return {"y": ys[0] if len(ys) == 1 else A.concat(ys, axis=1), "state": state}


# --- the op ------------------------------------------------------------------------------------

def _flops(case) -> int:
    """Per chunk and head: C·B (2 Q² N), the tile·x (2 Q² P), the chunk state and Y_off
    (4 Q P N); per token D·x and the gate."""
    d, q = case.dims, case.params["chunk"]
    t, h, p, n = d["tokens"], d["heads"], d["dim_p"], d["dim_n"]
    return int(d["batch"] * h * (t * (2 * q * (n + p) + 4 * p * n) + 4 * t * p))


register(OpSpec(
    name="ssd_chunked", dims=SCAN_DIMS, inputs=scan_inputs(X, DT, BC, Z, STATE),
    outputs=(TensorSpec("y", X), TensorSpec("state", STATE, role="f32")),
    oracle=ssd_chunked, tolerance=None, kernel=chunked_kernel,
    params={**PARAMS, "chunk": 64, "dots": "f32"},
    param_values={**PARAM_VALUES, "chunk": CHUNKS, "dots": DOTS},
    batch=BatchDim("batch", ("x", "dt_raw", "Bm", "Cm", "z", "h0"), ("y", "state")),
    **{**COMMON, "flops": _flops, "domain": check_chunked_domain, "doc": __doc__}))
