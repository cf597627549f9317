"""Issue 24 item 4, through the normal runner on torch CPU (and MLX CPU where it is here): an
output aliasing an input, per-sequence lengths in params, an impl with two launches, and a
two-stage pipeline. The examples are `tests/op_model_examples.py`, loaded as a plugin at run
time (not at collection, so the suite's "every registered op / impl" parametrizations never see
its mutants)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import gpu_impls
from cases.generate import Work, gate_cases, violating_cases
from cases.model import Case, make_inputs
from gpu_impls.contract import ContractError
from oracle.numerics import Bounds, Choices, Model, Worst, adverse_store, model_for
from oracle.spec import get_op, registry
from results.store import Store
from verbs.cli import main
from runners.correctness import check, launch_impl
from runners.verdicts import failure_kind

EXAMPLES = str(Path(__file__).with_name("op_model_examples.py"))
CPU = ["--isolate", "none"]


@pytest.fixture(scope="module", autouse=True)
def examples():
    gpu_impls.load_plugin(EXAMPLES)


def _check(tmp_path, *args) -> tuple[int, dict]:
    """`kparity check` with the examples, every gate case (nightly tier); (exit code, rows by
    (impl, case id))."""
    rc = main(["--store", str(tmp_path), "--plugin", EXAMPLES, "check", "--tier", "nightly",
               *args, *CPU])
    rows = Store(tmp_path).read("correctness").to_pylist()
    return rc, {(r["impl"], r["case_id"]): r for r in rows}


def _flags(row) -> set[str]:
    return set(row["flags"].split(",")) - {""}


# --- 1. an output aliasing an input: the KV-cache append ---------------------------------------

def _kv_case(cache_lens, new_lens, max_len, d=4, dtype="bf16", dist="normal"):
    return Case.make("kv_append", {"max_len": max_len, "d": d}, dtype, dist,
                     params={"cache_lens": cache_lens, "new_lens": new_lens})


def test_kv_append_in_place_passes_and_one_slot_too_far_fails_out_of_region(tmp_path):
    rc, rows = _check(tmp_path, "--op", "kv_append", "--backend", "torch")
    assert rc == 1
    good = [r for (impl, _), r in rows.items() if impl == "torch:kv_append"]
    assert len(good) == len(gate_cases("kv_append")) + 1
    assert all(r["status"] == "pass" for r in good if r["expect"] == "valid"), \
        [r["message"] for r in good if r["status"] != "pass"][:3]
    rejected, = [r for r in good if r["expect"] == "rejected"]
    assert rejected["status"] == "rejected" and "cache_lens + new_lens <= max_len" in \
        rejected["message"]

    bad = {r["case_id"]: r for (impl, _), r in rows.items()
           if impl == "torch:mutant_kv_append_one_past" and r["expect"] == "valid"}
    assert all(r["status"] == "fail" for r in bad.values())
    # ragged, every extra slot inside the cache: out of region only, at the extra slots
    inside = bad[_kv_case((2, 5, 0), (3, 1, 4), 8).id]
    assert _flags(inside) == {"outside_region"}, inside["flags"]
    assert failure_kind(inside) == "outside_region"
    slots = [(0 * 8 + 5) * 4, (1 * 8 + 6) * 4, (2 * 8 + 4) * 4]  # (sequence, slot c + n)
    shown = ", ".join(str(s + k) for s in slots[:2] for k in range(4))
    assert f"cache: write outside the region the op writes: 12 element(s) at flat index {shown} " \
           "and 4 more changed (it writes 32 of 96 elements" in inside["message"]
    # the one sequence fills its cache: the extra slot is past the end, in the guard region
    full = bad[_kv_case((0,), (16,), 16).id]
    assert _flags(full) == {"oob_write"} and "flat index 64, 65, 66, 67 " in full["message"]
    both = bad[_kv_case((1, 4), (2, 4), 8).id]
    assert _flags(both) == {"outside_region", "oob_write"}


def test_kv_append_leaves_the_rest_of_the_cache_and_poisons_only_its_slots():
    """The runner hands the impl the input's own buffer: outside the appended slots it holds the
    input's bits, inside them the poison; an impl that skips a sequence is `unwritten` there."""
    impl = gpu_impls.impls()["torch:kv_append"]
    case = _kv_case((2, 5, 0), (3, 1, 4), 8, dtype="f32")
    inputs = make_inputs(case)
    seen = {}

    def spy(launch, ins, outs, c):
        seen["same"] = ins["cache"] is outs["cache"]
        seen["before"] = gpu_impls.backend("torch").to_host(outs["cache"], "f32").copy()
        return impl.run(launch, ins, outs, c)

    out, defects = launch_impl(dataclasses.replace(impl, run=spy), gpu_impls.backend("torch"),
                               case, inputs)
    assert defects == [] and seen["same"]
    written = case.spec.written("cache", case, inputs)
    assert written.sum() == 8 * 4 and written[0, 2:5].all() and written[2, :4].all()
    assert np.isnan(seen["before"][written]).all()
    assert np.array_equal(seen["before"][~written], inputs["cache"][~written])
    exact, _ = case.spec.reference(inputs, case)
    assert np.array_equal(out["cache"][~written], inputs["cache"][~written])
    assert np.allclose(out["cache"][written], exact["cache"][written], rtol=1e-6)
    bounds = case.spec.bounds(inputs, exact, case)
    assert (bounds["cache"][~written] == 0).all() and (bounds["cache"][written] > 0).all()

    def skip_last(launch, ins, outs, c):
        impl.run(launch, ins, outs, c.replace(new_lens=(3, 1, 0)))

    _, defects = launch_impl(dataclasses.replace(impl, run=skip_last),
                             gpu_impls.backend("torch"), case, inputs)
    (flag, text), = defects
    assert flag == "unwritten" and "16 element(s) at flat index 64, 65" in text


@pytest.mark.mlx
def test_kv_append_on_a_functional_backend_is_checked_on_the_returned_cache():
    """MLX returns the updated cache: the same region rule, on the array it returns."""
    impl = gpu_impls.impls()["mlx:kv_append"]
    case = _kv_case((7, 0, 3, 15), (1, 0, 6, 1), 16, d=64)
    assert check(Work(impl, case, "valid"), gpu_impls.backend("mlx"))["status"] == "pass"

    def one_more(launch, ins, outs, c):
        cache = impl.run(launch, ins, outs, c)["cache"]
        cache[1, 0] = cache[1, 0] + 1
        return {"cache": cache}

    row = check(Work(dataclasses.replace(impl, run=one_more), case, "valid"),
                gpu_impls.backend("mlx"))
    assert row["status"] == "fail" and _flags(row) == {"outside_region"}
    assert "64 element(s) at flat index 1024, 1025" in row["message"]


def test_an_oracle_or_a_spec_that_disagrees_with_the_declared_region_is_refused():
    from oracle.spec import OpSpec, TensorSpec

    spec = get_op("kv_append")
    with pytest.raises(ValueError, match="aliases 'kache', which is not an input"):
        dataclasses.replace(spec, name="x", outputs=(dataclasses.replace(
            spec.outputs[0], aliases="kache"),))
    with pytest.raises(ValueError, match="has `writes` but aliases no input"):
        OpSpec("y", "test", ("n",), (TensorSpec("x", lambda d: (d["n"],)),),
               (TensorSpec("out", lambda d: (d["n"],), writes=lambda c, i: ()),),
               oracle=None, tolerance=lambda *a: {}, bytes=len, flops=len)
    wrong = dataclasses.replace(spec, name="kv_append_wrong",
                                oracle=lambda inputs, case: {"cache": inputs["cache"] * 2.0})
    case = _kv_case((2,), (1,), 4)
    with pytest.raises(ValueError, match="changes 'cache' outside the elements"):
        wrong.reference(make_inputs(case), case)


# --- 2. per-sequence lengths in params --------------------------------------------------------

def test_tuple_params_drive_shapes_and_hash_stably():
    case = _kv_case([2, 5, 0], [3, 1, 4], 8)
    assert case == _kv_case((2, 5, 0), (3, 1, 4), 8)  # a list is held as a tuple: same id
    assert case.params["new_lens"] == (3, 1, 4)
    assert Case.from_json(case.to_json()).id == case.id
    assert json.loads(case.to_json())["params"]["cache_lens"] == [2, 5, 0]
    assert case.id != _kv_case((2, 5, 0), (3, 1, 3), 8).id
    shapes = {t.name: t.shape_of(case) for t in case.spec.inputs}
    assert shapes == {"cache": (3, 8, 4), "new": (8, 4)}
    inputs = make_inputs(case)
    assert {k: v.shape for k, v in inputs.items()} == shapes
    # a classic shape function (dims only) is unchanged
    assert get_op("rms_norm").inputs[0].shape_of(Case.make("rms_norm", {"rows": 2, "n": 8},
                                                           "f32")) == (2, 8)


@pytest.mark.parametrize("bad, element", [((3, -1), "-1"), ((3, 1.5), "1.5"),
                                          ((True, 2), "True"), (("3",), "'3'")])
def test_tuple_params_must_be_non_negative_ints(bad, element):
    with pytest.raises(ValueError, match=rf"param 'new_lens' = .*: a tuple param holds "
                                         rf"non-negative integers .*element \d is {element}"):
        _kv_case((0, 0), bad, 8)


def test_a_case_file_may_give_per_sequence_lengths(tmp_path, capsys):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([{"op": "kv_append", "dims": {"max_len": 8, "d": 4},
                                 "dtype": "f16", "params": {"cache_lens": [2, 5, 0],
                                                            "new_lens": [3, 1, 4]}}]))
    rc, rows = _check(tmp_path / "store", "--cases", str(path), "--impl", "torch:kv_append")
    assert rc == 0 and [r["status"] for r in rows.values()] == ["pass"]
    row, = rows.values()
    assert json.loads(row["params"])["new_lens"] == [3, 1, 4]
    assert row["case_id"] == _kv_case((2, 5, 0), (3, 1, 4), 8, dtype="f16").id


# --- 3. an impl with two launches --------------------------------------------------------------

def test_two_launches_each_with_its_contract(tmp_path):
    impl = gpu_impls.impls()["torch:row_sum_split"]
    assert [inv.name for inv in impl.contract.invariants] == ["split: n % 8 == 0",
                                                              "combine: parts <= lanes"]
    labels = [w.case.label for w in violating_cases(impl)]
    assert labels == ["violates:split: n % 8 == 0", "violates:combine: parts <= lanes"]
    rc, rows = _check(tmp_path, "--op", "row_sum")
    assert rc == 0
    statuses = sorted(r["status"] for r in rows.values())
    assert statuses.count("rejected") == 2 and statuses.count("pass") == len(rows) - 2


def test_a_broken_launch_invariant_is_named_and_nothing_launches():
    impl = gpu_impls.impls()["torch:row_sum_split"]
    launched = []

    def spy(launch, inputs, outputs, case):
        launched.append(sorted(launch))
        return impl.run(launch, inputs, outputs, case)

    spied = dataclasses.replace(impl, run=spy)
    ok = Case.make("row_sum", {"rows": 3, "n": 264}, "bf16")
    out, defects = launch_impl(spied, gpu_impls.backend("torch"), ok, make_inputs(ok))
    assert launched == [["combine", "split"]] and defects == []
    assert spied.contract.check(spied.id, ok)["combine"].extra == {"parts": 2}

    too_long = ok.replace(n=33 * 256)  # the split is fine: only the combine's invariant breaks
    with pytest.raises(ContractError) as e:
        launch_impl(spied, gpu_impls.backend("torch"), too_long, make_inputs(too_long))
    assert len(launched) == 1, "a launch ran although a later launch's contract is broken"
    assert e.value.launch == "combine" and e.value.invariant == "combine: parts <= lanes"
    assert str(e.value) == (
        "torch:row_sum_split: contract invariant `combine: parts <= lanes` broken (n=8448, "
        "parts=33, lanes=32): the combine sums the partial sums in one warp, one lane each. "
        "Nearest valid choice: n <= 8192")
    row = check(Work(spied, too_long, "valid"), gpu_impls.backend("torch"))
    assert row["status"] == "rejected" and "`combine: parts <= lanes`" in row["message"]
    with pytest.raises(ContractError, match="`split: n % 8 == 0` broken"):
        spied.contract.check(spied.id, ok.replace(n=1001))


def test_an_impl_declares_a_contract_or_launches_not_both():
    from gpu_impls.contract import NO_CONTRACT, Contract
    from gpu_impls.impl import Impl

    impl = gpu_impls.impls()["torch:row_sum_split"]
    with pytest.raises(ValueError, match="give `contract` or `launches`, not both"):
        Impl("row_sum", "torch", "x", impl.run, Contract(), launches=impl.launches)
    assert Impl("row_sum", "torch", "y", impl.run).contract is NO_CONTRACT


# --- 4. a two-stage pipeline -------------------------------------------------------------------

def test_the_pipeline_is_an_op():
    spec = registry()["norm_scale"]
    assert spec.pipeline is not None and spec.dims == ("rows", "n")
    assert [t.name for t in spec.inputs] == ["x", "w", "s"] and spec.outputs[0].name == "out"
    assert set(spec.params) == {"eps", "weight_offset", "rounding", "ftz", "overflow"}
    assert spec.version == f"1:rms_norm={get_op('rms_norm').version},scale_cols=1"
    case = gate_cases("norm_scale")[0]
    inputs = make_inputs(case)
    norm = get_op("rms_norm")
    stage1 = norm.reference({"x": inputs["x"], "w": inputs["w"]},
                            spec.pipeline.stage_case(case, "norm"))[1]["out"]
    want = np.asarray(stage1).astype(np.float64) * inputs["s"].astype(np.float64)
    assert np.array_equal(spec.oracle(inputs, case)["out"], want)  # T between the stages


def _pipeline_rows(tmp_path, impl_ids):
    rc, rows = _check(tmp_path, "--op", "norm_scale", "--impl", ",".join(impl_ids))
    by_impl = {}
    for (impl, _), r in rows.items():
        by_impl.setdefault(impl, []).append(r)
    return rc, by_impl


def test_correct_pipeline_impls_pass_staged_and_fused(tmp_path):
    rc, rows = _pipeline_rows(tmp_path, ["torch:norm_scale_staged", "torch:norm_scale_fused"])
    assert rc == 0
    for impl, rs in rows.items():
        valid = [r for r in rs if r["expect"] == "valid"]
        assert len(valid) == len(gate_cases("norm_scale")) and \
            all(r["status"] == "pass" for r in valid), impl
    staged = rows["torch:norm_scale_staged"]
    metrics = json.loads(next(r for r in staged if r["expect"] == "valid")["outputs_json"])
    assert set(metrics) == {"norm.out", "scale.out", "out"}
    rejected, = [r for r in staged if r["expect"] == "rejected"]
    assert rejected["label"] == "violates:norm: rounding == 'once'"
    assert "contract invariant `norm: rounding == 'once'` broken" in rejected["message"]


@pytest.mark.parametrize("impl, stage, index", [("torch:norm_scale_bad_scale", "scale", 2),
                                                ("torch:norm_scale_bad_norm", "norm", 1)])
def test_a_wrong_stage_is_named_and_the_next_stage_is_not_blamed(tmp_path, impl, stage, index):
    rc, rows = _pipeline_rows(tmp_path, [impl])
    assert rc == 1
    failed = [r for r in rows[impl] if r["status"] != "pass" and r["expect"] == "valid"]
    assert failed and all(r["dtype"] != "f32" for r in failed)  # both mutants are exact in f32
    other = {"scale": "norm", "norm": "scale"}[stage]
    for r in failed:
        assert r["status"] == "fail" and f"stage:{stage}" in _flags(r)
        assert f"stage:{other}" not in _flags(r), r["message"]
        assert r["message"].startswith(f"stage {index} ({stage}): ")
        assert failure_kind(r) == f"stage {stage}: over bound"
        m = json.loads(r["outputs_json"])
        assert m[f"{stage}.out"]["budget"] > 1 and m[f"{other}.out"]["budget"] <= 1


def test_the_end_to_end_bound_bites_a_fused_impl_without_the_stored_intermediate(tmp_path):
    rc, rows = _pipeline_rows(tmp_path, ["torch:mutant_norm_scale_unrounded"])
    failed = [r for r in rows["torch:mutant_norm_scale_unrounded"] if r["status"] == "fail"]
    assert rc == 1 and {r["dtype"] for r in failed} == {"f16", "bf16"}
    assert all(r["worst_output"] == "out" for r in failed)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_every_admissible_chain_is_within_the_composed_bound(dtype):
    """The end-to-end bound against the worst admissible chains a random search finds: each
    stage's kernel model run in the arithmetic of one admissible kernel (`Worst`), its output
    stored in T and read by the next stage, for random rounding directions."""
    spec = get_op("norm_scale")
    rng = np.random.default_rng(0)
    for dist, ftz in (("normal", 0), ("outlier_rows", 0), ("tiny", 0), ("tiny", 1)):
        case = Case.make("norm_scale", {"rows": 4, "n": 256}, dtype, dist, seed=7,
                         params={"ftz": ftz})
        inputs = make_inputs(case)
        exact, _ = spec.reference(inputs, case)
        bound = spec.bounds(inputs, exact, case)["out"]
        probe = Choices()
        spec.kernel(Worst(model_for(case), probe), inputs, case)
        worst = 0.0
        for trial in range(40):
            flips = set(np.flatnonzero(rng.random(probe.sites) < (trial % 5) / 4))
            got = spec.kernel(Worst(model_for(case), Choices(flips=flips)), inputs, case)["out"]
            stored = adverse_store(got, dtype)
            with np.errstate(invalid="ignore", divide="ignore"):
                err = np.abs(stored - exact["out"])
                worst = max(worst, float(np.nanmax(np.where(err == 0, 0, err / bound))))
        assert worst <= 1.0, f"{dist} ftz={ftz}: an admissible chain uses {worst:.3g} of the bound"


def test_a_pipeline_whose_stages_cannot_be_composed_is_refused():
    from oracle.pipeline import Pipeline, Stage

    with pytest.raises(ValueError, match="wired to 'norm.y', not an output of an earlier stage"):
        Pipeline("p1", "test", (Stage("norm", "rms_norm"),
                                Stage("scale", "scale_cols", wires={"x": "norm.y"}))).spec()
    with pytest.raises(ValueError, match="input 'x' of stage scale is also an input of stage "
                                         "norm"):
        Pipeline("p2", "test", (Stage("norm", "rms_norm"), Stage("scale", "scale_cols"))).spec()
    # rms_norm's kernel model reads its inputs as arrays: it cannot take an interval
    p3 = Pipeline("p3", "test", (Stage("scale", "scale_cols"),
                                 Stage("norm", "rms_norm", wires={"x": "scale.out"})))
    spec = p3.spec()
    case = Case.make("rms_norm", {"rows": 2, "n": 8}, "f32")
    case = dataclasses.replace(case, op="norm_scale")  # any case with rows, n
    inputs = {"x": np.ones((2, 8), np.float32), "s": np.ones(8, np.float32),
              "w": np.ones(8, np.float32)}
    with pytest.raises(TypeError, match="stage norm .rms_norm.: its kernel model cannot take"):
        spec.kernel(Bounds(Model()), inputs, case)
