"""Issue 49: no case that cannot fail. A case whose output has no element compares nothing and
passes whatever the kernel does: a case file's is refused at load (exit 2, naming the dim at 0),
and no generator makes one."""

from __future__ import annotations

import json
import math

import pytest

from cases.casefile import CaseFileError, empty_output_error, load_cases
from cases.generate import gate_cases
from oracle.spec import registry
from results.store import Store
from verbs.cli import main

EMPTY = {"op": "rms_norm", "dims": {"rows": 0, "n": 576}, "dtype": "f32"}
GOOD = {"op": "rms_norm", "dims": {"rows": 3, "n": 576}, "dtype": "f32"}


def _file(tmp_path, cases, name="cases.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cases))
    return path


def _empty_outputs(case):
    return [t.name for t in case.spec.outputs if math.prod(t.shape_of(case)) == 0]


@pytest.mark.parametrize("op", sorted(registry()))
def test_no_generated_gate_case_has_an_empty_output(op):
    cases = gate_cases(op)
    vacuous = [(case.short(), _empty_outputs(case)) for case in cases if _empty_outputs(case)]
    assert not vacuous, f"{op}: gate cases whose outputs have no element: {vacuous[:5]}"
    # the loader's check agrees: every generated case passes it
    assert [c.short() for c in cases if empty_output_error(c)] == []


def test_the_over_every_op_check_sees_a_zero_row_case():
    """What the test above relies on: a generator's rows=0 case would be caught by both checks."""
    case = gate_cases("rms_norm")[0].replace(rows=0)
    assert _empty_outputs(case) == ["out"]
    field, why = empty_output_error(case)
    assert field == "dims.rows" and "rows must be at least 1" in why


def test_a_zero_row_case_file_is_refused_with_exit_2_naming_rows(tmp_path, capsys):
    path = _file(tmp_path, [GOOD, EMPTY])
    store = tmp_path / "store"
    assert main(["--store", str(store), "check", "--cases", str(path), "--backend", "torch",
                 "--isolate", "none"]) == 2
    out = capsys.readouterr().out
    assert "case 1 (rms_norm), field 'dims.rows'" in out
    assert "rows must be at least 1: with rows = 0 every output is empty" in out
    assert "the check cannot fail" in out and "case 0" not in out
    error = out[out.index("error:"):]  # impl-skip notes come before it
    assert len([line for line in error.splitlines() if line.strip()]) <= 2
    assert Store(store).read("correctness").num_rows == 0


@pytest.mark.parametrize("case, field, words", [
    (EMPTY, "dims.rows", "with rows = 0 every output is empty (out: shape (0, 576))"),
    ({**EMPTY, "dims": {"rows": 0, "n": 0}}, "dims", "n and rows must be at least 1"),
    ({**EMPTY, "dims": {"rows": 4, "n": 0}}, "dims.n", "n must be at least 1"),
    # one of two outputs empty is enough: the strict rule (any output, not every output)
    ({"op": "gdn_recurrent", "dtype": "f32", "dims": {"batch": 1, "tokens": 0, "heads_k": 1,
                                                     "heads_v": 2, "dim_k": 16, "dim_v": 8}},
     "dims.tokens", "the output o is empty"),
])
def test_an_empty_output_is_named_at_load(tmp_path, case, field, words):
    path = _file(tmp_path, [case])
    with pytest.raises(CaseFileError) as err:
        load_cases(path)
    text = str(err.value)
    assert text.startswith(f"{path}: case 0") and f"field {field!r}" in text and words in text
    assert "cannot fail" in text


def test_a_dim_at_0_that_the_domain_divides_by_is_refused_not_a_traceback(tmp_path):
    """moe_router's domain checks experts % groups: groups = 0 raised ZeroDivisionError."""
    path = _file(tmp_path, [{"op": "moe_router", "dtype": "f32",
                             "dims": {"tokens": 1, "experts": 8, "top_k": 2, "groups": 0}}])
    with pytest.raises(CaseFileError, match="field 'dims'.*groups at 0 divides by zero"):
        load_cases(path)


@pytest.mark.parametrize("case", [
    GOOD,
    # a dim at 0 that empties no output stays valid: in = 0 reduces over nothing (out = 0)
    {"op": "dequant_gemv", "dims": {"out": 32, "in": 0, "bits": 4, "group_size": 32},
     "dtype": "bf16"},
    # an empty input with every output non-empty stays valid: rms_inv reads no x at n = 0
    {"op": "rms_inv", "dims": {"rows": 4, "n": 0}, "dtype": "f32"},
])
def test_a_case_with_every_output_non_empty_still_loads(tmp_path, case):
    loaded, = load_cases(_file(tmp_path, [case]))
    assert loaded.dims == case["dims"] and _empty_outputs(loaded) == []


def test_a_generated_case_with_an_empty_optional_input_loads(tmp_path):
    """attn_combine without sinks has an empty `sinks` input: valid, as the rule says."""
    case = next(c for c in gate_cases("attn_combine")
                if any(math.prod(t.shape_of(c)) == 0 for t in c.spec.inputs))
    assert empty_output_error(case) is None
    loaded, = load_cases(_file(tmp_path, [json.loads(case.to_json())]))
    assert loaded.id == case.id


def test_the_ops_own_domain_reason_comes_before_the_empty_output_one(tmp_path):
    """Lengths that empty the output (q_lens of 0) are outside sdpa_prefill_varlen's domain:
    its own reason (1 <= q_len <= k_len) is what the user reads, checked before emptiness."""
    path = _file(tmp_path, [{"op": "sdpa_prefill_varlen", "dtype": "f32",
                             "dims": {"heads": 4, "kv_heads": 2, "head_dim": 64},
                             "params": {"q_lens": [0, 0], "k_lens": [8, 8]}}])
    with pytest.raises(CaseFileError, match=r"1 <= q_len <= k_len"):
        load_cases(path)

