"""Plugins and the CLI's conventions: --store/--plugin before or after the verb, --plugin as a
module name or a file, `kparity.plugins` entry points (a broken one named, the rest runs), where
each impl came from, `ops --matrix`, `cases --list` dims, `--help`. The example plugin package
(examples/kparity-example-plugin, installed by the README's Setup) is found by its entry point.
"""

from __future__ import annotations

import html
import importlib.metadata
import json
import re
import sys
import textwrap
import warnings

import pyarrow.dataset as ds
import pytest

import gpu_impls
from cases.generate import gate_cases, valid_cases
from verbs.cli import main, parser, verb_table

# A plugin registering a copy of torch:rms_norm under another name (cheap, correct).
COPY = textwrap.dedent("""\
    import dataclasses
    from gpu_impls import impls, register
    register(dataclasses.replace(impls()["torch:rms_norm"], name={name!r}))
    """)
SMALL = ("--preset", "qwen3-0.6b", "--dtype", "bf16", "--valid-only")


@pytest.fixture
def registry(monkeypatch):
    """The impl registry as it is now, restored after the test: plugins loaded here leave no
    impl behind for later tests."""
    gpu_impls.impls()  # builtins and installed entry points first: the copies start from them
    for name in ("_IMPLS", "_ORIGINS", "_PLUGIN_FILES", "_ENTRY_POINTS"):
        monkeypatch.setattr(gpu_impls, name, type(getattr(gpu_impls, name))(
            getattr(gpu_impls, name)))
    modules = set(sys.modules)
    yield
    for name in set(sys.modules) - modules:
        if name.startswith(("kp_test_", "kparity_plugin_kp_test_")):
            del sys.modules[name]


def _impls_in(store) -> set[str]:
    return set(ds.dataset(str(store / "correctness"), format="parquet").to_table()
               .column("impl").to_pylist())


# --- 1. global options in either position ----------------------------------------------------

def test_store_and_plugins_before_and_after_the_verb_combine(tmp_path, registry):
    """`--plugin A check --plugin B --store DIR`: both plugins load, rows go to DIR."""
    a, b = tmp_path / "kp_test_a.py", tmp_path / "kp_test_b.py"
    a.write_text(COPY.format(name="kp_test_a"))
    b.write_text(COPY.format(name="kp_test_b"))
    store = tmp_path / "after"
    rc = main(["--plugin", str(a), "check", "--plugin", str(b), "--store", str(store),
               "--impl", "torch:kp_test_a,torch:kp_test_b", *SMALL])
    assert rc == 0
    assert _impls_in(store) == {"torch:kp_test_a", "torch:kp_test_b"}


def test_a_store_before_the_verb_is_not_reset_by_the_verb():
    args = parser().parse_args(["--store", "s1", "cases"])
    assert args.store == "s1"
    from verbs.cli import parse_args

    assert parse_args(["cases", "--store", "s2"]).store == "s2"
    assert parse_args(["--plugin", "x", "cases"]).plugin == ["x"]
    assert parse_args(["cases"]).plugin is None


# --- 2. --plugin as a module name (from the current directory) or a .py path ------------------

def test_plugin_as_a_module_of_the_current_directory(tmp_path, monkeypatch, registry, capsys):
    """An installed `kparity` script does not put the current directory on sys.path (`python
    -m` does): a module of the user's own repo must import all the same."""
    (tmp_path / "kp_test_dotted").mkdir()
    (tmp_path / "kp_test_dotted" / "__init__.py").write_text("")
    (tmp_path / "kp_test_dotted" / "kernels.py").write_text(COPY.format(name="kp_test_dotted"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert main(["--plugin", "kp_test_dotted.kernels", "ops"]) == 0
    assert "torch:kp_test_dotted" in gpu_impls.impls()
    assert gpu_impls.origin("torch:kp_test_dotted") == "plugin kp_test_dotted.kernels"
    out = " ".join(capsys.readouterr().out.split())
    assert "plugin kp_test_dotted.kernels │ torch:kp_test_dotted" in out


@pytest.mark.parametrize("body, fragment", [
    ("raise RuntimeError('no kernel table')", "RuntimeError: no kernel table (at "),
    (COPY.format(name="rms_norm"), "impl torch:rms_norm registered twice (first by builtin)"),
])
def test_a_broken_plugin_flag_exits_2_naming_file_and_exception(tmp_path, registry, capsys,
                                                                body, fragment):
    plugin = tmp_path / "kp_test_broken.py"
    plugin.write_text(body)
    assert main(["--store", str(tmp_path / "s"), "ops", "--plugin", str(plugin)]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert f"error: plugin {plugin}:" in out and fragment in out


# --- 3. entry points ---------------------------------------------------------------------------

ENTRY_POINTS = """\
[kparity.plugins]
good = kp_test_ep:register
raises = kp_test_ep:explode
badimport = kp_test_ep_missing_dep
dup = kp_test_ep:register_existing
"""
EP_MODULE = textwrap.dedent("""\
    import dataclasses
    from gpu_impls import impls, register as reg

    def _copy(name):
        return dataclasses.replace(impls()["torch:rms_norm"], name=name)

    def register():
        reg(_copy("kp_test_ep_good"))

    def explode():
        reg(_copy("kp_test_ep_half"))  # registered, then the plugin fails: removed again
        raise RuntimeError("kernel table missing")

    def register_existing():
        reg(_copy("kp_test_ep_before_dup"), impls()["torch:rms_norm"])
    """)


@pytest.fixture
def entry_points(tmp_path, monkeypatch, registry):
    """An installed distribution `kp-test-ep` (a dist-info on sys.path) with four
    `kparity.plugins` entry points: one good, three broken in the three ways a plugin breaks."""
    site = tmp_path / "site"
    info = site / "kp_test_ep-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kp-test-ep\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    (site / "kp_test_ep.py").write_text(EP_MODULE)
    (site / "kp_test_ep_missing_dep.py").write_text("import kp_test_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_entry_points_load_and_a_broken_one_is_named(entry_points):
    with pytest.warns(gpu_impls.PluginWarning) as caught:
        failed = gpu_impls.load_entry_points()
    assert len(failed) == len(caught) == 3
    text = "\n".join(failed)
    assert ("entry point raises = kp_test_ep:explode (kp-test-ep 0.1): RuntimeError: kernel "
            f"table missing (at {entry_points / 'kp_test_ep.py'}:") in text
    assert ("entry point badimport = kp_test_ep_missing_dep (kp-test-ep 0.1): cannot import: "
            "No module named 'kp_test_no_such_dependency'") in text
    assert ("entry point dup = kp_test_ep:register_existing (kp-test-ep 0.1): ValueError: impl "
            "torch:rms_norm registered twice (first by builtin)") in text
    ids = gpu_impls.impls()
    assert gpu_impls.origin("torch:kp_test_ep_good") == \
        "entry point good = kp_test_ep:register (kp-test-ep 0.1)"
    # a failed plugin's impls are all gone, those registered before it raised included
    assert "torch:kp_test_ep_half" not in ids and "torch:kp_test_ep_before_dup" not in ids
    assert gpu_impls.origin("torch:rms_norm") == "builtin"
    assert gpu_impls.load_entry_points() == []  # each entry point is tried once per process


def test_cli_warns_in_one_line_per_broken_entry_point_and_runs_the_rest(entry_points, tmp_path,
                                                                          monkeypatch, capsys):
    monkeypatch.setattr(gpu_impls, "_loaded", False)  # discovery as in a fresh process
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the CLI must show them itself, not raise or repeat
        rc = main(["check", "--store", str(tmp_path / "s"), "--impl", "torch:kp_test_ep_good",
                   *SMALL])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    warned = [ln for ln in lines if ln.startswith("plugin not loaded: entry point")]
    assert len(warned) == 3 and any("raises = kp_test_ep:explode" in ln for ln in warned)
    assert _impls_in(tmp_path / "s") == {"torch:kp_test_ep_good"}


# --- 4. the example plugin package -------------------------------------------------------------

def _example_installed() -> bool:
    try:
        importlib.metadata.distribution("kparity-example-plugin")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _example_installed(), reason="examples/kparity-example-plugin is not "
                    "installed (the README's Setup command installs it, as CI does)")
def test_the_example_plugin_is_found_by_its_entry_point_and_passes(tmp_path, capsys):
    impl = gpu_impls.impls()["torch:example_rms_norm"]
    assert gpu_impls.origin(impl.id).startswith(
        "entry point example = kparity_example_plugin:register (kparity-example-plugin ")
    assert main(["check", "--store", str(tmp_path / "s"), "--impl", impl.id,
                 "--preset", "qwen3-0.6b"]) == 0
    rows = ds.dataset(str(tmp_path / "s" / "correctness"), format="parquet").to_table()
    statuses = [(r["expect"], r["status"], json.loads(r["case_json"])["dtype"])
                for r in rows.to_pylist()]
    assert ("valid", "pass", "bf16") in statuses  # it ran, and only where its contract allows
    assert {s for e, s, _ in statuses if e == "valid"} == {"pass"}
    assert {d for e, _, d in statuses if e == "valid"} == {"bf16"}


# --- 5. ops --matrix ---------------------------------------------------------------------------

def test_ops_matrix_runs_refused_missing(tmp_path, registry, capsys):
    """Per impl and dtype: runs here (admitted of the op's gate cases), refused by its contract
    (the invariant), or missing (the impl's or the backend's why)."""
    plugin = tmp_path / "kp_test_matrix.py"
    plugin.write_text(textwrap.dedent("""\
        import dataclasses
        from gpu_impls import impls, register
        from gpu_impls.contract import Contract
        base = impls()["torch:rms_norm"]
        register(dataclasses.replace(base, name="kp_test_bf16_only",
                                     contract=Contract(base.contract.invariants,
                                                       dtypes=("bf16",))),
                 dataclasses.replace(base, name="kp_test_elsewhere",
                                     requires=lambda: (False, "needs the moon")))
        """))
    page = tmp_path / "matrix.html"
    assert main(["--plugin", str(plugin), "ops", "--matrix", "--family", "norms",
                 "--html", str(page)]) == 0
    terminal = capsys.readouterr().out
    rows = {cells[2]: cells for cells in (  # the full grid: one <tr> per impl
        [html.unescape(re.sub("<[^>]+>", "", c)) for c in re.findall("<td[^>]*>(.*?)</td>", tr)]
        for tr in re.findall("<tr>(.*?)</tr>", page.read_text())) if cells}
    admitted = [c.dtype for c in valid_cases(gpu_impls.impls()["torch:rms_norm"])]
    gate = [c.dtype for c in gate_cases("rms_norm")]
    # family, op, impl, f32, f16, bf16, sum order, why not
    assert rows["torch:rms_norm"][:2] == ["norms", "rms_norm"]
    assert rows["torch:rms_norm"][3:8] == [
        f"runs {admitted.count(d)}/{gate.count(d)}" for d in ("f32", "f16", "bf16")] + [
        "undeclared", ""]
    assert rows["torch:kp_test_bf16_only"][3:6] == ["refused", "refused",
                                                     rows["torch:rms_norm"][5]]
    assert rows["torch:kp_test_bf16_only"][7].startswith("f32, f16: refused by contract:")
    assert rows["torch:kp_test_elsewhere"][3:8] == ["missing"] * 3 + ["undeclared",
                                                                      "needs the moon"]
    assert {r[0] for r in rows.values()} == {"norms"}  # --family: that family's impls only
    # The terminal: the same impls, compact, one line each
    line = next(ln for ln in terminal.splitlines() if "torch:kp_test_elsewhere" in ln)
    assert line.split() == ["torch:kp_test_elsewhere", "no", "no", "no", "undeclared",
                            "needs", "the", "moon"]


# --- 6, 7. cases --list, --help ----------------------------------------------------------------

def test_cases_list_shows_dims_and_params(tmp_path, capsys):
    assert main(["cases", "--impl", "torch:rms_norm", "--preset", "qwen3-0.6b", "--dtype", "f32",
                 "--list", "--limit", "2"]) == 0
    listed = [ln for ln in capsys.readouterr().out.splitlines()
              if re.match("[0-9a-f]{12}  torch:rms_norm ", ln)]
    assert len(listed) == 2
    assert all("rms_norm[n=1024,rows=" in ln and "eps=" in ln for ln in listed), listed


def test_help_is_complete(capsys):
    """The top-level help names every verb, both positions of the global options, the plugin
    entry point group and the exit codes; every verb, positional and option says what it
    does."""
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "Exit codes: 0 success, 1 a check failed" in out and "3 nothing could run" in out
    assert "before or after the verb" in out and "kparity.plugins" in out
    for verb in verb_table():
        assert f"  {verb} " in out, verb
    top = parser()
    verbs = next(a for a in top._actions if a.dest == "verb").choices
    sub = next(a for a in top._actions if a.dest == "verb")
    assert all(c.help for c in sub._choices_actions), [c.dest for c in sub._choices_actions]
    for p in (top, *verbs.values()):
        missing = [a.option_strings or a.dest for a in p._actions
                   if a.dest not in ("help", "verb") and not a.help]
        assert not missing, (p.prog, missing)
