"""cases/inits.py: the input registry draws exactly what the closed `if init == ...` chain drew,
families extend it, a one-off init is a function, an op may draw its inputs whole, and an op
says which tensors the case's value distribution applies to."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import cases.inits as inits_mod
import oracle.spec
from cases.inits import init, inits
from cases.model import Case, make_inputs
from oracle.spec import OpSpec, TensorSpec
from tests.pinned_inputs import PINNED_INPUTS


def inputs_digest(inputs: dict) -> str:
    """Names, storage dtypes, shapes and bytes of every input, hashed."""
    h = hashlib.sha256()
    for name in sorted(inputs):
        a = np.ascontiguousarray(inputs[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


# --- the existing inits, bit for bit ------------------------------------------------------------

def test_pinned_cases_keep_their_ids_and_inputs():
    """95 gate cases of every op (each dist, dtype and param set): the same id and the same
    input bytes as on the code before the registry (tests/pinned_inputs.py)."""
    wrong = []
    for op, dims, dtype, dist, seed, params, case_id, digest in PINNED_INPUTS:
        case = Case.make(op, dims, dtype, dist, seed, params)
        if case.id != case_id or inputs_digest(make_inputs(case)) != digest:
            wrong.append(f"{case_id} {case.short()}")
    assert not wrong, wrong
    assert len({row[0] for row in PINNED_INPUTS}) == 10  # every op of 43a6b26


def test_builtin_inits_are_registered():
    names = set(inits())
    assert {"data", "activation", "weight", "gate", "codes", "qscale", "qbias"} <= names
    assert inits()["data"].adversarial and inits()["activation"].adversarial
    assert not inits()["weight"].adversarial


def test_unknown_init_names_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown tensor init 'wieght'; registered: .*weight"):
        inits_mod.resolve("wieght")


def test_init_names_are_unique_and_colon_free():
    with pytest.raises(ValueError, match="registered twice"):
        init("weight")(lambda *a: None)
    with pytest.raises(ValueError, match="reserved for param:NAME"):
        init("param:x")


def test_param_init_names_a_missing_param():
    case = Case.make("rms_norm", {"rows": 1, "n": 8}, "f32")
    with pytest.raises(ValueError, match="no param 'expert'; its params: .*eps"):
        inits_mod.resolve("param:expert").fn((1,), "u32", None, case, {})


# --- a family's inits, one-offs, whole-op generation ----------------------------------------------

def _op(name: str, inputs: tuple, **extra) -> OpSpec:
    """A toy op over `inputs`: out = the first input."""
    first = inputs[0].name
    return OpSpec(name=name, family="test", dims=("rows", "n"), inputs=inputs,
                  outputs=(TensorSpec("out", lambda d: (d["rows"], d["n"])),),
                  oracle=lambda i, c: {"out": np.asarray(i[first]).astype(np.float64)},
                  tolerance=lambda i, e, c: {"out": 0.0}, bytes=lambda c: 0, flops=lambda c: 0,
                  **extra)


@pytest.fixture
def registries(monkeypatch):
    """Fresh copies of the op and init registries: what a test registers is gone after it."""
    oracle.spec.registry()
    monkeypatch.setattr(inits_mod, "_INITS", dict(inits_mod._INITS))

    def register(spec: OpSpec) -> OpSpec:
        monkeypatch.setitem(oracle.spec._REGISTRY, spec.name, spec)
        return spec

    return register


ROWS_N = lambda d: (d["rows"], d["n"])  # noqa: E731


def test_a_family_init_reads_the_case_and_the_inputs_drawn_before_it(registries):
    """A page-table-like tensor follows per-row lengths drawn before it: `drawn` holds them,
    stored, and is read-only."""

    @init("test_lengths")
    def lengths(shape, dtype, rng, case, drawn):
        return rng.integers(1, case.dims["n"] + 1, shape)

    @init("test_mask")
    def mask(shape, dtype, rng, case, drawn):
        with pytest.raises(TypeError):
            drawn["lengths"] = None  # read-only
        return (np.arange(shape[-1]) < drawn["lengths"][:, None]).astype(np.float64)

    registries(_op("toy_paged", (TensorSpec("lengths", lambda d: (d["rows"],), role="i32",
                                            init="test_lengths"),
                                 TensorSpec("mask", ROWS_N, init="test_mask"))))
    got = make_inputs(Case.make("toy_paged", {"rows": 5, "n": 16}, "bf16", seed=1))
    assert got["lengths"].dtype == np.int32
    np.testing.assert_array_equal(got["mask"].astype(np.float64).sum(axis=1), got["lengths"])


def test_a_function_init_and_one_already_in_storage_dtype(registries):
    """A one-off init is a function; an array it returns in the storage dtype is kept bit for
    bit (codes), float64 values are rounded RNE; a wrong shape is named."""
    codes = np.arange(12, dtype=np.uint8).reshape(3, 4) | 0x80

    registries(_op("toy_oneoff", (
        TensorSpec("x", ROWS_N, init=lambda shape, dtype, rng, case, drawn: np.full(shape, 1 / 3)),
        TensorSpec("q", ROWS_N, role="u8", init=lambda shape, dtype, rng, case, drawn: codes))))
    got = make_inputs(Case.make("toy_oneoff", {"rows": 3, "n": 4}, "bf16"))
    assert np.all(got["x"].astype(np.float64) == 0.333984375)  # bf16 RNE of 1/3
    assert got["q"].tobytes() == codes.tobytes()
    with pytest.raises(ValueError, match=r"toy_oneoff.q: init '<lambda>' gave shape \(3, 4\), "
                                         r"the tensor's is \(2, 4\)"):
        make_inputs(Case.make("toy_oneoff", {"rows": 2, "n": 4}, "bf16"))


def test_adversarial_says_which_tensors_take_the_distribution(registries):
    """Two `data` tensors under `zero_rows`: the adversarial one (the default) has its zero rows,
    the one with adversarial=False is drawn `normal`; a one-off init takes the distribution only
    when its tensor says adversarial=True."""
    from cases.distributions import values

    taken = {}

    def one_off(shape, dtype, rng, case, drawn, dist):
        taken["dist"] = dist
        return values(dist, shape, dtype, rng)

    registries(_op("toy_adv", (TensorSpec("x", ROWS_N),
                               TensorSpec("ids", ROWS_N, adversarial=False),
                               TensorSpec("z", ROWS_N, init=one_off, adversarial=True))))
    got = make_inputs(Case.make("toy_adv", {"rows": 6, "n": 8}, "f32", "zero_rows"))
    assert np.all(got["x"][::3] == 0) and np.all(got["z"][::3] == 0)
    assert np.all(got["ids"] != 0) and taken["dist"] == "zero_rows"


def test_adversarial_on_an_init_without_a_distribution_is_refused(registries):
    registries(_op("toy_bad_adv", (TensorSpec("w", ROWS_N, init="weight", adversarial=True),)))
    with pytest.raises(ValueError, match=r"toy_bad_adv.w: adversarial=True, but init 'weight' "
                                         r"takes no value distribution"):
        make_inputs(Case.make("toy_bad_adv", {"rows": 2, "n": 4}, "f32", "tiny"))


def test_an_op_may_derive_its_inputs_from_raw_draws_and_plant_still_applies(registries):
    """`OpSpec.make_inputs(case, raw)` derives the inputs from the tensors of `raw_inputs`,
    which the case layer draws by their inits (here: keys L2-normalised per row, v as drawn);
    `plant` runs after it; a missing or extra name is refused."""

    def whole(case, raw):
        k = raw["k_raw"].astype(np.float64)
        return {"k": k / np.linalg.norm(k, axis=-1, keepdims=True), "v": raw["v"]}

    def plant(inputs, case):
        return {**inputs, "v": inputs["v"].copy() * 0}

    spec = registries(_op("toy_whole", (TensorSpec("k", ROWS_N), TensorSpec("v", ROWS_N)),
                          make_inputs=whole, plant=plant,
                          raw_inputs=(TensorSpec("k_raw", ROWS_N), TensorSpec("v", ROWS_N))))
    case = Case.make("toy_whole", {"rows": 4, "n": 64}, "f32", seed=2)
    got = make_inputs(case)
    np.testing.assert_allclose(np.linalg.norm(got["k"].astype(np.float64), axis=-1), 1, rtol=1e-6)
    assert got["k"].dtype == np.float32 and np.all(got["v"] == 0)
    assert spec.raw_inputs[0].name == "k_raw"

    registries(_op("toy_missing", (TensorSpec("k", ROWS_N), TensorSpec("v", ROWS_N)),
                   make_inputs=lambda case, raw: {"k": np.zeros((1, 1))}))
    with pytest.raises(ValueError, match=r"make_inputs returned \['k'\], the op's inputs are "
                                         r"\['k', 'v'\]"):
        make_inputs(Case.make("toy_missing", {"rows": 1, "n": 1}, "f32"))
