"""An op that a plugin brings gets every registry-driven test, with no edit (issue 51 item 4).

Each test writes a plugin to a temporary folder and installs it the way a kernel repository's is
installed: a dist-info on sys.path whose `kparity.plugins` entry point names the plugin's
`register` (`examples/kparity-example-plugin/` in miniature). `register` declares a new op in a
new family, `kp_test_bilinear` (out = x · y, a GLU without its activation): its oracle and
kernel model, its gate cases, a correct torch impl with a contract (`n <= 4096`) and a mutant
that reads y's row 0 for every row (a row stride of 0). kparity discovers the plugin as in a
fresh process, the first time something lists the impls. Then, with no file of kparity or of its
tests edited:

* corners: `tests/test_bounds_corners.py` lists the op and its family; the correctly rounded
  answer and the worst admissible kernel stay within its bound on every corner, under FTZ too;
  every bound term its kernel model charges is needed (round, sub, store) and the two it never
  charges (sum, func) are reported as skips;
* contracts: `tests/test_contracts.py` lists its impls and its invariant's violating case, which
  is refused before launch naming the invariant; every planned valid case is admitted;
* gate: `kparity check --op kp_test_bilinear` passes the impl and fails the mutant, naming a
  failing case's id and its repro line; the GPU gate's work (`tests/test_gpu.py`) holds the
  impl's cases and none of the mutant's;
* bite: `kparity bite --op kp_test_bilinear` audits the plugin's impl and catches every generic
  mistake that fits the op;
* collection: a fresh `pytest --collect-only` with the plugin installed collects the op's
  corner, term and contract tests.

The parameter lists come from the test modules themselves, imported anew once the plugin is
loaded (as pytest collects them in a process where it is installed), and the tests run on them:
a list kept by hand in one of those modules makes this file fail. Every registry is restored
afterwards.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.dataset as ds
import pytest

import cases.registry
import gpu_impls
import oracle.spec
from cases.generate import Work, plan
from verbs.cli import main

ROOT = Path(__file__).resolve().parent.parent
OP, FAMILY = "kp_test_bilinear", "kp_test_glu"
GOOD, MUTANT = f"torch:{OP}", f"torch:mutant_{OP}_row0"
MODULE = "kp_test_plugin_bilinear"
ENTRY_POINT = f"bilinear = {MODULE}:register"

PLUGIN = textwrap.dedent(f'''\
    """A kernel repository's kparity plugin: one new op, its gate cases, an impl and a mutant."""

    from itertools import product

    from cases.distributions import DISTRIBUTIONS
    from cases.model import Case
    from cases.registry import gate_cases
    from gpu_impls import register as register_impls
    from gpu_impls.contract import Contract, Invariant
    from gpu_impls.impl import Impl
    from oracle.builders import elementwise_op, kernel_view
    from oracle.dtypes import FLOAT_DTYPES

    OP = {OP!r}


    def bilinear(inputs, case):
        """out = x * y, the bilinear GLU (a GLU without its activation), in float64."""
        v = kernel_view(inputs, case)
        return {{"out": v["x"] * v["y"]}}


    def bilinear_kernel(A, inputs, case):
        """The kernel: x and y read as f32, one f32 product, the store to T."""
        v = kernel_view(inputs, case)
        return {{"out": A.load(v["x"]) * A.load(v["y"])}}


    def bilinear_cases():
        return [Case.make(OP, dims, dtype, dist, label="edge")
                for dims, dtype, dist in product(({{"rows": 4, "n": 256}}, {{"rows": 3, "n": 33}}),
                                                 FLOAT_DTYPES, DISTRIBUTIONS)]


    def f32_product(launch, inputs, outputs, case):
        x, y = inputs["x"], inputs["y"]
        return {{"out": (x.float() * y.float()).to(x.dtype)}}


    def row0_product(launch, inputs, outputs, case):
        x, y = inputs["x"], inputs["y"]
        return {{"out": (x.float() * y[:1].float()).to(x.dtype)}}


    ONE_BLOCK = Contract(invariants=(Invariant(
        "n <= 4096", lambda ns: ns["n"] <= 4096, "a row is one block of 1024 threads, 4 each",
        lambda ns: "n = 4096", violation={{"n": 4100}}, shows=("n",)),))


    def register():
        elementwise_op(OP, {FAMILY!r}, ("x", "y"), bilinear, bilinear_kernel, flops_per_elem=1,
                       doc=bilinear.__doc__, chain_input="x")
        gate_cases(OP)(bilinear_cases)
        register_impls(
            Impl(OP, "torch", OP, f32_product, ONE_BLOCK, doc="x * y in f32, rounded to T"),
            Impl(OP, "torch", "mutant_" + OP + "_row0", row0_product,
                 doc="y's row 0 for every row (a row stride of 0)"))
    ''')


def install(site: Path) -> None:
    """The plugin as an installed distribution `kp-test-plugin` under `site`."""
    info = site / "kp_test_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kp-test-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[kparity.plugins]\n{ENTRY_POINT}\n")
    (site / f"{MODULE}.py").write_text(PLUGIN)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plugin installed, not yet loaded: kparity finds it as a fresh process does, the next
    time it lists the impls. Every registry (impls, ops, cases) is restored afterwards."""
    gpu_impls.impls()  # builtins and the entry points installed for real, before the copies
    oracle.spec.registry()
    cases.registry.sources()
    for module, names in ((gpu_impls, ("_IMPLS", "_ORIGINS", "_PLUGIN_FILES", "_ENTRY_POINTS")),
                          (oracle.spec, ("_REGISTRY",)),
                          (cases.registry, ("_SOURCES", "_BENCH"))):
        for name in names:
            monkeypatch.setattr(module, name, type(getattr(module, name))(getattr(module, name)))
    monkeypatch.setattr(gpu_impls, "_loaded", False)
    monkeypatch.setenv("KPARITY_CACHE", "off")  # no oracle entries of a temporary op on disk
    install(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield tmp_path / "site"
    for name in [m for m in sys.modules if m == MODULE or m.startswith("kp_test_fresh_")]:
        del sys.modules[name]


@pytest.fixture
def loaded(plugin):
    """The plugin loaded through its entry point, as any listing of the impls loads it."""
    assert GOOD in gpu_impls.impls() and MUTANT in gpu_impls.impls()
    assert gpu_impls.origin(GOOD) == f"entry point {ENTRY_POINT} (kp-test-plugin 0.1)"
    spec = oracle.spec.registry()[OP]
    assert spec.family == FAMILY and spec.kernel is not None
    assert OP in cases.registry.sources()


def fresh(name: str):
    """tests/NAME.py imported anew: its parameter lists built from the registry as it is now."""
    spec = importlib.util.spec_from_file_location(f"kp_test_fresh_{name}",
                                                  Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def argvalues(test, argnames: str) -> list:
    """The values pytest collects `test` over for `argnames` (its parametrize mark; a
    pytest.param's values unwrapped)."""
    [mark] = [m for m in test.pytestmark if m.name == "parametrize"
              and m.args[0].replace(" ", "") == argnames.replace(" ", "")]
    values = []
    for v in mark.args[1]:
        if hasattr(v, "marks"):  # pytest.param(...)
            v = v.values if "," in argnames else v.values[0]
        values.append(v)
    return values


def test_the_corner_and_every_term_tests_take_it_up(loaded):
    """The op and its family in tests/test_bounds_corners.py's lists; its corners within its
    bound in every dtype and declared order, under FTZ too; each term its model charges needed,
    the two it never charges skipped."""
    corners = fresh("test_bounds_corners")
    passes = corners.test_correct_and_worst_admissible_kernels_pass
    assert OP in argvalues(passes, "op") and corners.FAMILIES[FAMILY] == [OP]
    for orders in argvalues(passes, "orders"):
        for dtype in argvalues(passes, "dtype"):
            passes(OP, dtype, orders)
    assert OP in argvalues(corners.test_under_ftz_correct_and_worst_admissible_kernels_pass, "op")
    corners.test_under_ftz_correct_and_worst_admissible_kernels_pass(OP, ("any", "sequential"))

    terms = [t for f, t in argvalues(corners.test_every_bound_term_is_needed, "family, term")
             if f == FAMILY]
    assert terms == list(corners.TERMS)
    outcome = {}
    for term in terms:
        try:
            corners.test_every_bound_term_is_needed(FAMILY, term)
            outcome[term] = "needed"
        except pytest.skip.Exception as e:
            assert "charge no" in str(e)
            outcome[term] = "charged nowhere"
    assert outcome == {"round": "needed", "sum": "charged nowhere", "func": "charged nowhere",
                       "sub": "needed", "store": "needed"}


def test_the_contract_tests_take_it_up(loaded):
    """Its impls and its invariant's violating case in tests/test_contracts.py's lists, and
    those tests pass on them."""
    contracts = fresh("test_contracts")
    assert GOOD in argvalues(contracts.test_one_violating_case_per_invariant, "impl_id")
    assert {GOOD, MUTANT} <= set(argvalues(contracts.test_every_planned_valid_case_is_admitted,
                                           "impl_id"))
    violations = [w for i, w in argvalues(
        contracts.test_violating_case_rejected_with_named_invariant, "impl_id, work") if i == GOOD]
    assert [w.invariant for w in violations] == ["n <= 4096"]
    contracts.test_one_violating_case_per_invariant(GOOD)
    contracts.test_violating_case_rejected_with_named_invariant(GOOD, violations[0])
    contracts.test_violating_case_rejected_before_launch(GOOD, violations[0])
    contracts.test_valid_case_reaches_launch_with_derived_geometry(GOOD)
    for impl_id in (GOOD, MUTANT):
        contracts.test_every_planned_valid_case_is_admitted(impl_id)


def test_the_gate_passes_the_impl_and_fails_the_mutant_naming_a_case(plugin, tmp_path,
                                                                      capsys):
    """`kparity check --op`: the impl passes every valid case and refuses its violating one;
    the mutant fails, the output naming a failing case's id and its repro line."""
    store = tmp_path / "store"
    assert main(["--store", str(store), "check", "--op", OP, "--show-failures", "1"]) == 1
    out = capsys.readouterr().out
    rows = ds.dataset(str(store / "correctness"), format="parquet").to_table().to_pylist()
    good = {(r["expect"], r["status"]) for r in rows if r["impl"] == GOOD}
    assert good == {("valid", "pass"), ("rejected", "rejected")}
    failed = [r["case_id"] for r in rows if r["impl"] == MUTANT and r["status"] == "fail"]
    assert failed and any(f"FAIL {MUTANT} case {c}" in out for c in failed), out
    assert any(f"repro {c} --impl {MUTANT}" in out for c in failed), out


def test_the_gpu_gate_lists_the_impl_and_not_its_mutant(loaded, monkeypatch):
    """The GPU gate's work, were the torch backend an accelerator: the impl's commit-tier
    cases; each passes `test_gate`, and the mutant fails it on a case, naming the case."""
    gate = fresh("test_gpu")
    monkeypatch.setattr(gate, "_on_accelerator", lambda impl: impl.op == OP)
    gate._gpu_work.cache_clear()  # planned once per process: the module's import planned it
    work = gate._gpu_work()
    impls = gpu_impls.impls()
    assert [(w.impl.id, w.case.id) for w in work] == [
        (w.impl.id, w.case.id) for w in plan([impls[GOOD]], tier="commit")]

    class NoPrefetch:
        def wait(self, w):
            return None

    for w in work:
        gate.test_gate(w, NoPrefetch())
    case = next(w.case for w in work if w.expect == "valid" and w.case.dist == "normal")
    with pytest.raises(AssertionError, match=f"(?s)fail {MUTANT} case {case.id} .*repro:"):
        gate.test_gate(Work(impls[MUTANT], case, "valid"), NoPrefetch())


def test_the_bite_audit_takes_it_up(plugin, capsys):
    """`kparity bite --op`: the op is known (the plugins load before the filter is checked),
    its plugin's impl is its reference, and each generic mistake that fits is caught."""
    assert main(["bite", "--op", OP, "--dtype", "f32"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"bite: {OP} via {GOOD}:" in out and ", 0 uncaught and not admitted" in out, out


def test_a_fresh_pytest_collects_its_tests(plugin):
    """In a new process with the plugin installed, pytest collects the op's tests (the
    plugins load before collection: tests/conftest.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not a worker
    env.update(PYTHONPATH=os.pathsep.join([str(plugin), str(ROOT)]), KPARITY_CACHE="off")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
         "-k", "kp_test", "tests/test_bounds_corners.py", "tests/test_contracts.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    ids = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    for wanted in (f"test_correct_and_worst_admissible_kernels_pass[f32-{OP}-any+sequential]",
                   f"test_under_ftz_correct_and_worst_admissible_kernels_pass[{OP}-any+sequential]",
                   f"test_every_bound_term_is_needed[{FAMILY}-round]",
                   f"test_violating_case_rejected_before_launch[{GOOD}:n <= 4096]",
                   f"test_every_planned_valid_case_is_admitted[{MUTANT}]"):
        assert any(i.endswith(wanted) for i in ids), (wanted, ids)
