"""MoE routing and dispatch (the sigmoid router as HF `NemotronHMoE.route_tokens_to_experts`
and DeepSeek-V3's `inference/model.py::Gate` compute it; the dispatch a stable counting sort by
expert): the router's top-k choice and weights, the counting-sort layout of the chosen (token,
expert) slots, and the gather / weighted combine around the experts.

    moe_router     logits [T, E] (T), correction_bias [E] f32 -> ids [T, k] i32, weights [T, k] f32
    moe_dispatch   ids [T, k] i32 -> counts [E], offsets [E+1], perm [T*k], inv_perm [T*k] (i32)
    moe_permute    x [T, H] (T), perm [T*k] i32 -> x_sorted [T*k, H] (T)
    moe_unpermute  y_sorted [T*k, H] (T), weights [T, k] f32, inv_perm [T*k] i32 -> out [T, H] (T)
    moe_scatter_add  y_sorted [T*k, H] (T), weights [T, k] f32, perm [T*k] i32 -> out [T, H] (T)

Router, param `scoring`:

* "softmax_topk" (Qwen3-MoE) and "softmax" (Qwen3-Next): p = softmax(l) over all E experts, the
  k largest p; weights p, renormalised over the chosen k when `norm_topk_prob` (HF divides by the
  plain sum). The two names compute the same function as specified; they name the two models'
  conventions (Qwen3-MoE ships norm_topk_prob = 1, Qwen3-Next's cases here use 0).
* "sigmoid_bias" (DeepSeek-V3 / Nemotron-H noaux_tc): s = sigmoid(l); chosen by s + bias,
  group-limited (E/groups contiguous experts per group, a group's score the sum of its top two
  biased scores, the `topk_group` best groups kept, the others filled with -inf); weighted by the
  UNbiased s, renormalised by sum + 1e-20 (HF) when `norm_topk_prob`.

Every weight is then multiplied by `routed_scaling_factor` (read as f32, as the kernel holds it).
Ties break to the smaller expert id (and group id); a NaN score ranks below every other score,
-inf included: NaN never wins.

Tolerances (u = 2^-24, the f32 unit roundoff; each first-order f32 model doubled, as
tests/comparator_ops.py's route bound does, for libm exp/sigmoid ULPs beyond one; 2^-125 absolute
for a score that underflows or flushes in f32):

* softmax: d = l - max (one rounding), exp (|d| u + 2u), a sum of E terms in any order, a
  division: |p32 - p| <= 2 p (|d_i| + max|d| + E + 5) u + 2^-125.
* sigmoid: exp(-l) (2u), 1 + t (u), 1 / (.) (u): |s32 - s| <= 8 u s + 2^-125; the selection
  score s + bias adds one rounding: 2 u |s + bias| more.
* ids (`TopKSet` on the selection score): an impl's set is a top-k of some scores within those
  bounds; a different expert within them is a flagged near-tie.
* weights (`RouterWeights`): judged at the impl's own ids, renormalised over the impl's own set
  (so a near-tie swap is judged against its own denominator): the interval of c·s_e / (Σ_S s + eps)
  over the score intervals, plus (k + 2) u relative for the f32 sum, eps, division and scale.

Dispatch, permute: exact (ids, counts, permutations, gathered copies). Unpermute: the f32 kernel
forms each product w·y (one rounding) and sums k of them in the fixed j order, then stores once:
|out - exact| <= γ_k Σ_j |w_j y_j| + half an ULP of T at |exact| + that term (γ_k = k u / (1 - k u)).

Scatter-add: the same combine as an accumulation, in a DECLARED order (the contract: an impl's
bits are the same on every run): out starts at 0 in f32, the sorted rows are visited in order,
r = 0 .. T*k - 1, each adding its product w.flat[perm[r]] · y_sorted[r] (one f32 rounding) into
out[perm[r] // k], and out is stored to T once. A token's k products are thus summed in the
order of their sorted positions (the experts' order), not j's. The bound is moe_unpermute's: the
same k products, another order of one k-term f32 sum, and γ_k Σ_j |w_j y_j| holds for any order.
An atomic scatter-add (arrival order) is inside the bound on every run but fails determinism
(`kparity check --repeat 2`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from oracle.comparators import Bounded, Comparator, Exact, OutputCheck, TopKSet, Verdict
from oracle.dtypes import round_to, spacing
from oracle.spec import OpSpec, TensorSpec, register

U32 = 2.0 ** -24
FLOOR = 2.0 ** -125  # a score that underflows or flushes in f32
SCORINGS = ("softmax_topk", "softmax", "sigmoid_bias")
HF_EPS = 1e-20  # HF noaux_tc's renormaliser eps (DeepSeek official divides by the plain sum)


# --- the router --------------------------------------------------------------------------------

def rank(scores: np.ndarray) -> np.ndarray:
    """Per row, the candidates in descending score order: ties to the smaller index, NaN last
    (below -inf)."""
    s = np.asarray(scores, dtype=np.float64)
    nan = np.isnan(s)
    key = np.where(nan, 0.0, -s)
    idx = np.broadcast_to(np.arange(s.shape[-1]), s.shape)
    return np.lexsort((idx, key, nan), axis=-1)


def _group_mask(sel: np.ndarray, groups: int, topk_group: int) -> np.ndarray:
    """sel with the experts of all but the `topk_group` best groups set to -inf (a group's score:
    the sum of its two best biased scores, its best alone where a group has one expert)."""
    t, e = sel.shape
    g = sel.reshape(t, groups, e // groups)
    top = np.take_along_axis(g, rank(g)[..., :min(2, e // groups)], -1)
    keep = rank(top.sum(-1))[:, :topk_group]
    dropped = np.ones((t, groups), dtype=bool)
    np.put_along_axis(dropped, keep, False, axis=1)
    return np.where(np.repeat(dropped, e // groups, axis=1), -np.inf, sel)


def router_scores(inputs: dict, case) -> tuple[np.ndarray, np.ndarray]:
    """(selection scores, weight scores), float64 [T, E]: (p, p) for softmax; for sigmoid_bias
    (s + bias, s) with the dropped groups' selection scores at -inf."""
    l = np.asarray(inputs["logits"], dtype=np.float64)
    if case.params["scoring"] == "sigmoid_bias":
        with np.errstate(over="ignore"):
            s = 1.0 / (1.0 + np.exp(-l))
        sel = s + np.asarray(inputs["correction_bias"], dtype=np.float64)
        groups = case.dims["groups"]
        if groups > 1:
            sel = _group_mask(sel, groups, case.params["topk_group"])
        return sel, s
    with np.errstate(invalid="ignore"):
        z = np.exp(l - l.max(axis=-1, keepdims=True))
        p = z / z.sum(axis=-1, keepdims=True)
    return p, p


def _scale(case) -> float:
    return float(np.float32(case.params["routed_scaling_factor"]))


def _eps(case) -> float:
    return HF_EPS if case.params["scoring"] == "sigmoid_bias" else 0.0


def moe_router(inputs: dict, case) -> dict:
    sel, w = router_scores(inputs, case)
    ids = rank(sel)[:, :case.dims["top_k"]]
    chosen = np.take_along_axis(w, ids, -1)
    if case.params["norm_topk_prob"]:
        chosen = chosen / (chosen.sum(-1, keepdims=True) + _eps(case))
    return {"ids": ids.astype(np.float64), "weights": chosen * _scale(case),
            "sel": sel, "wscore": w}


def router_bound(inputs: dict, exact: dict, case) -> dict:
    """Per expert: the bound on the selection score (`ids`) and on the weight score
    (`weights`, read by `RouterWeights`); the module docstring derives them."""
    l = np.asarray(inputs["logits"], dtype=np.float64)
    w = exact["wscore"]
    with np.errstate(invalid="ignore"):
        if case.params["scoring"] == "sigmoid_bias":
            bw = 8 * U32 * w + FLOOR
            bias = np.asarray(inputs["correction_bias"], dtype=np.float64)
            bsel = bw + 2 * U32 * np.abs(w + bias)
        else:
            d = np.abs(l - l.max(axis=-1, keepdims=True))
            dmax = d.max(axis=-1, keepdims=True)
            bw = 2 * w * (d + dmax + l.shape[-1] + 5) * U32 + FLOOR
            bsel = bw
    # a NaN score's row has no order (TopKSet skips it) and its weight must be NaN (Bounded)
    return {"ids": np.nan_to_num(bsel, nan=0.0), "weights": np.nan_to_num(bw, nan=0.0)}


def chosen_weights(case, wscore, wbound, ids) -> tuple[np.ndarray, np.ndarray]:
    """(exact weights, their bound) [T, k] at the given ids: the interval of the module
    docstring from the weight scores and their bound (the op's `weights` bound)."""
    s = np.asarray(wscore, dtype=np.float64)
    b = np.broadcast_to(np.asarray(wbound, dtype=np.float64), s.shape)
    ids = np.clip(np.asarray(ids).astype(np.int64), 0, s.shape[-1] - 1)
    se, be = np.take_along_axis(s, ids, -1), np.take_along_axis(b, ids, -1)
    c, k = _scale(case), ids.shape[-1]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if case.params["norm_topk_prob"]:
            d = se.sum(-1, keepdims=True) + _eps(case)
            bd = be.sum(-1, keepdims=True)
            exact = c * se / d
            hi = np.where(d - bd > 0, c * (se + be) / (d - bd), np.inf)
            lo = c * np.maximum(se - be, 0.0) / (d + bd)
            bound = np.maximum(hi - exact, exact - lo) + (k + 2) * U32 * hi
        else:
            exact = c * se
            bound = c * be + U32 * c * (se + be)
    return exact, np.nan_to_num(bound, nan=np.inf)


@dataclasses.dataclass(frozen=True)
class RouterWeights(Comparator):
    """The router's weights at the impl's own ids, renormalised over the impl's own set: the
    exact c·s_e (/ (Σ_S s + eps) under norm_topk_prob) from the oracle's weight scores, with the
    interval bound of the module docstring from their bounds (the op's `weights` bound)."""

    def judge(self, x: OutputCheck) -> Verdict:
        exact, bound = chosen_weights(x.case, x.exacts["wscore"], x.bound, x.outputs["ids"])
        return Bounded().judge(dataclasses.replace(
            x, exact=exact, ref=round_to(exact, x.dtype), bound=bound))

    def describe(self, m: dict) -> str:
        return Bounded().describe(m)


def _router_domain(case) -> None:
    d, p = case.dims, case.params
    if p["scoring"] not in SCORINGS:
        raise ValueError(f"moe_router: scoring {p['scoring']!r}; valid: {', '.join(SCORINGS)}")
    if not 1 <= d["top_k"] <= d["experts"]:
        raise ValueError(f"moe_router: top_k {d['top_k']} must be in [1, experts={d['experts']}]")
    if d["experts"] % d["groups"]:
        raise ValueError(f"moe_router: groups {d['groups']} must divide experts {d['experts']}")
    if d["groups"] > 1 and p["scoring"] != "sigmoid_bias":
        raise ValueError("moe_router: group-limited selection (groups > 1) is sigmoid_bias's")
    if d["groups"] > 1 and not (1 <= p["topk_group"] <= d["groups"]
                                and p["topk_group"] * d["experts"] // d["groups"] >= d["top_k"]):
        raise ValueError(f"moe_router: topk_group {p['topk_group']} must be in [1, groups="
                         f"{d['groups']}] and keep at least top_k = {d['top_k']} experts")


def _plant_router(inputs: dict, case) -> dict:
    """`hot_expert`: expert E/3 far above the rest in every row (every token routes to it);
    `exact_ties`: in every row the k-th best logit copied into the next three (equal scores: the
    smaller id wins in the oracle; an impl taking another is a flagged near-tie)."""
    l = np.asarray(inputs["logits"], dtype=np.float64).copy()
    if case.dist == "hot_expert":
        l[:, case.dims["experts"] // 3] = np.abs(l).max() + 8.0
    elif case.dist == "exact_ties":
        k = case.dims["top_k"]
        order = np.argsort(-l, axis=-1, kind="stable")
        kth = np.take_along_axis(l, order[:, k - 1:k], -1)
        np.put_along_axis(l, order[:, k:k + 3], kth, -1)
    else:
        return inputs
    return {**inputs, "logits": round_to(l, case.dtype)}


def _bias(shape, dtype, rng, case, drawn):
    """A correction bias of the size DeepSeek-V3's learns (|b| ~ 0.1 against s in (0, 1)), so
    that it changes the choice; zero outside sigmoid_bias (unused there)."""
    if case.params["scoring"] != "sigmoid_bias":
        return np.zeros(shape)
    return rng.normal(0.0, 0.1, shape)


register(OpSpec(
    name="moe_router", family="moe_route", dims=("tokens", "experts", "top_k", "groups"),
    inputs=(TensorSpec("logits", lambda d: (d["tokens"], d["experts"])),
            TensorSpec("correction_bias", lambda d: (d["experts"],), role="f32", init=_bias,
                       adversarial=False)),
    outputs=(TensorSpec("ids", lambda d: (d["tokens"], d["top_k"]), role="i32",
                        comparator=TopKSet(scores="sel")),
             TensorSpec("weights", lambda d: (d["tokens"], d["top_k"]), role="f32",
                        comparator=RouterWeights())),
    oracle=moe_router, tolerance=router_bound, plant=_plant_router, domain=_router_domain,
    bytes=lambda c: (c.dims["tokens"] * c.dims["experts"] * (4 if c.dtype == "f32" else 2)
                     + 4 * c.dims["experts"] + 8 * c.dims["tokens"] * c.dims["top_k"]),
    flops=lambda c: 6 * c.dims["tokens"] * c.dims["experts"],
    params={"scoring": "softmax_topk", "norm_topk_prob": 1, "routed_scaling_factor": 1.0,
            "topk_group": 1},
    param_values={"scoring": SCORINGS, "norm_topk_prob": (0, 1)},
    doc=__doc__, chain_input="logits"))


# --- dispatch: the counting-sort layout ---------------------------------------------------------

def _ids(inputs: dict, case) -> np.ndarray:
    """The flat expert ids e_i, i = t*k + j, checked: in [0, E), distinct within a token."""
    ids = np.asarray(inputs["ids"]).astype(np.int64)
    e = case.dims["experts"]
    if ids.size and (ids.min() < 0 or ids.max() >= e):
        raise ValueError(f"moe_dispatch: ids outside [0, experts={e}): {ids.tolist()}")
    if (np.diff(np.sort(ids, axis=-1), axis=-1) == 0).any():
        raise ValueError(f"moe_dispatch: a token's k ids repeat: {ids.tolist()}")
    return ids.ravel()


def moe_dispatch(inputs: dict, case) -> dict:
    """counts[e] = #{i : e_i = e}; offsets its exclusive prefix sum (E + 1); perm the stable
    argsort of e (sorted position -> flat slot: the counting sort visiting i in order);
    inv_perm its inverse (flat slot -> sorted position)."""
    e = _ids(inputs, case)
    counts = np.bincount(e, minlength=case.dims["experts"])
    perm = np.argsort(e, kind="stable")
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size)
    return {"counts": counts.astype(np.float64),
            "offsets": np.concatenate([[0], np.cumsum(counts)]).astype(np.float64),
            "perm": perm.astype(np.float64), "inv_perm": inv.astype(np.float64)}


def _routed_ids(shape, dtype, rng, case, drawn):
    """Each token's k distinct experts, uniform; under `hot_expert` every token's first is
    expert E/3 (one expert takes T rows, the others few or none)."""
    t, k = shape
    e = case.dims["experts"]
    ids = np.stack([rng.permutation(e)[:k] for _ in range(t)]) if t else np.zeros((0, k))
    if case.dist == "hot_expert" and t:
        hot = e // 3
        for r in range(t):
            row = [x for x in ids[r] if x != hot][:k - 1]
            ids[r] = [hot] + row
    return ids.astype(np.float64)


def _exact(inputs, exact, case) -> dict:
    return {name: 0.0 for name in exact}


def _dispatch_domain(case) -> None:
    if not 1 <= case.dims["top_k"] <= case.dims["experts"]:
        raise ValueError(f"moe_dispatch: top_k {case.dims['top_k']} must be in [1, experts="
                         f"{case.dims['experts']}]")


SLOTS = lambda d: (d["tokens"] * d["top_k"],)  # noqa: E731

register(OpSpec(
    name="moe_dispatch", family="moe_route", dims=("tokens", "experts", "top_k"),
    inputs=(TensorSpec("ids", lambda d: (d["tokens"], d["top_k"]), role="i32",
                       init=_routed_ids, adversarial=False),),
    outputs=(TensorSpec("counts", lambda d: (d["experts"],), role="i32", comparator=Exact()),
             TensorSpec("offsets", lambda d: (d["experts"] + 1,), role="i32",
                        comparator=Exact()),
             TensorSpec("perm", SLOTS, role="i32", comparator=Exact()),
             TensorSpec("inv_perm", SLOTS, role="i32", comparator=Exact())),
    oracle=moe_dispatch, tolerance=_exact, domain=_dispatch_domain,
    bytes=lambda c: 4 * (3 * c.dims["tokens"] * c.dims["top_k"] + 2 * c.dims["experts"] + 1),
    flops=lambda c: 0, doc=moe_dispatch.__doc__, chain_input="ids"))


# --- permute / unpermute --------------------------------------------------------------------------

def _perm(inputs: dict, name: str, n: int) -> np.ndarray:
    p = np.asarray(inputs[name]).astype(np.int64)
    if not np.array_equal(np.sort(p), np.arange(n)):
        raise ValueError(f"{name} is not a permutation of [0, {n}): {p.tolist()}")
    return p


def moe_permute(inputs: dict, case) -> dict:
    """x_sorted[r] = x[perm[r] // k]: each sorted slot's token row, copied."""
    t, k = case.dims["tokens"], case.dims["top_k"]
    perm = _perm(inputs, "perm", t * k)
    return {"x_sorted": np.asarray(inputs["x"], dtype=np.float64)[perm // k]}


def _unpermute_terms(inputs: dict, case) -> np.ndarray:
    """w[t, j] · y_sorted[inv_perm[t*k + j]], float64 [T, k, H]."""
    t, k = case.dims["tokens"], case.dims["top_k"]
    inv = _perm(inputs, "inv_perm", t * k)
    y = np.asarray(inputs["y_sorted"], dtype=np.float64)[inv].reshape(t, k, -1)
    w = np.asarray(inputs["weights"], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return w[:, :, None] * y


def moe_unpermute(inputs: dict, case) -> dict:
    """out[t] = Σ_j w[t, j] · y_sorted[pos(t, j)], pos = inv_perm[t*k + j]: exact, stored once."""
    with np.errstate(invalid="ignore"):
        return {"out": _unpermute_terms(inputs, case).sum(axis=1)}


def _combine_bound(terms: np.ndarray, exact: np.ndarray, case) -> dict:
    """γ_k Σ_j |w_j y_j| (k f32 products and a k-term sum in any order) plus the store's half
    ULP of T."""
    k = case.dims["top_k"]
    with np.errstate(invalid="ignore"):
        f32 = k * U32 / (1 - k * U32) * np.abs(terms).sum(axis=1)
        return {"out": f32 + 0.5 * spacing(np.abs(exact) + f32, case.dtype)}


def unpermute_bound(inputs: dict, exact: dict, case) -> dict:
    return _combine_bound(_unpermute_terms(inputs, case), exact["out"], case)


def _scatter_terms(inputs: dict, case) -> np.ndarray:
    """The unpermute's terms, with inv_perm the inverse of the given perm."""
    perm = _perm(inputs, "perm", case.dims["tokens"] * case.dims["top_k"])
    return _unpermute_terms({**inputs, "inv_perm": np.argsort(perm)}, case)


def moe_scatter_add(inputs: dict, case) -> dict:
    """out[t] = Σ_r [perm[r] // k = t] w.flat[perm[r]] · y_sorted[r]: exact (the declared
    accumulation order is the kernel's, module docstring), stored once."""
    with np.errstate(invalid="ignore"):
        return {"out": _scatter_terms(inputs, case).sum(axis=1)}


def scatter_add_bound(inputs: dict, exact: dict, case) -> dict:
    return _combine_bound(_scatter_terms(inputs, case), exact["out"], case)


def _perm_init(shape, dtype, rng, case, drawn):
    return rng.permutation(shape[0]).astype(np.float64)


def _router_weights(shape, dtype, rng, case, drawn):
    """Positive weights of a router's size (0.05 to 1: softmax / sigmoid top-k weights)."""
    return rng.uniform(0.05, 1.0, shape)


register(OpSpec(
    name="moe_permute", family="moe_route", dims=("tokens", "top_k", "hidden"),
    inputs=(TensorSpec("x", lambda d: (d["tokens"], d["hidden"])),
            TensorSpec("perm", SLOTS, role="i32", init=_perm_init, adversarial=False)),
    outputs=(TensorSpec("x_sorted", lambda d: (d["tokens"] * d["top_k"], d["hidden"]),
                        comparator=Exact()),),
    oracle=moe_permute, tolerance=_exact,
    bytes=lambda c: ((1 + c.dims["top_k"]) * c.dims["tokens"] * c.dims["hidden"]
                     * (4 if c.dtype == "f32" else 2) + 4 * c.dims["tokens"] * c.dims["top_k"]),
    flops=lambda c: 0, doc=moe_permute.__doc__, chain_input="x"))

def _register_combine(name: str, index: str, oracle, tolerance) -> None:
    """`moe_unpermute` and `moe_scatter_add`: the same weighted combine of the sorted rows, read
    through the inverse permutation or visited in the sorted order (`index` names which)."""
    register(OpSpec(
        name=name, family="moe_route", dims=("tokens", "top_k", "hidden"),
        inputs=(TensorSpec("y_sorted", lambda d: (d["tokens"] * d["top_k"], d["hidden"])),
                TensorSpec("weights", lambda d: (d["tokens"], d["top_k"]), role="f32",
                           init=_router_weights, adversarial=False),
                TensorSpec(index, SLOTS, role="i32", init=_perm_init, adversarial=False)),
        outputs=(TensorSpec("out", lambda d: (d["tokens"], d["hidden"])),),
        oracle=oracle, tolerance=tolerance,
        bytes=lambda c: ((1 + c.dims["top_k"]) * c.dims["tokens"] * c.dims["hidden"]
                         * (4 if c.dtype == "f32" else 2) + 8 * c.dims["tokens"] * c.dims["top_k"]),
        flops=lambda c: 2 * c.dims["tokens"] * c.dims["top_k"] * c.dims["hidden"],
        doc=oracle.__doc__, chain_input="y_sorted"))


_register_combine("moe_unpermute", "inv_perm", moe_unpermute, unpermute_bound)
_register_combine("moe_scatter_add", "perm", moe_scatter_add, scatter_add_bound)
