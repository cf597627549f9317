"""cases: stable content-hash ids, deterministic dtype-rounded inputs, the promises each value
distribution makes, gate-case coverage, and the Case JSON round trip."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cases.distributions import DISTRIBUTIONS
from cases.generate import gate_cases, plan
from cases.inits import draw
from cases.model import Case, make_inputs
from cases.registry import sources
from oracle.dtypes import FLOAT_DTYPES, round_to, tiny

# Computed once from this exact case and pasted: a change to the id hashing (key fields, JSON
# layout, hash, truncation) changes it and invalidates every stored result, so it must be loud.
PINNED = Case.make("rms_norm", {"rows": 7, "n": 4096}, "bf16", "normal", seed=0,
                   params={"eps": 1e-6, "weight_offset": 0, "rounding": "once"})
PINNED_ID = "e89bc529dc8c"  # oracle version 2 (issue 34: bf16 rounding, derived bounds)


def rows_of(a: np.ndarray) -> np.ndarray:
    """View a tensor as [rows, last axis] in float64."""
    a = a.astype(np.float64)
    return a.reshape(-1, a.shape[-1])


def data_case(dtype: str, dist: str, n: int = 1024, rows: int = 9, op: str = "rms_norm") -> Case:
    return Case.make(op, {"rows": rows, "n": n}, dtype, dist, seed=11)


# --- ids -----------------------------------------------------------------------------------------

def test_case_id_is_pinned():
    """The id of a fixed case is a fixed string, across processes and machines."""
    assert PINNED.id == PINNED_ID


def test_case_id_independent_of_dict_order():
    """Dims and params are sorted into the key: insertion order must not change the id."""
    again = Case.make("rms_norm", {"n": 4096, "rows": 7}, "bf16", "normal", seed=0,
                      params={"rounding": "once", "weight_offset": 0, "eps": 1e-6})
    assert again.id == PINNED_ID


def test_case_id_changes_with_every_defining_field():
    """Seed, dtype, dist, dims and params each change the id (no two of these collide)."""
    variants = [
        PINNED,
        Case.make("rms_norm", {"rows": 7, "n": 4096}, "bf16", "normal", seed=1,
                  params=dict(PINNED.param_items)),
        Case.make("rms_norm", {"rows": 7, "n": 4096}, "f16", "normal", seed=0,
                  params=dict(PINNED.param_items)),
        Case.make("rms_norm", {"rows": 7, "n": 4096}, "bf16", "tiny", seed=0,
                  params=dict(PINNED.param_items)),
        Case.make("rms_norm", {"rows": 7, "n": 4097}, "bf16", "normal", seed=0,
                  params=dict(PINNED.param_items)),
        PINNED.replace(rounding="normed"),
        PINNED.replace(eps=1e-5),
        Case.make("rms_inv", {"rows": 7, "n": 4096}, "bf16", "normal", seed=0),
    ]
    ids = [c.id for c in variants]
    assert len(set(ids)) == len(ids), ids


def test_label_does_not_affect_id_or_equality():
    """The label is metadata: one shape reached from two presets is one case."""
    a = PINNED.replace(label="preset:a")
    b = PINNED.replace(label="preset:b")
    assert a.label == "preset:a" and b.label == "preset:b"
    assert a.id == b.id == PINNED_ID
    assert a == b and hash(a) == hash(b)


def test_case_params_merge_op_defaults():
    """case.params = op defaults overridden by the case's own."""
    c = Case.make("rms_norm", {"rows": 1, "n": 8}, "f32", params={"eps": 1e-5})
    assert c.params == {"eps": 1e-5, "weight_offset": 0, "rounding": "once", "ftz": 0,
                        "overflow": "either"}


def test_case_json_round_trip():
    """from_json(to_json(c)) gives the same case, id and label."""
    c = Case.make("rms_norm_per_head", {"batch": 2, "tokens": 3, "heads": 4, "head_dim": 64},
                  "f16", "zero_rows", seed=42, params={"weight_offset": 1, "rounding": "normed"},
                  label="preset:gemma")
    back = Case.from_json(c.to_json())
    assert back == c
    assert back.id == c.id
    assert back.label == "preset:gemma"
    assert back.dims == {"batch": 2, "tokens": 3, "heads": 4, "head_dim": 64}
    assert back.params["weight_offset"] == 1 and back.params["rounding"] == "normed"


# --- make_inputs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_make_inputs_deterministic(dtype):
    """Two calls give bit-identical inputs; another seed gives different ones."""
    c = data_case(dtype, "normal")
    a, b = make_inputs(c), make_inputs(c)
    assert set(a) == {"x", "w"}
    for k in a:
        assert a[k].tobytes() == b[k].tobytes()
    other = make_inputs(Case.make(c.op, c.dims, dtype, "normal", seed=12))
    assert other["x"].tobytes() != a["x"].tobytes()


def test_make_inputs_storage_dtypes_and_shapes():
    """Activations come in the case dtype (bf16 as ml_dtypes.bfloat16); fixed-role tensors keep
    their role (gated_mixer_norm's y is f32 even in a bf16 case)."""
    c = Case.make("gated_mixer_norm", {"rows": 3, "n": 40}, "bf16", "normal", seed=1)
    inp = make_inputs(c)
    assert inp["y"].dtype == np.float32
    assert inp["z"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert inp["w"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert inp["y"].shape == (3, 40) and inp["z"].shape == (3, 40) and inp["w"].shape == (40,)
    f16 = make_inputs(data_case("f16", "normal"))
    assert f16["x"].dtype == np.float16 and f16["w"].dtype == np.float16


def test_make_inputs_are_rne_rounded_draws():
    """bf16 inputs are the RNE rounding of the float64 draw (seeded by the case id), not a
    truncation: redrawing with the same generator and rounding reproduces them bit for bit,
    while chopping the low bits of the f32 value differs on many elements."""
    c = data_case("bf16", "normal")
    x = make_inputs(c)["x"]
    raw = draw("data", "normal", (9, 1024), "bf16", np.random.default_rng(int(c.id, 16)), c.params)
    assert x.tobytes() == round_to(raw, "bf16").tobytes()
    chopped = (raw.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    assert np.mean(chopped != x.view(np.uint16)) > 0.2


# --- distributions -------------------------------------------------------------------------------

def test_normal_is_standard():
    """normal: N(0, 1), mean ~0 and std ~1 over ~37k draws."""
    x = rows_of(make_inputs(data_case("f32", "normal", n=4096))["x"])
    assert abs(x.mean()) < 0.03
    assert abs(x.std() - 1.0) < 0.03


def test_outlier_rows_scales_one_element_per_row_by_1000():
    """outlier_rows is the normal draw with exactly one element per row multiplied by 1000."""
    shape = (9, 512)
    base = draw("data", "normal", shape, "f32", np.random.default_rng(5), {})
    out = draw("data", "outlier_rows", shape, "f32", np.random.default_rng(5), {})
    changed = out != base
    np.testing.assert_array_equal(changed.sum(axis=1), np.ones(9))
    np.testing.assert_allclose(out[changed], 1000.0 * base[changed], rtol=1e-15)


def test_outlier_rows_dominate_after_rounding():
    """In a stored bf16 case each row's largest |x| is far above the rest (>= 30x the row's
    second largest), and the outlier sits at a different column in different rows."""
    x = np.abs(rows_of(make_inputs(data_case("bf16", "outlier_rows", n=2048))["x"]))
    top2 = np.sort(x, axis=1)[:, -2:]
    assert np.all(top2[:, 1] >= 30 * top2[:, 0]), top2
    assert len(set(np.argmax(x, axis=1))) > 1


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_f16_overflow_squares_overflow_f16(dtype):
    """f16_overflow: |x| in [250, 350] with both signs; the squares (nearly all individually,
    every row sum certainly) exceed f16's max 65504, so squaring in f16 gives inf."""
    x = rows_of(make_inputs(data_case(dtype, "f16_overflow"))["x"])
    assert np.all((np.abs(x) >= 250) & (np.abs(x) <= 350))
    assert (x > 0).any() and (x < 0).any()
    assert np.mean(x * x > 65504) > 0.9
    assert np.all((x * x).sum(axis=1) > 65504)
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(x[0, 0]) * np.float16(x[0, 0]) + np.float16(x[0, 1]) ** 2)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_tiny_values_live_near_the_smallest_normal(dtype):
    """tiny: N(0,1) x 4 x tiny(dtype): all nonzero and within ~30 tiny(dtype), some subnormal,
    every square underflows below tiny(dtype), and mean(x^2) is far below eps (eps decides)."""
    x = rows_of(make_inputs(data_case(dtype, "tiny"))["x"])
    t = tiny(dtype)
    assert np.all(np.abs(x) < 30 * t)
    assert np.mean(x != 0) > 0.99
    assert np.any((x != 0) & (np.abs(x) < t))  # subnormals present
    assert np.mean(np.abs(x) > t) > 0.5       # but mostly normals of order tiny
    assert np.all(x * x < t)
    assert np.all(np.mean(x * x, axis=1) < 0.1 * 1e-6)


@pytest.mark.parametrize("op, dims", [
    ("rms_norm", {"rows": 10, "n": 96}),
    ("rms_norm_per_head", {"batch": 2, "tokens": 3, "heads": 2, "head_dim": 64}),
])
def test_zero_rows_every_third_row(op, dims):
    """zero_rows: rows 0, 3, 6, ... all zero (on the row view of any shape); the others have no
    zeros."""
    x = rows_of(make_inputs(Case.make(op, dims, "bf16", "zero_rows", seed=2))["x"])
    zero = np.arange(x.shape[0]) % 3 == 0
    assert np.all(x[zero] == 0)
    assert np.all(x[~zero] != 0)
    assert (~zero).sum() >= 6


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_constant_rows_are_constant(dtype):
    """constant_rows: each row one value c_r, c_r ~ N(0,1), different between rows."""
    x = rows_of(make_inputs(data_case(dtype, "constant_rows"))["x"])
    np.testing.assert_array_equal(x, np.repeat(x[:, :1], x.shape[1], axis=1))
    assert len(np.unique(x[:, 0])) == x.shape[0]
    assert np.all(x[:, 0] != 0)


def test_weights_and_gates_by_role():
    """Weights ~ 1 + N(0, 0.1^2), or ~ N(0, 0.1^2) with weight_offset=1; gates ~ N(0, 2^2)."""
    llama = make_inputs(Case.make("gated_mixer_norm", {"rows": 64, "n": 2048}, "f32", seed=3))
    gemma = make_inputs(Case.make("rms_norm", {"rows": 1, "n": 8192}, "f32", seed=3,
                                  params={"weight_offset": 1}))
    w, wg, z = llama["w"].astype(np.float64), gemma["w"].astype(np.float64), llama["z"]
    assert abs(w.mean() - 1.0) < 0.01 and abs(w.std() - 0.1) < 0.01
    assert abs(wg.mean()) < 0.01 and abs(wg.std() - 0.1) < 0.01
    assert abs(z.std() - 2.0) < 0.05 and abs(z.mean()) < 0.05


def test_unknown_distribution_rejected():
    with pytest.raises(ValueError, match="unknown distribution"):
        draw("data", "uniform", (2, 4), "f32", np.random.default_rng(0), {})


# --- gate cases ----------------------------------------------------------------------------------

def test_rms_norm_gate_cases_cover_every_dtype_and_distribution():
    """Every dtype x distribution x rounding convention appears among rms_norm's gate cases."""
    cs = gate_cases("rms_norm")
    have = {(c.dtype, c.dist, c.params["rounding"]) for c in cs}
    want = {(d, s, r) for d in FLOAT_DTYPES for s in DISTRIBUTIONS for r in ("once", "normed")}
    assert want <= have, want - have
    assert len({c.id for c in cs}) == len(cs)  # deduplicated
    assert any(c.params["weight_offset"] == 1 for c in cs)  # a Gemma preset is in


def test_gate_cases_include_presets_and_edges():
    """Model presets (e.g. qwen3-8b n=4096) and tile-window edges (n = 4096 +- 2) are present."""
    cs = gate_cases("rms_norm")
    assert any(c.label == "preset:qwen3-8b" and c.dims["n"] == 4096 for c in cs)
    assert {4094, 4095, 4096, 4097, 4098} <= {c.dims["n"] for c in cs if c.label == "edge"}
    assert gate_cases("no_such_op") == []


# --- --seed: fresh data for every generated case -------------------------------------------------

def test_seed_0_leaves_every_gate_case_as_it_was():
    """The default seed changes nothing: every id stored before --seed existed still matches."""
    for op, source in sources().items():
        plain = list(dict.fromkeys(source()))  # the source's own cases, deduplicated
        assert [c.id for c in gate_cases(op, 0)] == [c.id for c in plain], op
        assert gate_cases(op) == gate_cases(op, 0), op


def test_seed_re_seeds_every_gate_case_deterministically():
    """--seed 7: each case is the same case (dims, dtype, dist, params, label) with its seed + 7,
    hence a new id; the same seed gives the same ids again; another seed gives other ids."""
    for op in sources():
        base, seeded = gate_cases(op), gate_cases(op, 7)
        assert len(seeded) == len(base), op
        for b, s in zip(base, seeded):
            assert s.seed == b.seed + 7 and s.label == b.label
            assert (s.dim_items, s.dtype, s.dist, s.param_items) == \
                   (b.dim_items, b.dtype, b.dist, b.param_items)
        assert not {c.id for c in seeded} & {c.id for c in base}, op
        assert [c.id for c in gate_cases(op, 7)] == [c.id for c in seeded], op
        assert not {c.id for c in gate_cases(op, 8)} & {c.id for c in seeded}, op


def test_seed_draws_fresh_inputs():
    """A re-seeded case's inputs differ from the unseeded case's, and repeat for that seed."""
    base = next(c for c in gate_cases("rms_norm") if c.dtype == "f32" and c.dist == "normal")
    seeded = base.with_seed(7)
    assert seeded.id != base.id and seeded.short().endswith("seed 7")
    a, b = make_inputs(seeded), make_inputs(base)
    assert a["x"].tobytes() != b["x"].tobytes()
    assert make_inputs(seeded)["x"].tobytes() == a["x"].tobytes()


def test_seed_is_added_so_cases_differing_in_seed_stay_distinct(monkeypatch):
    """A source whose cases differ only in seed keeps them apart under --seed (set, not added,
    would collapse them into one id and drop one)."""
    import cases.registry as registry

    sources()  # load the real sources first, so they cannot overwrite the stand-in
    one = Case.make("rms_norm", {"rows": 3, "n": 64}, "f32", label="edge")
    monkeypatch.setitem(registry._SOURCES, "rms_norm", lambda: [one, one.with_seed(1)])
    assert [c.seed for c in gate_cases("rms_norm", 5)] == [5, 6]


def test_plan_seeds_valid_and_violating_cases_alike():
    """`plan(seed=)` reaches both kinds of work, so a violating case is built on fresh data too."""
    import gpu_impls

    impl = gpu_impls.impls()["torch:rms_norm"]
    base, seeded = plan([impl], dtypes=["f32"]), plan([impl], dtypes=["f32"], seed=3)
    assert {w.expect for w in seeded} == {"valid", "rejected"}
    assert [(w.expect, w.case.label) for w in seeded] == [(w.expect, w.case.label) for w in base]
    assert all(w.case.seed == 3 for w in seeded)
    assert not {w.case.id for w in seeded} & {w.case.id for w in base}
    with pytest.raises(ValueError, match="seed -1"):
        gate_cases("rms_norm", -1)
