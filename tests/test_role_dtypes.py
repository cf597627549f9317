"""Per-role dtypes (issue 24 item 2): a case names the dtype of a role its op declares, the id
holds it only when there is one, validation names the bad input and the valid choices, an fp8
input flows through make_inputs, the oracle, the torch backend and the check; and e2m1's
two-codes-per-byte packing round-trips."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import gpu_impls
from cases.casefile import CaseFileError, load_cases
from cases.generate import Work
from cases.model import Case, make_inputs
from oracle.dtypes import (DTYPES, check_dtype, dtype_name, pack_e2m1, round_to, storage_dtype,
                           unpack_e2m1)
from oracle.spec import OpSpec, TensorSpec
from runners.correctness import check
from tests import fp8_example
from tests.fp8_example import OP


@pytest.fixture
def example(monkeypatch):
    fp8_example.install(monkeypatch)
    return fp8_example


def case(dtype="bf16", dist="normal", n=64, **kw) -> Case:
    return Case.make(OP, {"n": n}, dtype, dist, seed=1, **kw)


# --- the case ------------------------------------------------------------------------------------

def test_role_dtypes_enter_the_id_only_when_given(example):
    """No dtypes, or the op's default ({"x8": "e4m3"}): one case, one id, no `dtypes` key (so
    the ids of cases without role dtypes are what they were). e5m2: another id, in the key,
    shown by short()."""
    plain, default, e5m2 = case(), case(dtypes={"x8": "e4m3"}), case(dtypes={"x8": "e5m2"})
    assert plain == default and plain.id == default.id and "dtypes" not in plain.key()
    assert e5m2.id != plain.id and e5m2.key()["dtypes"] == {"x8": "e5m2"}
    assert e5m2.short() == f"{OP}[n=64] bf16 x8=e5m2 normal seed 1"
    assert plain.short() == f"{OP}[n=64] bf16 normal seed 1"
    assert plain.dtype_of("x8") == "e4m3" and e5m2.dtype_of("x8") == "e5m2"
    assert e5m2.dtype_of("T") == "bf16" and e5m2.dtype_of("f32") == "f32"


def test_role_dtypes_survive_json_replace_and_reseeding(example):
    c = case(dtypes={"x8": "e5m2"})
    back = Case.from_json(c.to_json())
    assert back == c and back.id == c.id
    assert c.replace(n=128).dtypes == {"x8": "e5m2"}
    assert c.replace(dtypes={"x8": "e4m3"}) == case()  # back to the default: the plain case
    assert c.with_seed(9).dtypes == {"x8": "e5m2"}


def test_bad_roles_and_dtypes_are_named_with_the_valid_choices(example):
    with pytest.raises(ValueError, match=r"unknown dtype role 'kv' in dtypes; "
                                         r"fp8_dequant_scale's roles: x8 \(default e4m3\)"):
        case(dtypes={"kv": "e4m3"})
    with pytest.raises(ValueError, match=r"dtypes\['x8'\]: unknown dtype 'fp8'; valid: .*e5m2"):
        case(dtypes={"x8": "fp8"})
    with pytest.raises(ValueError, match=r"rms_norm declares no dtype roles \(OpSpec.roles\): "
                                         r"drop `dtypes`"):
        Case.make("rms_norm", {"rows": 1, "n": 8}, "f32", dtypes={"x8": "e4m3"})
    with pytest.raises(ValueError, match=r"case rms_norm: dtype: unknown dtype 'fp32'; valid: "):
        Case.make("rms_norm", {"rows": 1, "n": 8}, "fp32")


def test_an_op_declares_its_roles_and_their_defaults():
    """A tensor's role is "T", a dtype, or a role of OpSpec.roles; a role may not be named
    like a dtype; a default is "T" or a dtype."""
    base = dict(name="toy_roles", family="test", dims=("n",),
                outputs=(TensorSpec("out", lambda d: (d["n"],)),), oracle=lambda i, c: i,
                tolerance=lambda i, e, c: {}, bytes=lambda c: 0, flops=lambda c: 0)
    kv = (TensorSpec("kv", lambda d: (d["n"],), role="kv"),)
    with pytest.raises(ValueError, match=r"tensor kv has dtype role 'kv'; valid: 'T', a dtype "
                                         r"\(.*\) or a role of OpSpec.roles \(none declared\)"):
        OpSpec(inputs=kv, **base)
    with pytest.raises(ValueError, match="role 'e4m3' in roles is a dtype name"):
        OpSpec(inputs=kv, roles={"kv": "T", "e4m3": "T"}, **base)
    with pytest.raises(ValueError, match=r"roles\['kv'\] = 'fp8': the default must be 'T' or"):
        OpSpec(inputs=kv, roles={"kv": "fp8"}, **base)
    spec = OpSpec(inputs=kv + (TensorSpec("idx", lambda d: (d["n"],), role="i64"),),
                  roles={"kv": "T"}, **base)
    with pytest.raises(ValueError, match="pass the case, t.dtype"):
        spec.inputs[0].dtype("bf16")
    assert spec.inputs[1].dtype("bf16") == "i64"


def test_a_case_file_takes_role_dtypes(example, tmp_path):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([{"op": OP, "dims": {"n": 8}, "dtype": "f16",
                                 "dtypes": {"x8": "e5m2"}}]))
    (loaded,) = load_cases(path)
    assert loaded.dtypes == {"x8": "e5m2"} and loaded.label == "file:cases.json"
    stored_row = json.loads(case(dtypes={"x8": "e5m2"}).to_json())  # a stored row is an entry
    path.write_text(json.dumps([stored_row]))
    assert load_cases(path)[0].id == case(dtypes={"x8": "e5m2"}).id
    path.write_text(json.dumps([{"op": OP, "dims": {"n": 8}, "dtype": "f16",
                                 "dtypes": {"x4": "e2m1"}}]))
    with pytest.raises(CaseFileError, match=r"case 0 \(fp8_dequant_scale\), field 'dtypes': .*"
                                            r"unknown dtype role 'x4'"):
        load_cases(path)


# --- an fp8 input through the whole check ---------------------------------------------------------

def test_fp8_input_is_stored_in_its_role_dtype(example):
    """x is e4m3 by default, e5m2 when the case says so: RNE roundings of the same draw."""
    e4m3, e5m2 = make_inputs(case()), make_inputs(case(dtypes={"x8": "e5m2"}))
    assert e4m3["x"].dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert e5m2["x"].dtype == np.dtype(ml_dtypes.float8_e5m2)
    assert e4m3["scale"].dtype == np.float32 and e4m3["scale"].shape == (1,)
    assert example.SPEC.io_bytes(case()) == 64 * 1 + 4 + 64 * 2


def test_fp8_example_is_green_on_torch_cpu(example):
    """Every gate case of the example (T x fp8 format x distribution) passes `check`."""
    torch = gpu_impls.backend("torch")
    rows = [check(Work(example.IMPL, c, "valid"), torch) for c in example.gate_cases()]
    assert {c.dtype_of("x8") for c in example.gate_cases()} == {"e4m3", "e5m2"}
    assert [r["message"] for r in rows if r["status"] != "pass"] == []


def test_a_wrong_fp8_kernel_goes_red(example):
    """Reading x as the other fp8 format's bits is caught."""
    import dataclasses

    def misread(launch, inputs, outputs, case):
        import torch

        x = inputs["x"].view(torch.uint8).view(torch.float8_e5m2)
        outputs["out"].copy_(x.float() * inputs["scale"].float())

    impl = dataclasses.replace(example.IMPL, name="misread", run=misread)
    row = check(Work(impl, case(), "valid"), gpu_impls.backend("torch"))
    assert row["status"] == "fail", row["message"]


def test_the_contract_rejects_a_role_dtype_the_kernel_lacks(example):
    """The impl is built for x8 in e4m3 and e5m2: an e2m1 case is rejected before launch,
    naming the role and the choices."""
    bad = case(dtypes={"x8": "e2m1"})
    assert not example.IMPL.contract.admits(bad)
    row = check(Work(example.IMPL, bad, "valid"), gpu_impls.backend("torch"))
    assert row["status"] == "rejected"
    assert "`x8 dtype in ('e4m3', 'e5m2')` broken (x8=e2m1)" in row["message"]
    assert "dtypes={'x8': one of e4m3, e5m2}" in row["message"]


# --- the dtype registry ---------------------------------------------------------------------------

def test_every_dtype_crosses_the_torch_backend_bit_for_bit():
    torch = gpu_impls.backend("torch")
    for name in DTYPES:
        a = round_to(np.array([0.0, 0.5, 1.5, 4.0, 6.0]), name) if name != "ue8m0" else \
            round_to(np.array([0.5, 1.0, 4.0, 2.0 ** -20, 2.0 ** 30]), name)
        back = torch.to_host(torch.to_device(a), name)
        assert back.dtype == storage_dtype(name) and back.tobytes() == a.tobytes(), name


def test_registry_names_and_lookups():
    assert dtype_name(np.float32) == "f32" and dtype_name(storage_dtype("e4m3")) == "e4m3"
    assert dtype_name(np.float64) is None
    assert check_dtype("e2m1") == "e2m1"
    with pytest.raises(ValueError, match=r"x: unknown dtype 'fp4'; valid: f32, f16, bf16, e4m3"):
        check_dtype("fp4", "x")


# --- e2m1, two per byte ---------------------------------------------------------------------------

E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_pack_e2m1_low_nibble_first():
    """Byte j holds code 2j in its low nibble and code 2j+1 in its high nibble (the sign is a
    nibble's bit 3): [0.5, -6] -> 0x1 | 0xF << 4 = 0xF1."""
    packed = pack_e2m1(round_to(np.array([0.5, -6.0, 6.0, 1.0]), "e2m1"))
    assert packed.dtype == np.uint8 and packed.tolist() == [0xF1, 0x27]


def test_pack_unpack_round_trip():
    """Every pair of the 16 codes, and random arrays of any leading shape, come back bit for
    bit (-0 included)."""
    every = np.array([[a, b] for a in range(16) for b in range(16)], dtype=np.uint8)
    values = every.view(storage_dtype("e2m1"))
    assert unpack_e2m1(pack_e2m1(values)).view(np.uint8).tobytes() == every.tobytes()
    rng = np.random.default_rng(0)
    x = round_to(rng.choice(E2M1_VALUES, (3, 5, 8)) * rng.choice([-1, 1], (3, 5, 8)), "e2m1")
    packed = pack_e2m1(x)
    assert packed.shape == (3, 5, 4)
    assert unpack_e2m1(packed).tobytes() == x.tobytes()
    assert np.array_equal(pack_e2m1(unpack_e2m1(packed)), packed)


def test_pack_e2m1_refuses_odd_lengths_and_other_dtypes():
    with pytest.raises(ValueError, match=r"even length .* shape \(3,\)"):
        pack_e2m1(round_to(np.zeros(3), "e2m1"))
    with pytest.raises(ValueError, match=r"round first: round_to\(x, 'e2m1'\)"):
        pack_e2m1(np.zeros(4))
    with pytest.raises(ValueError, match="takes uint8 bytes"):
        unpack_e2m1(np.zeros(4, dtype=np.int32))
