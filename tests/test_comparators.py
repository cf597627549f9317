"""Comparators (`oracle/comparators.py`): each on hand-built arrays, then through the runner on
two test-only ops (`tests/comparator_ops.py`) with torch CPU impls and planted mistakes:
`topk_route` (a top-k set with a planted near-tie) and `argsort_rows` (an exact permutation)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from oracle.comparators import (Bounded, Exact, Gathered, Logits, OutputCheck, Permuted,
                                TopKSet, comparator_for)
from oracle.metrics import compare
from oracle.spec import TensorSpec
from tests.comparator_ops import (ARGSORT_ROWS, TIE_EVERY, TOPK_ROUTE, argsort_impl, registered,
                                  route_impl, swapping_impl)


def output(out, ref, exact=None, bound=0.0, dtype="f32", **siblings) -> OutputCheck:
    ref = np.asarray(ref)
    return OutputCheck("y", np.asarray(out), ref, ref.astype(np.float64) if exact is None
                       else np.asarray(exact), np.asarray(bound), dtype, None, **siblings)


# --- on hand-built arrays ------------------------------------------------------------------------

def test_bounded_is_the_element_wise_bound_of_compare():
    ref = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    out = np.array([1.0, 2.5, 3.0], dtype=np.float32)
    v = Bounded()(output(out, ref, bound=0.1))
    assert v.metrics == compare(out, ref, ref.astype(np.float64), np.array(0.1), "f32")
    assert not v.ok and v.kind == "over bound" and v.message.startswith("y[1] = 2.5, oracle 2")
    nan = Bounded()(output(np.array([np.nan], np.float32), ref[:1], bound=0.1))
    assert nan.kind == "NaN/Inf mismatch" and nan.metrics["budget"] == math.inf
    assert Bounded()(output(ref, ref, bound=0.1)).ok


def test_logits_true_is_shorthand_for_the_logits_comparator():
    shape = lambda d: (d["out"],)  # noqa: E731
    assert comparator_for(TensorSpec("out", shape, logits=True)) == Logits()
    assert comparator_for(TensorSpec("out", shape)) == Bounded()
    with pytest.raises(ValueError, match="give one"):
        TensorSpec("out", shape, logits=True, comparator=Bounded())


def test_logits_flags_a_near_tie_and_fails_a_flip():
    exact = np.array([0.0, 1.0, 0.999, -1.0])
    tie = Logits()(output(np.array([0.0, 0.9995, 0.9996, -1], np.float32),
                          exact.astype(np.float32), exact, bound=0.001))
    assert tie.ok and tie.flags == ("near_tie",)
    flip = Logits()(output(np.array([0.0, 0.99, 1.0, -1], np.float32),
                           exact.astype(np.float32), exact, bound=1e-4))
    assert not flip.ok and flip.kind == "argmax flip"  # over its bound too: both are said
    assert flip.message.startswith("y[1] = ") and "; y: argmax 2, oracle's 1" in flip.message


def test_exact_counts_mismatches_and_names_the_first():
    ref = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert Exact()(output(ref.copy(), ref)).metrics == {
        "mismatches": 0, "first_mismatch": -1, "budget": 0.0}
    out = ref.copy()
    out[1, 2], out[2, 0] = 0, 0
    v = Exact()(output(out, ref))
    assert not v.ok and v.kind == "exact mismatch"
    assert v.metrics == {"mismatches": 2, "first_mismatch": 6, "budget": math.inf}
    assert "2 of 12 elements" in v.message
    assert "[6] (1, 2), is 0 where the oracle has 6" in v.message


def test_exact_compares_bits():
    """-0 is not +0 and NaN equals NaN only with the same payload: bit-identical means bits."""
    ref = np.array([0.0, np.nan], dtype=np.float32)
    assert Exact()(output(ref.copy(), ref)).ok
    assert Exact()(output(np.array([-0.0, np.nan], np.float32), ref)).metrics["mismatches"] == 1


# Scores of two rows over 5 candidates; top-3 is {0, 1, 2} in both. Row 0's 3rd and 4th are
# within their bounds of each other (1e-3 apart, bounds 1e-3 each); row 1's are 2 apart.
SCORES = np.array([[5.0, 4.0, 3.0, 2.999, 0.0], [5.0, 4.0, 3.0, 1.0, 0.0]])
ORACLE_IDS = np.array([[0, 1, 2], [0, 1, 2]], dtype=np.int32)


def topk(ids) -> OutputCheck:
    return output(np.array(ids, dtype=np.int32), ORACLE_IDS, bound=np.full((2, 5), 1e-3),
                  dtype="i32", exacts={"scores": SCORES})


def test_topk_set_ignores_the_order_within_a_row():
    v = TopKSet("scores")(topk([[2, 0, 1], [1, 2, 0]]))
    assert v.ok and v.flags == () and v.metrics["budget"] == 0.0
    assert v.metrics["tie_rows"] == 1 and v.metrics["near_tie_rows"] == 0


def test_topk_set_swap_at_a_near_tie_is_recorded_not_failed():
    v = TopKSet("scores")(topk([[0, 1, 3], [0, 1, 2]]))
    assert v.ok and v.flags == ("near_tie",)
    assert v.metrics["near_tie_rows"] == 1 and v.metrics["near_tie_at"] == [0]
    assert v.metrics["budget"] == pytest.approx(0.5)  # gap 1e-3 of an allowed 2e-3


def test_topk_set_swap_past_the_tolerance_fails_naming_the_row():
    v = TopKSet("scores")(topk([[0, 1, 2], [0, 3, 1]]))
    assert not v.ok and v.kind == "top-k set mismatch"
    assert v.message.startswith("y: row 1: picked 3 over 2") and "1 of 2 rows fail" in v.message
    assert v.metrics["first_failed_row"] == 1 and v.metrics["budget"] == pytest.approx(1000)


@pytest.mark.parametrize("ids", [[[0, 0, 1], [0, 1, 2]], [[0, 1, 5], [0, 1, 2]]])
def test_topk_set_fails_repeated_or_out_of_range_ids(ids):
    v = TopKSet("scores")(topk(ids))
    assert not v.ok and "row 0: ids" in v.message and "3 distinct candidates in [0, 5)" in v.message
    assert v.metrics["budget"] == math.inf


def test_gathered_checks_values_at_the_impls_own_ids():
    """At a near-tie swap the impl's weight is its own pick's: right against the oracle's value
    there, wrong against the oracle's slot (what `Bounded` alone would compare it with)."""
    ids = np.array([[0, 1, 3]], dtype=np.int32)
    weights = SCORES[:1, [0, 1, 3]].astype(np.float32)
    x = output(weights, SCORES[:1, :3].astype(np.float32), bound=np.full((1, 5), 1e-4),
               outputs={"ids": ids}, exacts={"p": SCORES[:1]})
    assert Gathered(ids="ids", values="p")(x).ok
    assert not Bounded()(dataclasses.replace(x, bound=np.full((1, 3), 1e-4))).ok


def test_permuted_rows_compare_in_the_keys_order():
    """Tokens grouped by expert, ties in any order: sorted by (expert, token) on both sides."""
    expert, token = np.array([0, 0, 1, 1, 1]), np.array([3, 1, 0, 2, 4])
    value = np.array([30.0, 10.0, 0.0, 20.0, 40.0], dtype=np.float32)
    order = np.array([1, 0, 4, 2, 3])  # the impl's order: another one within each expert
    siblings = {"outputs": {"expert": expert[order], "token": token[order]},
                "refs": {"expert": expert, "token": token}}
    by_key = Permuted(key=("expert", "token"))
    assert by_key(output(value[order], value, bound=1e-6, **siblings)).ok
    assert not Bounded()(output(value[order], value, bound=1e-6, **siblings)).ok
    wrong = value[order].copy()
    wrong[0] = 11.0
    v = by_key(output(wrong, value, bound=1e-6, **siblings))
    assert not v.ok and v.message.endswith("(positions sorted by expert, token)")
    with pytest.raises(ValueError, match="repeats"):
        Permuted(key="expert")(output(value[order], value, bound=1e-6, **siblings))


def test_permuted_within_rows_sorts_each_rows_slots():
    """Top-k slots in any order: each row's weights sorted by its ids on both sides."""
    ids, weights = np.array([[2, 0, 1]]), np.array([[0.2, 0.5, 0.3]], dtype=np.float32)
    x = output(weights, np.array([[0.5, 0.3, 0.2]], dtype=np.float32), bound=1e-6,
               outputs={"ids": ids}, refs={"ids": np.array([[0, 1, 2]])})
    assert Permuted(key="ids", axis=-1)(x).ok and not Bounded()(x).ok


# --- through the runner, on the test-only ops ----------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def ops():
    with registered(TOPK_ROUTE, ARGSORT_ROWS):
        yield


def route_case(dtype, dist="near_tie"):
    from cases.model import Case

    return Case.make("topk_route", {"tokens": 64, "experts": 16, "k": 4}, dtype, dist)


def run(impl, case) -> dict:
    from cases.generate import Work
    from gpu_impls import backend
    from runners.correctness import check

    return check(Work(impl, case, "valid"), backend("torch"))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_planted_near_tie_is_one_ulp_of_T_at_the_k_boundary(dtype):
    from cases.model import make_inputs
    from oracle.dtypes import spacing

    case = route_case(dtype)
    logits = make_inputs(case)["logits"].astype(np.float64)
    for r in range(0, 64, TIE_EVERY):
        kth, next_ = np.sort(logits[r])[::-1][3:5]
        assert kth - next_ == spacing(np.array(kth), dtype)
    metrics = json.loads(run(route_impl(), case)["outputs_json"])["ids"]
    assert metrics["tie_rows"] >= 64 // TIE_EVERY  # every planted pair is within its bounds


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("dist", ["normal", "near_tie"])
def test_torch_topk_passes(dtype, dist):
    row = run(route_impl(), route_case(dtype, dist))
    assert row["status"] == "pass", row["message"]
    assert row["flags"] in ("", "near_tie:ids")  # torch may break a T-rounded tie either way


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_swap_at_the_near_tie_is_recorded_not_failed(dtype):
    planted = lambda case: range(0, case.dims["tokens"], TIE_EVERY)  # noqa: E731
    row = run(swapping_impl("twin_first", planted), route_case(dtype))
    assert row["status"] == "pass", row["message"]
    assert row["flags"] == "near_tie:ids"
    ids = json.loads(row["outputs_json"])["ids"]
    # every planted row, and in bf16 maybe a row where torch broke a tie of equal logits
    assert ids["near_tie_rows"] >= 64 // TIE_EVERY and ids["near_tie_at"][0] == 0


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_swap_without_a_near_tie_fails_naming_the_row(dtype):
    from cases.model import make_inputs
    from runners.verdicts import failure_kind

    case = route_case(dtype)
    inputs = make_inputs(case)
    exact, _ = TOPK_ROUTE.reference(inputs, case)
    bound = TOPK_ROUTE.bounds(inputs, exact, case)["ids"]
    p = exact["probs"]
    order = np.argsort(-p, axis=1, kind="stable")
    clear = [r for r in range(64) if r % TIE_EVERY and p[r, order[r, 3]] - p[r, order[r, 4]]
             > bound[r, order[r, 3]] + bound[r, order[r, 4]]]
    r = clear[0]
    row = run(swapping_impl("kth_plus_one", lambda case: [r]), case)
    assert row["status"] == "fail" and row["message"].startswith(f"ids: row {r}: picked "), row
    assert failure_kind(row) == "top-k set mismatch"
    metrics = json.loads(row["outputs_json"])
    assert "fail_kind" not in metrics["weights"]  # its weights are right for its own pick


def test_argsort_passes_and_a_wrong_permutation_fails():
    from cases.model import Case
    from results.schema import CORRECTNESS
    from runners.verdicts import failure_kind

    case = Case.make("argsort_rows", {"rows": 8, "n": 32}, "bf16")
    assert run(argsort_impl(), case)["status"] == "pass"
    row = run(argsort_impl("swap", swap=(2, 5, 9)), case)
    assert row["status"] == "fail" and failure_kind(row) == "exact mismatch"
    assert row["message"].startswith("order: 2 of 256 elements differ from the oracle's; the "
                                      "first, [69] (2, 5), is ")
    assert row["worst_output"] == "order" and row["budget"] == math.inf and row["max_abs"] is None
    import pyarrow as pa

    pa.Table.from_pylist([row], schema=CORRECTNESS)  # the stored row's columns as ever


def test_check_summary_reports_the_topk_near_ties(capsys):
    from verbs.check import _print_reported

    planted = lambda case: range(0, case.dims["tokens"], TIE_EVERY)  # noqa: E731
    _print_reported([run(swapping_impl("twin_first", planted), route_case("f32"))])
    out = capsys.readouterr().out
    assert "reported, not gated: top-k agreement" in out and "level-2" not in out
    line = next(ln for ln in out.splitlines() if "torch:twin_first" in ln)
    assert [c.strip() for c in line.strip("│").split("│")][1:] == ["1", "16", "16"]
