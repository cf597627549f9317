"""The corners every bound must pass, and the terms it cannot lose (issue 34).

For every registered op with a kernel model (`OpSpec.kernel`), every activation dtype, every
rounding contract and three declared reductions (any order, sequential, 32 lanes), on inputs built
to hit the corners (long rows of same-sign terms, tiny and subnormal values and intermediates,
constant rows, outliers, eps = 0, the issue's own examples):

* the **correctly rounded answer** (exact math, one round-to-nearest-even at each declared
  rounding point: `OpSpec.reference`) has budget <= 1;
* the **worst admissible kernel** a greedy search finds (`oracle.numerics.Worst`: every f32
  rounding charged its full error, in the direction the search picks per rounding site; sums in
  the declared order; the association and form the contract admits) has budget <= 1;
* with any one term of the bound shrunk by 10 % (`Model.shrink`), one of them fails: the bound has
  no term a correct kernel cannot use.

A new op gets all of this by declaring `kernel` (docs/adding-an-op.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from cases.generate import gate_cases
from cases.model import Case, make_inputs
from oracle.dtypes import FLOAT_DTYPES, round_to, storage_dtype
from oracle.numerics import DEFAULT, SEQUENTIAL, Bounds, Choices, Model, Numerics, Worst, lanes
from oracle.spec import registry

NUMERICS = {"any": DEFAULT, "sequential": Numerics(SEQUENTIAL), "lanes32": Numerics(lanes(32))}
TERMS = ("round", "sum", "func", "sub", "store")
MODELLED = sorted(name for name, spec in registry().items() if spec.kernel is not None)
GEMVS = [op for op in MODELLED if registry()[op].family == "quant_gemv"]


def _store(dtype, values):
    return round_to(values, dtype).astype(storage_dtype(dtype))


# --- corner inputs ---------------------------------------------------------------------------

LONG = {"rows": 2, "n": 4096}
GEMV_DIMS = {"out": 8, "in": 4096, "bits": 4, "group_size": 64}
DIMS = {"rms_norm": LONG, "rms_norm_residual": LONG, "add_rms_norm": LONG, "rms_inv": LONG,
        "gated_mixer_norm": LONG, "silu_mul": LONG,
        "rms_norm_per_head": {"batch": 1, "tokens": 2, "heads": 4, "head_dim": 256},
        "dequant_gemv": GEMV_DIMS, "rms_norm_qgemv": GEMV_DIMS,
        "qmm": {"m": 3, **GEMV_DIMS, "out": 8},
        "dequant_gemv_expert_indexed": {"experts": 2, **GEMV_DIMS, "out": 8},
        # attention: one sequence (each adds its rounding sites to the greedy search)
        "sdpa_decode": {"batch": 1, "heads": 4, "kv_heads": 2, "head_dim": 64, "max_len": 40},
        "sdpa_decode_paged": {"batch": 1, "heads": 4, "kv_heads": 2, "head_dim": 64,
                              "page_size": 16, "max_pages": 3, "num_pages": 5},
        "attn_combine": {"batch": 2, "heads": 4, "splits": 5, "head_dim": 64},
        "sdpa_prefill_varlen": {"heads": 4, "kv_heads": 2, "head_dim": 64},  # lens: default
        # Gated DeltaNet's decode step: GQA heads, a 64-term dot (its state is V x K per head)
        "gdn_step": {"batch": 2, "heads_k": 1, "heads_v": 2, "dim_k": 64, "dim_v": 8},
        "gdn_step_prep": {"batch": 2, "heads_k": 1, "heads_v": 2, "dim_k": 64, "dim_v": 8},
        # Mamba-2: the conv at W 4 over a channel count no multiple of 4 (prefill: 6 tokens,
        # past the state); the gated norm in Nemotron-H's groups of 512
        "conv1d_causal": {"batch": 1, "tokens": 6, "channels": 37, "width": 4},
        "conv1d_causal_step": {"batch": 2, "channels": 37, "width": 4},
        "gated_group_rmsnorm": {"rows": 2, "dim": 4096, "groups": 8},
        # the chunked GDN stages: one chunk of 64, padded past T = 35
        **{op: {"batch": 1, "tokens": 35, "heads_k": 1, "heads_v": 1, "dim_k": 4, "dim_v": 4}
           for op in ("gdn_chunk_cumsum", "gdn_kkt", "gdn_wy", "gdn_chunk_o")},
        # the Mamba-2 scans: a few tokens (each token adds its rounding sites to the search),
        # two heads of one group, a 16-term dot S·C
        **{op: {"batch": 1, "tokens": 3, "heads": 2, "dim_p": 2, "groups": 1, "dim_n": 16}
           for op in ("ssd_scan", "ssd_chunked")},
        "ssd_scan_varlen": {"heads": 2, "dim_p": 2, "groups": 1, "dim_n": 16},  # segments (2, 1)
        "ssm_step": {"batch": 2, "heads": 2, "dim_p": 2, "groups": 1, "dim_n": 16},
        # MoE: two experts' segments (3 + 2 rows), a 64-term dot (one affine4 group)
        "moe_grouped_gemm": {"rows": 5, "experts": 2, "in": 64, "out": 4},
        "moe_experts": {"rows": 5, "experts": 2, "hidden": 16, "inter": 8},
        # FP4 GEMV: one row, a 256-term dot (16 NVFP4 blocks, 8 MXFP4 ones)
        "fp4_gemv": {"m": 1, "out": 4, "in": 256}}


def _dims(op: str) -> dict:
    """The op's corner dims: `DIMS`, or else its largest normal-data gate case of at most 2^16
    elements per output (so a new op is covered without editing this file)."""
    if op in DIMS:
        return DIMS[op]
    cases = [c for c in gate_cases(op) if c.dist == "normal"]

    def size(c):
        return max(int(np.prod(t.shape_of(c))) for t in c.spec.outputs)
    small = [c for c in cases if size(c) <= 1 << 16] or cases
    return max(small, key=size).dims


def _variants(op: str, dtype: str):
    """(label, case) for the generated corners of `op`: distributions x contracts x eps."""
    spec = registry()[op]
    contract = next((p for p in ("rounding", "cast") if p in spec.params), None)
    roundings = spec.param_values[contract] if contract else (None,)
    for dist in ("normal", "tiny", "constant_rows", "outlier_rows"):
        for rounding in roundings:
            params = {contract: rounding} if rounding else {}
            yield f"{dist} {rounding or ''}", Case.make(op, _dims(op), dtype, dist, seed=3,
                                                        params=params)
            if "eps" in spec.params and dist == "normal":
                yield f"eps=0 {rounding or ''}", Case.make(op, _dims(op), dtype, dist, seed=3,
                                                           params={**params, "eps": 0.0})


def _subnormal_rows(case: Case, inputs: dict) -> dict:
    """Issue 34's rows: large values beside one deep in the subnormal range (x*inv, x*w and the
    products subnormal), a row with a per-element dynamic range of 2^-140 to 2^10."""
    x = np.asarray(inputs["x"]).astype(np.float64).copy()
    x[0, :] = 100.0
    x[0, -1] = 1.6344787e-39
    rng = np.random.default_rng(5)
    x[1] = rng.choice([-1, 1], x.shape[1]) * np.exp2(rng.uniform(-140, 10, x.shape[1]))
    return {**inputs, "x": _store(case.dtype, x),
            "w": _store(case.dtype, np.full(inputs["w"].shape, 1.6953843))}


def _same_sign(case: Case, inputs: dict) -> dict:
    """Issue 34's GEMV row: every code at the maximum, positive scales and biases, x = 1/sqrt(in):
    every term of every sum has one sign and one size (the sequential sum's worst case)."""
    x_name = "x"
    out = dict(inputs)
    out["w"] = np.full_like(inputs["w"], 0xFFFFFFFF)
    out["scales"] = _store(case.dtype, np.abs(np.asarray(inputs["scales"]).astype(np.float64)))
    out["biases"] = _store(case.dtype, np.abs(np.asarray(inputs["biases"]).astype(np.float64)))
    n = case.dims["in"]
    out[x_name] = _store(case.dtype, np.full(np.shape(inputs[x_name]), 1.0 / np.sqrt(n)))
    if "norm_weight" in out:
        out["norm_weight"] = _store(case.dtype, np.ones(np.shape(inputs["norm_weight"])))
    return out


def _attention_inputs(case: Case, q, k, v) -> dict:
    """`sdpa_decode` inputs with q, k, v replaced (broadcast over batch and heads)."""
    inputs = make_inputs(case)
    return {**inputs, **{name: _store(case.dtype, np.broadcast_to(a, np.shape(inputs[name])))
                         for name, a in (("q", q), ("k", k), ("v", v))}}


def _attention_corners(dtype: str):
    """`sdpa_decode`'s targeted corners (f32 outputs: no store rounding to hide the others).

    * subnormal P·V: q = 0 (40 equal weights) and every v in [2^-141, 2^-140]: each w_t v_t
      and each partial sum of P·V is subnormal, so the output's error is their roundings.
    * cancelling long dot: head_dim 256, q = 1 and key 0 = +100 on its first half, -100 on
      its second (1 % jitter), its last element setting the score to 4: the sequential
      partial sums reach ~13000 while the score is 4, so the dot's additions make its error;
      key 1 = 0 (score 0), v = +1 and -1: key 1's weight e^-4 carries that error into the
      output, with the opposite sign to it (out 0.96), so nothing cancels."""
    if dtype != "f32":
        return
    rng = np.random.default_rng(6)
    case = Case.make("sdpa_decode", DIMS["sdpa_decode"], dtype, "normal", seed=4)
    v = np.exp2(rng.uniform(-141, -140, (1, 2, case.dims["max_len"], case.dims["head_dim"])))
    yield "subnormal P·V", case, _attention_inputs(case, 0.0, rng.standard_normal(v.shape), v)
    dims = {**DIMS["sdpa_decode"], "head_dim": 256, "max_len": 2}
    case = Case.make("sdpa_decode", dims, dtype, "normal", seed=4)
    half = np.full(128, 100.0)
    key = np.concatenate([half, -half]) * rng.uniform(0.99, 1.01, 256)
    key[-1] += 4.0 * 16 - key.sum()  # scale 1/16: score 4
    k, v = np.zeros((2, 256)), np.ones((2, 256))
    k[0], v[1] = key, -1.0
    yield "cancelling long dot", case, _attention_inputs(case, 1.0, k, v)


def _conv_corners(op: str, dtype: str):
    """The conv's sum without the silu (f32 output: no store to hide it): tiny inputs and no
    bias (every product and partial sum subnormal), and same-sign terms (x, w and the bias
    positive, of one size: the additions' worst case)."""
    for label, dist, bias in (("tiny no bias", "tiny", False), ("same-sign", "normal", True)):
        case = Case.make(op, _dims(op), dtype, dist, seed=4,
                         params={"silu": False, "bias": bias, "initial_state": "given"})
        inputs = make_inputs(case)
        if label == "same-sign":
            inputs = {k: _store(dtype, np.abs(np.asarray(v).astype(np.float64)))
                      for k, v in inputs.items()}
        yield label, case, inputs


def corners(op: str, dtype: str):
    """(label, case, inputs) for every corner of `op` at `dtype`: the targeted ones first (the
    shrink test stops at the first that fails), then the generated distributions."""
    yield from _targeted(op, dtype)
    for label, case in _variants(op, dtype):
        yield label, case, make_inputs(case)


def _targeted(op: str, dtype: str):
    if op in ("moe_grouped_gemm", "moe_experts"):  # the non-default weight form / activation
        params = {"weights": "affine4"} if op == "moe_grouped_gemm" else {"act": "silu_mul"}
        for dist in ("normal", "tiny", "outlier_rows"):
            case = Case.make(op, _dims(op), dtype, dist, seed=4, params=params)
            yield f"{dist} {params}", case, make_inputs(case)
    if op in ("rms_norm", "rms_norm_residual", "gated_mixer_norm", "add_rms_norm"):
        for rounding in (("once", "normed") if op == "rms_norm" else (None,)):
            params = {"eps": 0.0, **({"rounding": rounding} if rounding else {})}
            case = Case.make(op, LONG, dtype, "normal", seed=4, params=params)
            inputs = make_inputs(case)
            if "x" in inputs and "w" in inputs:
                yield f"subnormal rows {rounding or ''}", case, _subnormal_rows(case, inputs)
    if op == "silu_mul":  # HF's convention: silu rounded to T before the product
        for dist in ("normal", "tiny", "outlier_rows"):
            case = Case.make(op, LONG, dtype, dist, seed=4, params={"rounding": "act"})
            yield f"{dist} rounding=act", case, make_inputs(case)
    if op == "rms_norm_qgemv":  # a short row: the norm's rsqrt and divide weigh most
        dims = {**_dims(op), "bits": 8, "group_size": 32, "in": 32, "out": 4}
        case = Case.make(op, dims, dtype, "normal", seed=4)
        yield "short same-sign row", case, _same_sign(case, make_inputs(case))
    if op in GEMVS:
        dims = {**_dims(op), "bits": 2, "group_size": 128, "in": 1536, "out": 33}
        case = Case.make(op, dims, dtype, "normal", seed=4)
        yield "same-sign terms", case, _same_sign(case, make_inputs(case))
    if op == "qmm":  # a K of 2 whole steps and 2 of 8 chunks (kp_qmm's partial step: SmolLM2)
        case = Case.make(op, {**DIMS[op], "in": 576}, dtype, "normal", seed=4)
        yield "partial K step", case, make_inputs(case)
        yield "partial K step, same-sign terms", case, _same_sign(case, make_inputs(case))
    if op == "rope":  # the model's other forms: YaRN's factor (f32 and T), T with llama3, gptj
        dims = {"heads_q": 4, "heads_kv": 2, "head_dim": 64}
        yarn = {"scaling": "yarn", "factor": 32.0, "original_max_position": 4096,
                "theta": 150000.0, "truncate": 0}
        for label, params in (("yarn f32", yarn), ("yarn T", {**yarn, "compute": "T"}),
                              ("llama3 T gptj partial", {
                                  "compute": "T", "scaling": "llama3", "factor": 8.0,
                                  "theta": 500000.0, "pairing": "gptj", "rotary_dim": 32})):
            case = Case.make(op, dims, dtype, "normal", seed=4, params=params)
            yield label, case, make_inputs(case)
    if op == "sdpa_decode":
        yield from _attention_corners(dtype)
    if op in ("conv1d_causal", "conv1d_causal_step"):
        yield from _conv_corners(op, dtype)
    if op == "rms_norm" and dtype == "bf16":  # issue 34's failing gate-shaped case, seed 11
        case = Case.make("rms_norm", {"rows": 7, "n": 4096}, "bf16", "normal", seed=11,
                         params={"eps": 1e-6, "rounding": "normed"})
        yield "issue 34 seed 11", case, make_inputs(case)


# --- budgets -----------------------------------------------------------------------------------

def _budget(values: dict, exact: dict, bound: dict) -> float:
    worst = 0.0
    for name, out in values.items():
        out = np.asarray(out, dtype=np.float64)
        ok = np.isfinite(exact[name]) & np.isfinite(out)
        with np.errstate(invalid="ignore", divide="ignore"):
            err = np.abs(out - exact[name])
            ratio = np.where(err == 0, 0.0, err / bound[name])
        worst = max(worst, float(np.max(ratio[ok], initial=0.0)))
    return worst


def _worst_kernel(case: Case, inputs: dict, exact: dict, bound: dict, numerics: Numerics):
    """(budget, choices) of the worst admissible kernel a greedy search finds: the association
    and form first, then each rounding site's direction flipped where that raises the budget."""
    spec = case.spec

    def budget(choices: Choices) -> float:
        arith = Worst(Model(bool(case.params.get("ftz")), numerics), choices)
        with np.errstate(all="ignore"):
            values = spec.kernel(arith, inputs, case)
            outs = {t.name: arith.store(values[t.name], t.dtype(case)) for t in spec.outputs}
        return _budget(outs, exact, bound)

    best, choices = max(((budget(c), c) for c in (Choices(assoc=a, form=f)
                                                  for a in range(3) for f in range(2))),
                        key=lambda bc: bc[0])
    for site in range(choices.sites):
        trial = Choices(choices.flips ^ {site}, choices.assoc, choices.form)
        b = budget(trial)
        if b > best:
            best, choices = b, trial
    return best, choices


def _candidates(case: Case, inputs: dict, exact: dict, bound: dict, numerics: Numerics):
    """(name, budget) of the correctly rounded answer and the worst admissible kernel found."""
    rounded = case.spec.reference(inputs, case)[1]
    yield "correctly rounded", _budget({k: v.astype(np.float64) for k, v in rounded.items()},
                                       exact, bound)
    budget, choices = _worst_kernel(case, inputs, exact, bound, numerics)
    yield (f"worst kernel (flips {sorted(choices.flips)}, assoc {choices.assoc}, form "
           f"{choices.form})"), budget


def _bound(case: Case, inputs: dict, exact: dict, numerics: Numerics, shrink=None) -> dict:
    spec = case.spec
    arith = Bounds(Model(bool(case.params.get("ftz")), numerics, shrink or {}))
    with np.errstate(all="ignore"):
        values = spec.kernel(arith, inputs, case)
        return {t.name: arith.store(values[t.name], t.dtype(case)) for t in spec.outputs}


def _over_budget(corner_cases, orders=tuple(NUMERICS)) -> list[str]:
    """Each (corner, declared order, candidate) whose budget exceeds 1, as a line."""
    failures = []
    for label, case, inputs in corner_cases:
        exact = case.spec.reference(inputs, case)[0]
        for nname in orders:
            numerics = NUMERICS[nname]
            bound = _bound(case, inputs, exact, numerics)
            for name, budget in _candidates(case, inputs, exact, bound, numerics):
                if not budget <= 1.0:
                    failures.append(f"{label} [{nname}] {name}: budget {budget:.4f} "
                                    f"({case.to_json()})")
    return failures


# lanes(32): declared by test mutants only (tests/mutants.py), so its corners run nightly; the
# orders kparity's kernels declare (any, sequential; their plans: tests/test_reduction_plan.py)
# run on every commit
ORDERS = [("any", "sequential"), pytest.param(("lanes32",), marks=pytest.mark.nightly,
                                              id="lanes32")]


@pytest.mark.parametrize("orders", ORDERS, ids=lambda o: "+".join(o))
@pytest.mark.parametrize("op", MODELLED)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_correct_and_worst_admissible_kernels_pass(op, dtype, orders):
    failures = _over_budget(corners(op, dtype), orders)
    assert not failures, "\n".join(failures[:8])


def _max_budget_shrunk(ops, term: str) -> tuple[float, str]:
    best, where = 0.0, ""
    for op in ops:
        for dtype in FLOAT_DTYPES:
            for label, case, inputs in corners(op, dtype):
                exact = case.spec.reference(inputs, case)[0]
                for nname, numerics in NUMERICS.items():
                    bound = _bound(case, inputs, exact, numerics, {term: 0.9})
                    for name, budget in _candidates(case, inputs, exact, bound, numerics):
                        if budget > best:
                            best, where = budget, f"{op} {dtype} {label} [{nname}] {name}"
                        if best > 1.0:
                            return best, where
    return best, where


# Every family with a kernel model, from the registry (an op a plugin adds joins its family's
# test, or makes a new one). `FIRST` only orders a family's ops, the op that binds the most terms
# first (the search stops at the first corner over budget): the fused norm (its short row is
# where the function ULPs weigh most), chunk_o among the GDN stages, the cheapest Mamba-2 scans.
# sdpa_decode binds sum, sub (its targeted corners) and store; round and func bind in
# attn_combine (its lse: the exp and log ULPs, the add), not in sdpa (max 1.0000 over its
# corners with either shrunk): the search's kernel has one direction per rounding site, so the
# exps' errors and the rescale factor 1 +- r_R scale every weight alike and cancel in acc / l,
# which the bound (rightly: a real exp errs either way per key) charges. They outweigh the
# score's round charges at every logit range where e^x stays normal: the best round corner
# found (head_dim 1, scores 86 and 0) reaches 0.979 shrunk.
FIRST = ("rms_norm_qgemv", "gdn_chunk_o", "attn_combine", "ssm_step", "ssd_scan")


def _families() -> dict[str, list[str]]:
    by_family: dict[str, list[str]] = {}
    for op in MODELLED:
        by_family.setdefault(registry()[op].family, []).append(op)
    rank = {op: i for i, op in enumerate(FIRST)}
    return {f: sorted(ops, key=lambda op: rank.get(op, len(FIRST)))
            for f, ops in sorted(by_family.items())}


FAMILIES = _families()
# (family, term) pairs whose term charges something on the family's corners yet binds on none of
# them, each with why (a term a family's kernel models never charge is found, not listed:
# `_charges_nothing`):
EXEMPT = {
    # charged (a few partial sums pass near 0) but never binding: E2M1 codes times its
    # quantizer's block scales keep every product and partial sum of its corners normal
    ("fp4", "sub"): "its corners' subnormal charges never bind",
    # a gap, not a reason: moe_experts' activation (silu's exp) is never the binding term on
    # its corners (max 0.99999944 with "func" shrunk); a corner that isolates it is to be built
    ("moe", "func"): "not shown: no corner of moe_experts isolates its activation's exp",
}


def _charges_nothing(ops, term: str) -> bool:
    """Whether the bound of every corner of `ops` is the same with `term` at 0: the kernel
    models have no such rounding there (no sum in an elementwise op, no function in a lookup,
    no result in the subnormal range of a lookup's corners)."""
    for op in ops:
        for dtype in FLOAT_DTYPES:
            for _, case, inputs in corners(op, dtype):
                exact = case.spec.reference(inputs, case)[0]
                for numerics in NUMERICS.values():
                    full = _bound(case, inputs, exact, numerics)
                    cut = _bound(case, inputs, exact, numerics, {term: 0.0})
                    if any(not np.array_equal(full[k], cut[k]) for k in full):
                        return False
    return True


@pytest.mark.parametrize("family, term", [(f, t) for f in FAMILIES for t in TERMS
                                          if (f, t) not in EXEMPT])
def test_every_bound_term_is_needed(family, term):
    """Shrink one term of the bound by 10 %: a correct or worst admissible kernel then fails
    on some corner. (`sub`: the subnormal charges; `store`: T's rounding at the store.) A term
    the family's kernel models never charge is reported as a skip, with why."""
    ops = FAMILIES[family]
    if _charges_nothing(ops, term):
        pytest.skip(f"{family}: its kernel models charge no {term!r} term on its corners (every "
                    f"bound the same with it at 0)")
    budget, where = _max_budget_shrunk(ops, term)
    assert budget > 1.0, f"{term} shrunk by 10 %: nothing fails (max budget {budget:.4f} at {where})"


# --- under flush-to-zero (CuPy compiles every kernel with -ftz) -------------------------------

# The ops with FTZ corners: every op with a kernel model and the `ftz` param (from the registry:
# an op a plugin adds is covered). Two defects this test found (2026-11-26), both fixed: the
# bound took |low| for a magnitude's lower end, so a partial sum whose interval reached below 0
# was never charged its possible flush (attn_combine f32 sequential, budget 4610; sdpa_decode
# 10.1); and the emulated worst kernel "flushed" a subnormal result to 2v instead of 0 (rope bf16
# 1.94, an inadmissible kernel: `Adverse._r`).
FTZ_OPS = [op for op in MODELLED if "ftz" in registry()[op].params]


def _ftz_corners(op: str, dtype: str):
    """The corners whose values reach the subnormal range, with param ftz=1: inputs below
    2^-126 read as 0 and every f32 result there may flush (`oracle.numerics.Model.ftz`)."""
    for label, case, inputs in corners(op, dtype):
        if "tiny" in label or "subnormal" in label:
            yield f"{label} ftz", case.replace(ftz=1), inputs


@pytest.mark.parametrize("orders", ORDERS, ids=lambda o: "+".join(o))
@pytest.mark.parametrize("op", FTZ_OPS)
def test_under_ftz_correct_and_worst_admissible_kernels_pass(op, orders):
    """The FTZ charges (a result whose interval straddles 2^-126, a sum's partial that may
    cancel below it: found by the H100 gate's tiny cases) keep both corners within budget
    (the commit tier: the orders kparity's kernels declare; lanes32 nightly, as above)."""
    failures = [f"{op} {dtype} {f}" for dtype in FLOAT_DTYPES
                for f in _over_budget(_ftz_corners(op, dtype), orders)]
    assert not failures, "\n".join(failures[:8])



# --- the orders kparity's own kernels declare (`Impl.numerics`: plans, forms, overflow) ----------

def _declaring_impls() -> list[str]:
    import gpu_impls

    return sorted(i.id for i in gpu_impls.impls().values()
                  if i.id.startswith("cuda:kp_") and i.declares_order and i.op in MODELLED)


def _admitted_corners(impl, dtype: str):
    """The op's corners the impl's contract admits; where it admits none (kp_ssm_step: N a
    multiple of 32), its cheapest admitted gate case of each distribution instead."""
    from cases.generate import gate_cases
    from cases.tiers import case_cost

    admitted = [c for c in corners(impl.op, dtype) if impl.contract.admits(c[1])]
    if admitted:
        yield from admitted
        return
    cheapest = {}
    for case in gate_cases(impl.op):
        if case.dtype == dtype and impl.contract.admits(case):
            key = (case.dist, repr(case.param_items))
            if key not in cheapest or case_cost(case) < case_cost(cheapest[key]):
                cheapest[key] = case
    for case in cheapest.values():
        yield f"gate {case.dist}", case, make_inputs(case)


@pytest.mark.parametrize("impl_id", _declaring_impls())
def test_declared_orders_keep_the_correct_and_worst_kernels_within_bound(impl_id):
    """For each corner of its op that the impl's contract admits, the bound under what the impl
    declares for that case (its plans, its form, its overflow: the oracle case the runner would
    use) holds the correctly rounded answer and the worst admissible kernel in that order."""
    import gpu_impls
    from runners.oracle_cache import _oracle_case

    impl = gpu_impls.impls()[impl_id]
    failures, checked = [], 0
    for dtype in FLOAT_DTYPES:
        for label, case, inputs in _admitted_corners(impl, dtype):
            numerics = impl.numerics_for(case)
            judged = _oracle_case(case, False, numerics)
            exact = judged.spec.reference(inputs, judged)[0]
            bound = _bound(judged, inputs, exact, numerics)
            for name, budget in _candidates(judged, inputs, exact, bound, numerics):
                if not budget <= 1.0:
                    failures.append(f"{label} {dtype} {name}: budget {budget:.4f} "
                                    f"({case.to_json()})")
            checked += 1
    assert checked, f"no corner of {impl.op} is admitted by {impl_id}"
    assert not failures, "\n".join(failures[:8])


# --- one answer (`Numerics.one_answer`, oracle/emulated.py) --------------------------------------

def _one_answer_impls() -> list[str]:
    """The impls whose declaration reads as one answer on their own gate cases."""
    import gpu_impls
    from cases.generate import valid_cases

    out = []
    for impl_id in _declaring_impls():
        impl = gpu_impls.impls()[impl_id]
        case = next(iter(valid_cases(impl)), None)
        if case is not None and impl.numerics_for(case).one_answer:
            out.append(impl_id)
    return out


@pytest.mark.parametrize("impl_id", _one_answer_impls())
def test_one_answer_is_an_admissible_kernel_and_its_bound_bites(impl_id):
    """On every admitted corner (midpoints, binade edges, subnormals, same-sign sums): the one
    answer passes its own bound and lies within the interval of every kernel of the same
    declaration (it is one of them: the two models agree), and the answer off by 4 ULPs of T
    (scaled by 1 + 4 eps_T) fails the one-answer bound on some corner. The correctly rounded
    answer is not held to it: one answer admits the declared kernel's result alone."""
    import gpu_impls
    from oracle.dtypes import eps
    from oracle.emulated import Emulated
    from oracle.numerics import model_for
    from runners.oracle_cache import _oracle_case

    impl = gpu_impls.impls()[impl_id]
    failures, checked, bitten = [], 0, 0
    for dtype in FLOAT_DTYPES:
        for label, case, inputs in _admitted_corners(impl, dtype):
            numerics = impl.numerics_for(case)
            judged = _oracle_case(case, False, numerics)
            exact = judged.spec.reference(inputs, judged)[0]
            one = judged.spec.bounds(inputs, exact, judged, numerics)
            interval = _bound(judged, inputs, exact, numerics)
            with np.errstate(all="ignore"):
                y = judged.spec.kernel(Emulated(model_for(judged, numerics)), inputs, judged)
            answer = {t.name: round_to(y[t.name].x, t.dtype(judged)).astype(np.float64)
                      for t in judged.spec.outputs}
            for name, bound in (("its one-answer bound", one), ("the interval", interval)):
                budget = _budget(answer, exact, bound)
                if not budget <= 1.0:
                    failures.append(f"{label} {dtype}: the answer's budget under {name} "
                                    f"{budget:.4f} ({case.to_json()})")
            off = {name: a * (1 + 4 * eps(dtype)) for name, a in answer.items()}
            bitten += _budget(off, exact, one) > 1.0
            checked += 1
    assert checked, f"no corner of {impl.op} is admitted by {impl_id}"
    assert not failures, "\n".join(failures[:8])
    assert bitten, f"{impl_id}: the answer off by 4 ULPs passed every corner ({checked})"
