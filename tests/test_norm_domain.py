"""Issue 49, item 4: eps = 0 with `tiny` data is outside the RMSNorm family's domain.

There every f32 square rounds to 0, mean(x²) + eps = 0, and a correct kernel's rsqrt gives inf
against the oracle's finite value (`oracle/norms.py`, "Domain"): the case is refused, naming eps
and the fix, not failed. Nothing else is refused: eps > 0 on the same data, eps = 0 on any other
data or in f16, and every generated gate case still run."""

from __future__ import annotations

import json

import pytest

from cases.generate import gate_cases
from cases.model import Case
from cases.tiers import case_cost
from oracle.spec import get_op, registry
from results.store import Store
from verbs.cli import main

ISSUE = {"op": "rms_norm", "dims": {"rows": 7, "n": 576}, "dtype": "f32", "dist": "tiny",
         "params": {"eps": 0.0}}
# The ops that take eps (the RMSNorm family and the fused RMSNorm + GEMV), from the registry: a
# new one is held to the same rule without an edit here; each at its cheapest gate case's dims.
FAMILY = {op: min(gate_cases(op), key=case_cost).dims for op, spec in sorted(registry().items())
          if "eps" in spec.params}


def _check(tmp_path, cases, *extra):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    store = tmp_path / "store"
    # the builtin torch RMSNorm by name: plugins other tests loaded in this process (mutants,
    # planted faults) register torch impls of the same op, which would fail on purpose
    rc = main(["--store", str(store), "check", "--cases", str(path), "--impl", "torch:rms_norm",
               "--isolate", "none", *extra])
    return rc, store


def _statuses(store, impl="torch:rms_norm"):
    rows = Store(store).read("correctness").to_pylist()
    return sorted(r["status"] for r in rows if r["impl"] == impl)


def test_the_issue_case_is_refused_at_load_with_exit_2_naming_eps(tmp_path, capsys):
    rc, store = _check(tmp_path, [ISSUE])
    out = capsys.readouterr().out
    assert rc == 2, out[-2000:]
    error = out[out.index("error:"):]  # impl-skip notes come before it
    assert "case 0 (rms_norm)" in error
    assert "eps = 0.0 with dist tiny in f32" in error
    assert "use eps > 0 (e.g. 1e-6" in error
    assert len([line for line in error.splitlines() if line.strip()]) <= 2
    assert Store(store).read("correctness").num_rows == 0  # nothing ran


def test_the_same_case_with_eps_1e_6_runs_and_passes_on_torch(tmp_path, capsys):
    case = {**ISSUE, "params": {"eps": 1e-6}}
    rc, store = _check(tmp_path, [case])
    out = capsys.readouterr().out
    assert rc == 0, out[-2000:]
    assert _statuses(store) == ["pass"]


def test_eps_0_on_data_whose_squares_stay_in_range_runs_and_passes(tmp_path, capsys):
    """No over-refusal: eps = 0 with normal or zero-row f32 data, and with tiny f16 data
    (mean(x²) ~ 2^-24, a normal f32), is in the domain and a correct kernel passes it."""
    cases = [{**ISSUE, "dist": "normal"}, {**ISSUE, "dist": "zero_rows"},
             {**ISSUE, "dtype": "f16"}]
    rc, store = _check(tmp_path, cases)
    out = capsys.readouterr().out
    assert rc == 0, out[-2000:]
    assert _statuses(store) == ["pass"] * 3


def _case(op, dtype, dist="tiny", **params):
    return Case.make(op, FAMILY[op], dtype, dist, params={"eps": 0.0, **params})


@pytest.mark.parametrize("op", sorted(FAMILY))
def test_every_eps_op_of_the_family_refuses_eps_0_tiny_in_f32_and_bf16(op):
    for dtype in ("f32", "bf16"):
        why = get_op(op).domain_error(_case(op, dtype))
        assert f"{op}: eps = 0.0 with dist tiny" in why and "use eps > 0" in why, (op, dtype)
    # f16's tiny (4 · 2^-14) squares to a normal f32: in the domain, except gated_mixer_norm,
    # whose normed y is f32 in every case (its tiny is f32's)
    f16 = get_op(op).domain_error(_case(op, "f16"))
    assert bool(f16) == (op == "gated_mixer_norm"), f16
    for dist in ("normal", "zero_rows", "outlier_rows", "constant_rows", "nonfinite"):
        assert get_op(op).domain_error(_case(op, "f32", dist)) == "", dist
    assert get_op(op).domain_error(_case(op, "f32", eps=1e-6)) == ""


def test_eps_is_read_as_the_kernel_reads_it():
    """f32(eps) = 0 is eps = 0; a subnormal eps is 0 only to a flushing (ftz) kernel."""
    assert "(0 as the kernel reads it)" in get_op("rms_norm").domain_error(
        _case("rms_norm", "f32", eps=1e-46))
    assert get_op("rms_norm").domain_error(_case("rms_norm", "f32", eps=1e-40)) == ""
    assert get_op("rms_norm").domain_error(_case("rms_norm", "f32", eps=1e-40, ftz=1))


@pytest.mark.parametrize("op", sorted(FAMILY))
def test_no_generated_gate_case_is_refused(op):
    cases = gate_cases(op)
    assert cases and get_op(op).domain is not None
    refused = [(c.short(), c.params) for c in cases if get_op(op).domain_error(c)]
    assert refused == [], refused[:5]
    # the loop covers the rule's neighbourhood: tiny data (with eps > 0) is generated, in f32
    # (rms_norm_qgemv's gate draws tiny only in f16)
    assert any(c.dist == "tiny" and c.dtype == ("f16" if op == "rms_norm_qgemv" else "f32")
               for c in cases)

