"""Issue 49, item 4: parameters outside an op's domain are refused with the reason (at load, a
case file names the field), not failed by a correct impl. The RMSNorm family's eps = 0 rule:
tests/test_norm_domain.py."""

from __future__ import annotations

import json

from cases.generate import gate_cases
from cases.model import Case
from oracle.spec import get_op
from verbs.cli import main


def test_clipped_swiglu_refuses_a_clamp_bound_that_is_not_a_positive_finite_f32():
    """limit <= 0 inverts the clip (numpy and torch then give the upper bound everywhere), inf
    or NaN voids it; alpha must be finite. The defaults and any positive limit are in."""
    def why(**params):
        return get_op("clipped_swiglu").domain_error(
            Case.make("clipped_swiglu", {"rows": 2, "n": 64}, "f32", params=params))

    for bad in (0.0, -1.0, float("inf"), float("nan"), 1e39):  # 1e39: inf in f32
        assert "limit = " in why(limit=bad) and "> 0 in f32" in why(limit=bad), bad
    assert "alpha = " in why(alpha=float("inf"))
    assert why() == "" and why(limit=0.5, alpha=-1.0) == ""
    assert all(get_op("clipped_swiglu").domain_error(c) == ""
               for c in gate_cases("clipped_swiglu"))



def _decode(**params):
    return Case.make("sdpa_decode", {"batch": 2, "heads": 4, "kv_heads": 2, "head_dim": 64,
                                     "max_len": 64}, "f32", params=params)


def test_attention_counts_are_zero_or_more():
    """window, sink_end and splits count keys or splits; -3 is no count (a window of -3 made
    torch's mask and the oracle disagree: a correct torch impl failed)."""
    for name in ("window", "sink_end", "splits"):
        why = get_op("sdpa_decode").domain_error(_decode(**{name: -3}))
        assert f"{name} = -3 must be 0 or more" in why, name
        assert get_op("sdpa_decode").domain_error(_decode(**{name: 1000})) == ""
    for op in ("sdpa_decode", "sdpa_decode_paged", "sdpa_prefill_varlen"):
        assert all(get_op(op).domain_error(c) == "" for c in gate_cases(op)), op


def test_a_case_file_with_a_negative_window_exits_2_naming_it(tmp_path, capsys):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([{"op": "sdpa_decode", "dtype": "f32", "params": {"window": -3},
                                 "dims": {"batch": 2, "heads": 4, "kv_heads": 2,
                                          "head_dim": 64, "max_len": 64}}]))
    assert main(["--store", str(tmp_path / "s"), "check", "--cases", str(path)]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "field 'params.window'" in out and "window = -3 must be 0 or more" in out
