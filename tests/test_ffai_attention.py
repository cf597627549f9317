"""The FFAI decode-attention ports (`gpu_impls/cuda/ffai_attention.py`) on CPU: their contracts'
specific rules, and an f32 NumPy mirror of the kernels' algorithm (the same key walk, online
softmax, partials and combine as `kernels/ffai_sdpa_decode*.cu`) run through `check` on the
torch backend, with the CUDA impls' own contracts and declared numerics: the algorithm and the
bound it is judged by agree before a GPU ever runs it, and each mutant's bug goes red on a case
the GPU gate's mutant test (tests/test_gpu.py) selects for it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gpu_impls
from cases.generate import Work, gate_cases, plan
from cases.model import Case
from gpu_impls.contract import ContractError
from gpu_impls.cuda.ffai_attention import block_count, recommended_blocks
from oracle.attention import scale_of
from oracle.dtypes import round_to
from runners.correctness import check

ALL = gpu_impls.impls()
NEG_INF = np.float32(-np.inf)


# --- contracts ------------------------------------------------------------------------------

def test_seed_block_count_branches():
    """`recommended_blocks_m5_max`'s n_kv branches, at their edges; a window bounds the keys."""
    assert [recommended_blocks(n) for n in (1, 1024, 1025, 8192, 8193, 32768, 32769, 65536,
                                            65537, 131072)] == \
        [64, 64, 128, 128, 256, 256, 512, 512, 1024, 1024]
    dims = {"max_len": 131072}
    assert block_count(dims, {"window": 128, "sink_end": 4, "splits": 0}) == 64
    assert block_count(dims, {"window": 0, "sink_end": 0, "splits": 0}) == 1024
    assert block_count(dims, {"window": 0, "sink_end": 0, "splits": 96}) == 96


def _two_pass_case(**params) -> Case:
    return Case.make("sdpa_decode", {"batch": 2, "heads": 8, "kv_heads": 2, "head_dim": 64,
                                     "max_len": 40}, "bf16", params={"probs": "T", **params})


def test_two_pass_blocks_not_a_multiple_of_32_is_rejected_before_launch():
    """splits=48: pass 2 would read one group of 32 and drop partials 32..47; rejected, naming
    pass 2's invariant and the nearest counts. Multiples of 32 and the seed's count pass."""
    impl = ALL["cuda:sdpa_decode_2pass"]
    with pytest.raises(ContractError) as info:
        impl.contract.check(impl.id, _two_pass_case(splits=48))
    e = info.value
    assert (e.launch, e.invariant) == ("pass2", "pass2: blocks % 32 == 0")
    assert "silently dropped" in str(e) and e.fix == "splits = 32 or 64 (a multiple of 32), " \
                                                    "or 0 (the seed's count)"
    for splits, blocks in ((0, 64), (32, 32), (96, 96)):
        launch = impl.contract.check(impl.id, _two_pass_case(splits=splits))
        assert launch["pass1"].grid == (2, blocks, 2) and launch["pass1"].block == (32, 4, 1)
        assert launch["pass2"].grid == (8, 2, 1) and launch["pass2"].block == (1024, 1, 1)


def test_single_pass_head_dim_fix_names_the_variant():
    """A head size another variant serves is pointed at that variant; one none serves at all."""
    impl = ALL["cuda:ffai_sdpa_decode"]
    case = _two_pass_case()
    for dim, fix in ((96, "cuda:ffai_sdpa_decode_d96"), (64, "cuda:ffai_sdpa_decode_d64"),
                     (80, "head_dim in (64, 96, 128, 256)")):
        with pytest.raises(ContractError) as info:
            impl.contract.check(impl.id, case.replace(head_dim=dim))
        assert info.value.invariant == "head_dim == 128" and fix in info.value.fix
    assert ALL["cuda:ffai_sdpa_decode_d64"].contract.admits(case)
    assert ALL["cuda:ffai_sdpa_decode_d64"].contract.admits(case.replace(probs="f32"))


def test_combine_takes_unnormalised_partials_in_t_only():
    impl = ALL["cuda:sdpa_decode_2pass_pass2"]
    case = Case.make("attn_combine", {"batch": 1, "heads": 2, "splits": 32, "head_dim": 64},
                     "bf16", dtypes={"partial": "bf16"})
    assert impl.contract.admits(case)
    for bad, invariant in ((case.replace(dtypes={"partial": "f32"}), "partial dtype == dtype"),
                           (case.replace(normalized=1), "normalized == 0"),
                           (case.replace(splits=40), "splits % 32 == 0")):
        with pytest.raises(ContractError) as info:
            impl.contract.check(impl.id, bad)
        assert info.value.invariant == invariant


# --- the kernels' algorithm in f32 NumPy ----------------------------------------------------

def _exp(x: np.ndarray) -> np.ndarray:
    """f32 exp correctly rounded (CUDA's expf is within 2 ULPs: the bound charges that)."""
    return np.exp(x.astype(np.float64)).astype(np.float32)


def attended_keys(n: int, window: int, sink_end: int, off_by_one: bool) -> np.ndarray:
    """ffai_attention.cuh `visible` + `key_at`: the attended positions in walk order."""
    if window <= 0:
        return np.arange(n)
    start = max(n - window - int(off_by_one), 0)
    return np.concatenate([np.arange(min(max(sink_end, 0), start)), np.arange(start, n)])


def combine(o, m, l, sink, no_rescale: bool):
    """The final combine of both kernels: parts o [S, H, D], m, l [S, H] (f32), sink [H]."""
    top = np.fmax(np.fmax.reduce(m, axis=0), sink)
    base = np.where(top == NEG_INF, np.float32(0), top)
    c = np.ones_like(m) if no_rescale else _exp(m - base)
    total = (c * l).sum(axis=0, dtype=np.float32) + _exp(sink - base)
    return (c[..., None] * o).sum(axis=0, dtype=np.float32) / total[:, None], top, total


def emulate_decode(inputs, case, splits: int, partials_in_t: bool, bugs=frozenset()):
    """out [B, Hq, D] (f32) as the kernels compute it: query head h reads kv head h // G; split
    j (a warp of the single pass, a block of pass 1) takes the attended keys j, j + splits, ...
    one online-softmax step each; its partial o rounded to T where `partials_in_t`; then the
    combine with the sink. `bugs`: the mutants' (gqa_modulo, window_off_by_one, drop_sink,
    no_rescale)."""
    d, p = case.dims, case.params
    q, k, v = (np.asarray(inputs[n]).astype(np.float32) for n in ("q", "k", "v"))
    heads, group = d["heads"], d["heads"] // d["kv_heads"]
    kv_of = np.arange(heads) % d["kv_heads"] if "gqa_modulo" in bugs \
        else np.arange(heads) // group
    sink = np.asarray(inputs["sinks"]).astype(np.float32) \
        if p["sinks"] and "drop_sink" not in bugs else np.full(heads, NEG_INF)
    out = np.empty((d["batch"], heads, d["head_dim"]), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # nonfinite cases: IEEE, as the kernel
        for b, n in enumerate(np.asarray(inputs["lengths"])):
            out[b] = _sequence(q[b], k[b], v[b], int(n), kv_of, sink, case, splits,
                               partials_in_t, bugs)
    return out


def _sequence(q, k, v, n: int, kv_of, sink, case, splits: int, partials_in_t: bool, bugs):
    """`emulate_decode` of one sequence: q [Hq, D], k, v [Hkv, L, D] -> [Hq, D]."""
    p, heads, dim = case.params, len(kv_of), q.shape[-1]
    keys = attended_keys(n, p["window"], p["sink_end"], "window_off_by_one" in bugs)
    qs = q * np.float32(scale_of(case))
    kk, vv = k[kv_of], v[kv_of]  # [Hq, L, D]
    m = np.full((splits, heads), NEG_INF)
    l = np.zeros((splits, heads), np.float32)
    o = np.zeros((splits, heads, dim), np.float32)
    for j in range(splits):
        for t in keys[j::splits]:
            s = np.einsum("hd,hd->h", qs, kk[:, t])
            m_new = np.fmax(m[j], s)
            base = np.where(m_new == NEG_INF, np.float32(0), m_new)
            alpha, w = _exp(m[j] - base), _exp(s - base)
            l[j] = l[j] * alpha + w
            o[j] = o[j] * alpha[:, None] + w[:, None] * vv[:, t]
            m[j] = m_new
    if partials_in_t:
        o = round_to(o, case.dtype).astype(np.float32)
    return combine(o, m, l, sink, "no_rescale" in bugs)[0]


def _torch_out(a, case):
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)).to(
        {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[case.dtype])


def _combine_op(host: dict, case, bugs) -> dict:
    """attn_combine as pass 2 computes it (normalized=0; every split empty: out 0)."""
    import torch

    o, m, l = (host[n].transpose(2, 0, 1, *range(3, host[n].ndim)) for n in "oml")
    sink = host["sinks"] if case.params["sinks"] else np.full(case.dims["heads"], NEG_INF)
    outs, tops, totals = zip(*(combine(o[:, b], m[:, b], l[:, b], sink, "no_rescale" in bugs)
                               for b in range(case.dims["batch"])))
    empty = np.array(tops) == NEG_INF
    out = np.where(empty[..., None], np.float32(0), np.array(outs))
    lse = (np.array(tops) + np.log(np.array(totals, np.float64))).astype(np.float32)
    return {"out": _torch_out(out, case), "lse": torch.from_numpy(lse)}


def mirror(impl_id: str, bugs=frozenset()):
    """The CUDA impl's contract and numerics on the torch backend, its run the NumPy mirror."""
    impl = ALL[impl_id]

    def run(launch, inputs, outputs, case):
        host = {k: t.cpu().float().numpy() if t.is_floating_point() else t.cpu().numpy()
                for k, t in inputs.items()}
        if case.op == "attn_combine":
            with np.errstate(invalid="ignore", over="ignore"):
                return _combine_op(host, case, bugs)
        two_pass = impl_id == "cuda:sdpa_decode_2pass"
        splits = launch["pass1"].extra["blocks"] if two_pass else 32
        return {"out": _torch_out(emulate_decode(host, case, splits, two_pass, bugs), case)}
    return dataclasses.replace(impl, backend="torch", name=f"mirror_{impl.name}", run=run)


def _cases(impl_id: str, labels: tuple[str, ...], dtypes=("bf16", "f16")) -> list[Case]:
    impl = ALL[impl_id]
    out = [c for c in gate_cases(impl.op) if c.label in labels and c.dtype in dtypes
           and impl.contract.admits(c)]
    assert out, f"{impl_id}: no gate case labelled {labels}"
    return out


# The gate cases the mirror runs: sinks and window, nonfinite values, a near tie across splits,
# f16 partials near the subnormal range, several 32-key splits of the 4096-key case.
MIRRORED = [
    ("cuda:ffai_sdpa_decode_d64", ("dist:outlier_rows-sinks-window", "dist:nonfinite",
                                   "edge:sink-tokens-window")),
    ("cuda:sdpa_decode_2pass", ("preset:gpt-oss-20b-probs-T", "dist:near_tie-probs-T",
                                "dist:nonfinite-probs-T", "dist:tiny-probs-T")),
    ("cuda:sdpa_decode_2pass_pass2", ("preset:ffai-partials-in-T-sinks",
                                      "dist:nonfinite-ffai-partials-in-T")),
]


@pytest.mark.parametrize("impl_id, labels", MIRRORED, ids=[m[0] for m in MIRRORED])
def test_mirrored_kernels_pass_their_gate_cases(impl_id, labels):
    pytest.importorskip("torch")
    impl, torch_be = mirror(impl_id), gpu_impls.backend("torch")
    for case in _cases(impl_id, labels):
        row = check(Work(impl, case, "valid"), torch_be)
        assert row["status"] == "pass", (case.label, case.dtype, row["message"])


# Each CUDA mutant (tests/mutants.py), mirrored, on a case test_gpu's mutant test selects for it
# (bf16 or f16, distribution normal, valid for the impl).
MUTANT_CASES = [
    ("cuda:ffai_sdpa_decode_d64", "drop_sink", "preset:gpt-oss-20b"),
    ("cuda:ffai_sdpa_decode_d64", "window_off_by_one", "edge:sink-tokens-window"),
    ("cuda:ffai_sdpa_decode", "gqa_modulo", "preset:qwen3-0.6b"),
    ("cuda:sdpa_decode_2pass", "no_rescale", "preset:llama-3.2-1b-probs-T"),
    ("cuda:sdpa_decode_2pass", "drop_sink", "preset:gpt-oss-20b-probs-T"),
    ("cuda:sdpa_decode_2pass", "window_off_by_one", "preset:gpt-oss-20b-probs-T"),
    ("cuda:sdpa_decode_2pass", "gqa_modulo", "preset:llama-3.2-1b-probs-T"),
    ("cuda:sdpa_decode_2pass_pass2", "no_rescale", "preset:ffai-partials-in-T"),
]


@pytest.mark.parametrize("impl_id, bug, label", MUTANT_CASES,
                         ids=[f"{i}-{b}" for i, b, _ in MUTANT_CASES])
def test_mirrored_mutants_go_red(impl_id, bug, label):
    pytest.importorskip("torch")
    torch_be = gpu_impls.backend("torch")
    case = _cases(impl_id, (label,), ("bf16",))[0]
    assert case.dist == "normal"
    assert check(Work(mirror(impl_id), case, "valid"), torch_be)["status"] == "pass"
    assert check(Work(mirror(impl_id, frozenset({bug})), case, "valid"), torch_be)["status"] \
        == "fail"


def test_cuda_mutants_are_registered_for_the_gpu_gate():
    """Every CUDA attention mutant of tests/mutants.py exists (the plugin registers it) and has
    cases in the GPU mutant test's selection."""
    from pathlib import Path

    gpu_impls.load_plugin(str(Path(__file__).with_name("mutants.py")))
    from tests.mutants import FFAI_MUTANTS

    registered = gpu_impls.impls()
    for impl_id, name, _ in FFAI_MUTANTS:
        mutant = registered[f"cuda:{name}"]
        work = [w for w in plan([mutant], dtypes=["bf16", "f16"], invalid=False)
                if w.case.dist in ("normal", "tiny", "zero_rows")]
        assert mutant.op == registered[impl_id].op and work, name


def test_two_pass_partials_rounded_to_t_are_charged():
    """f16 partials in the subnormal range: each split's o_j = v_j + e^-0.5 v_(j+64) (two keys
    per split of 64) is rounded to a multiple of 2^-24 before the combine. The error goes past
    half an output ULP (the store's own charge, with little else to add here) and stays within
    the probs='T' bound, whose absolute u_T tiny_T on the output is what covers it."""
    from oracle.numerics import Numerics

    case = Case.make("sdpa_decode", {"batch": 1, "heads": 1, "kv_heads": 1, "head_dim": 64,
                                     "max_len": 128}, "f16", params={"ragged": 0, "probs": "T"})
    assert block_count(case.dims, case.params) == 64
    q = np.zeros((1, 1, 64))
    q[..., 0] = 1.0
    k = np.zeros((1, 1, 128, 64))
    k[0, 0, 64:, 0] = -4.0  # scores 0 (keys 0..63), -0.5 (keys 64..127): scale 1/8
    v = np.zeros((1, 1, 128, 64))
    # the 64 subnormal multiples n·2^-24 whose outputs end farthest from the exact ones
    n = np.arange(1, 1024)
    w = float(np.exp(np.float32(-0.5)))
    reached = round_to(np.round(w * n) / (1 + w), "f16").astype(np.float64)
    v[0, 0, 64:] = n[np.argsort(-np.abs(reached - w * n / (1 + w)))][:64] * 2.0 ** -24
    inputs = {"lengths": np.array([128], np.int32), "sinks": np.zeros(0, np.float32),
              **{name: round_to(a, "f16") for name, a in (("q", q), ("k", k), ("v", v))}}
    out = round_to(emulate_decode(inputs, case, 64, True), "f16").astype(np.float64)
    exact = case.spec.oracle(inputs, case)["out"]
    bound = case.spec.bounds(inputs, {"out": exact}, case,
                             ALL["cuda:sdpa_decode_2pass"].numerics.on("cuda"))["out"]
    err = np.abs(out - exact)
    assert err.max() > 0.6 * 2.0 ** -24 and (err <= bound).all()
