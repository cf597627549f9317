"""The CLI end to end on CPU backends: exit codes, rows in the store, repro, mutants go red."""

from __future__ import annotations

import html
import json
import re
from cases.distributions import DISTRIBUTIONS
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from results.schema import CORRECTNESS, RUNS, SCHEMA_VERSION
from verbs.cli import main

MUTANTS = str(Path(__file__).with_name("mutants.py"))


def run(tmp_path, *argv) -> int:
    return main(["--store", str(tmp_path / "store"), *argv])


def test_check_writes_rows_readable_with_the_schema(tmp_path):
    rc = run(tmp_path, "check", "--impl", "torch:rms_norm", "--preset", "qwen3-0.6b")
    assert rc == 0
    files = sorted((tmp_path / "store" / "correctness").glob("date=*/*.parquet"))
    assert files, "no correctness parts written"
    table = ds.dataset([str(f) for f in files], format="parquet").to_table()
    assert table.schema.equals(CORRECTNESS, check_metadata=False)
    rows = table.to_pylist()
    assert len(rows) == 3 * len(DISTRIBUTIONS)  # 3 dtypes, one rounding convention
    assert {r["status"] for r in rows} == {"pass"}
    assert all(r["schema_version"] == SCHEMA_VERSION and 0 <= r["budget"] <= 1 for r in rows)
    runs = ds.dataset(str(tmp_path / "store" / "runs"), format="parquet").to_table()
    assert runs.schema.equals(RUNS, check_metadata=False) and runs.num_rows == 1
    assert json.loads(runs.to_pylist()[0]["devices"]) == {"torch": "cpu"}


@pytest.mark.parametrize("mutant, presets", [
    *((m, "qwen3-0.6b,edge") for m in ("mutant_drop_eps", "mutant_round_before_weight",
                                       "mutant_weight_before_rounding", "mutant_skip_lane")),
    *((f"mutant_gemv_{bug}", "int4-g64") for bug in ("nibble_order", "group_off_by_one",
                                                     "drop_bias", "skip_last_group")),
    *((m, "llama-3.1-8b") for m in ("mutant_rope_pairing_adjacent",
                                    "mutant_rope_llama3_no_smooth", "mutant_kv_update_one_off")),
    ("mutant_swiglu_no_clamp", "gpt-oss-20b")])
def test_each_mutant_fails_check(tmp_path, mutant, presets, capsys):
    rc = run(tmp_path, "--plugin", MUTANTS, "check", "--impl", f"torch:{mutant}",
             "--preset", presets, "--show-failures", "1")
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "repro: kparity --store" in out and "--plugin" in out and f"--impl torch:{mutant}" in out


def test_violating_cases_are_rejected_and_count_as_ok(tmp_path):
    rc = run(tmp_path, "check", "--impl", "mlx:fast_rms_norm", "--preset", "violates")
    assert rc == 0
    table = ds.dataset(str(tmp_path / "store" / "correctness"), format="parquet").to_table()
    rows = table.to_pylist()
    assert rows and {(r["expect"], r["status"]) for r in rows} == {("rejected", "rejected")}
    assert any("rounding == 'normed'" in r["message"] for r in rows)


def test_repro_reruns_a_stored_case(tmp_path, capsys):
    assert run(tmp_path, "--plugin", MUTANTS, "check", "--impl", "torch:mutant_drop_eps",
               "--preset", "qwen3-0.6b", "--dtype", "bf16") == 1
    table = ds.dataset(str(tmp_path / "store" / "correctness"), format="parquet").to_table()
    failing = [r for r in table.to_pylist() if r["status"] == "fail"]
    case_id = failing[0]["case_id"]
    capsys.readouterr()
    assert run(tmp_path, "--plugin", MUTANTS, "repro", case_id) == 1
    assert case_id in capsys.readouterr().out
    assert run(tmp_path, "repro", case_id, "--impl", "torch:rms_norm") == 0


@pytest.mark.parametrize("argv, fragment", [
    (["check", "--op", "rmsnorm"], "unknown op 'rmsnorm'"),
    (["check", "--impl", "torch:rms_nrom"], "unknown impl 'torch:rms_nrom'"),
    (["check", "--backend", "cdua"], "Valid backends (closest first): cuda"),
    (["check", "--dtype", "fp16"], "unknown dtype 'fp16'"),
    (["check", "--preset", "qwen9"], "unknown preset 'qwen9'"),
    (["repro", "000000000000"], "neither in the store"),
    (["--plugin", "no_such_module_xyz", "ops"], "cannot import"),
    (["check", "--seed", "-1"], "--seed -1: at least 0"),
    (["cases", "--seed", "-2"], "--seed -2: at least 0"),
])
def test_bad_input_exits_2_naming_valid_choices(tmp_path, capsys, argv, fragment):
    assert run(tmp_path, *argv) == 2
    assert fragment in " ".join(capsys.readouterr().out.split())


def error_lines(out: str, tmp_path=None) -> list[str]:
    """The lines of an error message: from its `error:` line on (a notice may come first); the
    test's own folder, named in a path the user gave, as `TMP` (its length is the machine's)."""
    lines = (out.replace(str(tmp_path), "TMP") if tmp_path else out).splitlines()
    first = next(i for i, line in enumerate(lines) if "error:" in line)
    return lines[first:]


@pytest.mark.parametrize("argv", [
    ["check", "--op", "rmsnorm"], ["check", "--impl", "torch:rms_nrom"], ["check", "--impl", "rms"],
    ["check", "--preset", "qwen9"], ["check", "--preset", "decode-1x4096"],
    ["cases", "--preset", "nope"], ["check", "--resume", "nosuch"], ["repro", "000000000000"],
    ["bench", "--min-time", "20", "--timeout", "10"], ["chek"], ["check", "--tier", "bogus"],
    ["ops", "--family", "bogus"], ["ops", "--files"], ["--plugin", "no_such_module_xyz", "ops"],
    ["check", "--impl", "torch:rms_norm", "--devices", "0", "--isolate", "none"],
    ["ab", "torch:rms_norm", "mlx:rms_norm_f32", "--runs", "1"],
    ["ab", "torch:rms_norm", "mlx:fast_rms_norm"],
])
def test_an_error_is_at_most_two_lines_that_fit_120_columns(tmp_path, capsys, argv):
    """What was wrong, then the fix: an unknown name shows the closest few valid ones and the
    command that lists the rest, not all 300 impl ids on one line; argparse's errors leave out
    the whole usage."""
    try:
        rc = run(tmp_path, *argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    assert rc == 2
    out = capsys.readouterr()
    lines = error_lines(out.out + out.err, tmp_path)
    assert len(lines) <= 2 and max(map(len, lines)) <= 120, lines


def test_an_unknown_name_shows_the_closest_few_and_where_the_rest_are(tmp_path, capsys):
    assert run(tmp_path, "check", "--impl", "torch:rms_nrom") == 2
    what, valid = error_lines(capsys.readouterr().out)
    assert what == "error: unknown impl 'torch:rms_nrom'"
    assert valid.startswith("  Valid impls (closest first): torch:rms_norm, ")
    assert re.search(r" \.\.\. \(\d+ more: `kparity ops`\)$", valid), valid
    with pytest.raises(SystemExit) as done:
        run(tmp_path, "chek")
    assert done.value.code == 2
    what, fix = capsys.readouterr().err.splitlines()
    assert what.startswith("kparity: error: argument VERB: invalid choice: 'chek'; valid: check")
    assert fix == "  `kparity --help` lists the verbs and options"


def test_skipped_impls_are_one_line_by_reason_and_verbose_lists_them(capsys):
    """An impl not runnable here is said once per reason, counted per backend, not a line each
    (26 lines opened every CPU check); --verbose gives a line per backend and impl."""
    from types import SimpleNamespace

    from verbs.selection import say_skipped

    def impl(impl_id):
        return SimpleNamespace(id=impl_id, backend=impl_id.split(":")[0])

    cupy = "cupy not installed (No module named 'cupy'); pip install 'kparity[cuda]'"
    skipped = [(impl("cuda:a"), cupy, False), (impl("cuda:b"), cupy, False),
               (impl("torch:c_compiled"), "torch.compile baselines run on CUDA only (no GPU "
                                          "here)", True),
               (impl("mlx:d"), "mx.gather_mm on MLX's CPU takes float32 only: needs an MLX GPU",
                True)]
    say_skipped(skipped, verbose=False)
    assert capsys.readouterr().out.splitlines() == [
        "skipping 4 impls: cuda 2 (cupy not installed), torch 1 + mlx 1 (need a GPU); "
        "--verbose lists them"]
    say_skipped(skipped, verbose=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"skipping backend cuda (2 impls): {cupy}"
    assert [ln.split(":")[0] for ln in lines[1:]] == ["skipping impl mlx", "skipping impl torch"]


def test_a_check_says_its_skipped_impls_in_one_line(tmp_path, capsys):
    # by name: torch:rms_norm (runs), torch:rms_norm_compiled (CUDA only), cuda:kp_rms_norm, ...
    assert run(tmp_path, "check", "--impl", "rms_norm,rms_norm_compiled,kp_rms_norm,mt_rms_norm",
               "--preset", "qwen3-0.6b", "--dtype", "f32", "--tier", "commit") == 0
    out = capsys.readouterr().out.splitlines()
    skipping = [ln for ln in out if ln.startswith("skipping")]
    assert len(skipping) <= 1 and all(ln.endswith("--verbose lists them") for ln in skipping)


def test_impls_left_out_are_one_line_unless_few_or_verbose(capsys):
    from verbs.selection import say_left_out

    whys = {f"mlx:op{i}": f"mlx:op{i}: none of the 3 bench cases of op{i} matches --preset "
                          f"decode --dtype f32; its presets: a, b" for i in range(5)}
    whys["mlx:x"] = "mlx:x: its op x has no bench cases"
    say_left_out("not benched", whys, verbose=False)
    assert capsys.readouterr().out.splitlines() == [
        "not benched: 6 impls (5: filters match no case, 1: no bench case); --verbose lists "
        "them"]
    say_left_out("not benched", whys, verbose=True)
    assert len(capsys.readouterr().out.splitlines()) == 6
    say_left_out("not checked", dict(list(whys.items())[:2]), verbose=False)
    assert len(capsys.readouterr().out.splitlines()) == 2  # a few: a line each


def test_help_lists_every_verb_once_grouped(monkeypatch, capsys):
    """The top-level help's verb list comes from the registered verbs (it once missed model and
    model-ab): each verb once, under its module's GROUP; argparse's own list is left out."""
    import types

    from verbs import cli

    def help_text() -> str:
        with pytest.raises(SystemExit):
            main(["--help"])
        return capsys.readouterr().out

    def listed(out: str) -> list[str]:  # the verb column of the "Verbs" block
        block = out.split("Verbs (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
        return [line[17:27].strip() for line in block if line[17:27].strip()]

    out = help_text()
    sub = next(a for a in cli.parser()._actions if a.dest == "verb")
    assert sorted(listed(out)) == sorted(sub.choices)  # every subparser, once
    for verb in sub.choices:
        assert len(re.findall(rf"^ +(?:[a-z ]+?  +)?{re.escape(verb)}  ", out, re.M)) == 1, verb
    assert re.search(r"^  model level    model  ", out, re.M)
    assert re.search(r"^ {17}model-ab  ", out, re.M)
    # A verb module added later is listed with no edit to the help
    extra = types.SimpleNamespace(ORDER=9, GROUP="extras", VERBS={"frob": lambda args: 0},
                                  add_parsers=lambda s: s.add_parser("frob", help="frobnicate"),
                                  __name__="verbs.frob")
    modules = cli.verb_modules()
    monkeypatch.setattr(cli, "verb_modules", lambda: [*modules, extra])
    assert re.search(r"^  extras         frob        frobnicate$", help_text(), re.M)


def test_unwritable_store_fails_before_running(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["--store", str(blocker / "store"), "check", "--impl", "torch:rms_norm"]) == 2
    assert "not writable" in capsys.readouterr().out


def test_ops_and_cases_list_backends_and_counts(tmp_path, capsys):
    assert run(tmp_path, "ops") == 0
    out = capsys.readouterr().out
    assert "torch:rms_norm" in out and "metal" in out and "Metal needs macOS" in out
    assert run(tmp_path, "cases", "--impl", "mlx:fast_rms_norm", "--invalid") == 0
    out = capsys.readouterr().out
    assert "mlx:fast_rms_norm" in out and "pairs would run" in out


def test_repro_line_survives_a_long_plugin_path(tmp_path, capsys):
    """CI clones live under long paths; a wrapped repro line cannot be copy-pasted."""
    deep = tmp_path / ("d" * 80) / ("e" * 80)
    deep.mkdir(parents=True)
    plugin = deep / "mutants.py"
    plugin.write_text(Path(MUTANTS).read_text())
    impl = "torch:mutant_weight_before_rounding"
    rc = run(tmp_path, "--plugin", str(plugin), "check", "--impl", impl, "--preset", "qwen3-0.6b",
             "--show-failures", "1")
    out = capsys.readouterr().out
    assert rc == 1
    lines = [ln for ln in out.splitlines() if "repro:" in ln]
    assert len(lines) == 1 and lines[0].strip().startswith(f"repro: kparity --store {tmp_path / 'store'} --plugin {plugin}")
    assert lines[0].endswith(f"--impl {impl}")


def test_check_reports_logit_agreement_and_level2_loss_apart(tmp_path, capsys):
    """The lm_head cases' argmax metrics and the quantized cases' level-2 loss are printed in
    their own table (never gated); a norm op has neither, so no such table."""
    rc = run(tmp_path, "check", "--impl", "torch:dequant_linear", "--preset", "int4-g64",
             "--dtype", "f32", "--valid-only")
    out = capsys.readouterr().out
    assert rc == 0 and "reported, not gated" in out and "level-2 cases" in out
    reported = out[out.index("reported, not gated"):]
    row = next(line for line in reported.splitlines() if "torch:dequant_linear" in line)
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert int(cells[1]) > 0 and int(cells[5]) > 0 and 0 < float(cells[6]) < 1, row
    run(tmp_path, "check", "--impl", "torch:rms_norm", "--preset", "qwen3-0.6b", "--dtype", "f32")
    assert "reported, not gated" not in capsys.readouterr().out


def test_a_py_plugin_runs_once_per_process(tmp_path):
    """`kparity nightly` runs several verbs in one process, each with the same --plugin."""
    plugin = tmp_path / "plain_plugin.py"
    plugin.write_text("from gpu_impls import impls, register\n"
                      "import dataclasses\n"
                      "register(dataclasses.replace(impls()['torch:rms_norm'], "
                      "name='plain_plugin_copy'))\n")  # no guard: a second run would raise
    for _ in range(2):
        assert run(tmp_path, "--plugin", str(plugin), "check", "--impl",
                   "torch:plain_plugin_copy", "--preset", "qwen3-0.6b", "--dtype", "bf16") == 0


def _listed_ids(capsys, tmp_path, *flags) -> list[str]:
    assert run(tmp_path, "cases", "--impl", "torch:rms_norm", "--invalid", "--list",
               "--limit", "1000", *flags) == 0
    words = [ln.split() for ln in capsys.readouterr().out.splitlines()]
    return [w[0] for w in words if w and re.fullmatch("[0-9a-f]{12}", w[0])]  # `id  impl ...`


def test_cases_seed_lists_the_ids_a_seeded_check_would_run(tmp_path, capsys):
    """`--seed 0` lists exactly the usual ids; `--seed 7` a new id for every case, the same
    ones each time."""
    plain = _listed_ids(capsys, tmp_path)
    assert plain and _listed_ids(capsys, tmp_path, "--seed", "0") == plain
    seeded = _listed_ids(capsys, tmp_path, "--seed", "7")
    assert len(seeded) == len(plain) and not set(seeded) & set(plain)
    assert _listed_ids(capsys, tmp_path, "--seed", "7") == seeded


def test_check_seed_runs_and_records_seeded_cases(tmp_path, capsys):
    """`check --seed 3`: every row's case carries seed 3 (ids unlike seed 0's), the runs row's
    filters keep it, the summary names it, and --resume reuses it (nothing left to run)."""
    argv = ["check", "--impl", "torch:rms_norm", "--preset", "qwen3-0.6b", "--dtype", "f32"]
    assert run(tmp_path, *argv, "--seed", "3") == 0
    assert "(--seed 3)" in capsys.readouterr().out
    store = tmp_path / "store"
    rows = ds.dataset(str(store / "correctness"), format="parquet").to_table().to_pylist()
    assert rows and {json.loads(r["case_json"])["seed"] for r in rows} == {3}
    assert run(tmp_path, *argv) == 0
    rows = ds.dataset(str(store / "correctness"), format="parquet").to_table().to_pylist()
    by_seed = {s: {r["case_id"] for r in rows if json.loads(r["case_json"])["seed"] == s}
               for s in (0, 3)}
    assert len(by_seed[0]) == len(by_seed[3]) > 0 and not by_seed[0] & by_seed[3]
    runs = ds.dataset(str(store / "runs"), format="parquet").to_table().to_pylist()
    seeded = next(r for r in runs if json.loads(r["filters"])["seed"] == 3)
    capsys.readouterr()
    assert run(tmp_path, "check", "--resume", seeded["run_id"], "--seed", "4") == 2
    assert "differs from the run's own" in capsys.readouterr().out
    assert run(tmp_path, "check", "--resume", seeded["run_id"]) == 0
    assert f"{len(by_seed[3])} rows kept (0 recovered from its journal), 0 to run" in \
        capsys.readouterr().out


def test_seed_with_a_case_file_is_refused(tmp_path, capsys):
    """A case file's cases keep their own seeds: --seed with --cases would be ignored, so it is
    refused instead."""
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([{"op": "rms_norm", "dims": {"rows": 2, "n": 64}, "dtype": "f32",
                                 "seed": 5}]))
    assert run(tmp_path, "check", "--cases", str(path), "--seed", "1") == 2
    assert "keep the seeds the file gives them" in " ".join(capsys.readouterr().out.split())
    assert run(tmp_path, "check", "--cases", str(path), "--impl", "torch:rms_norm") == 0
    rows = ds.dataset(str(tmp_path / "store" / "correctness"), format="parquet").to_table()
    assert {json.loads(c)["seed"] for c in rows.column("case_json").to_pylist()} == {5}


def test_repro_dump_writes_npy_and_a_script_that_reruns_the_case(tmp_path, capsys):
    """`repro CASE --dump DIR`: inputs, each impl's outputs, the oracle and bounds as .npy, and
    repro_<case>.py, which reruns the case without the CLI and reports the same statuses."""
    import os
    import subprocess
    import sys

    import numpy as np

    from cases.model import Case, make_inputs

    assert run(tmp_path, "--plugin", MUTANTS, "check", "--impl", "torch:mutant_drop_eps",
               "--preset", "qwen3-0.6b", "--dtype", "bf16", "-x") == 1
    table = ds.dataset(str(tmp_path / "store" / "correctness"), format="parquet").to_table()
    row = next(r for r in table.to_pylist() if r["status"] == "fail")
    case, folder = Case.from_json(row["case_json"]), tmp_path / "dump"
    assert run(tmp_path, "--plugin", MUTANTS, "repro", case.id, "--impl", "torch:mutant_drop_eps",
               "--impl", "torch:rms_norm", "--dump", str(folder)) == 1
    script = folder / f"repro_{case.id}.py"
    assert f"rerun without the CLI: python {script}" in capsys.readouterr().out
    for name, array in make_inputs(case).items():  # bf16 written as exact float32
        assert np.array_equal(np.load(folder / f"{case.id}.input.{name}.npy"),
                              array.astype(np.float32))

    def within(impl):  # the verdict, from the files alone
        got = {k: np.load(folder / f"{case.id}.{impl}.{k}.out.npy").astype(np.float64)
               for k in ("out", "exact", "bound")}
        return bool(np.all(np.abs(got["out"] - got["exact"]) <= got["bound"]))

    assert within("torch-rms_norm") and not within("torch-mutant_drop_eps")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}  # this checkout's kparity
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, env=env)
    assert done.returncode == 1, done.stderr
    assert "torch:mutant_drop_eps fail (as at the dump)" in done.stdout
    assert "torch:rms_norm pass (as at the dump)" in done.stdout


def test_a_sweep_without_a_terminal_prints_progress_lines(capsys):
    """CI and nightly logs get no progress bar: a plain line every `every` seconds instead."""
    from verbs.console import SweepProgress

    with SweepProgress("check", "failed", " failed", every=0.0) as progress:
        task = progress.add_task("cuda:kp_rms_norm bf16", total=10, failed=0)
        progress.update(task, advance=3, failed=1)
    assert "check: 3/10 done, 1 failed, " in capsys.readouterr().out
    with SweepProgress("check", "failed", " failed", every=3600.0) as progress:
        progress.update(progress.add_task("x", total=2, failed=0), advance=1, failed=0)
    assert "done" not in capsys.readouterr().out


def test_a_sweep_samples_a_compile_per_shape_baseline_unless_it_is_named(capsys):
    """torch.compile baselines (`gate_cases_max`) would spend a GPU sweep compiling ~130 shapes
    each: an unnamed sweep runs the gate's sample (the same every run), said in a line; named
    with --impl, every case."""
    from argparse import Namespace

    import gpu_impls
    from cases.generate import plan, sampled
    from verbs.selection import sample_slow_compilers

    compiled, eager = (gpu_impls.impls()[i] for i in ("torch:rms_norm_compiled",
                                                       "torch:rms_norm"))
    work = plan([eager, compiled])
    everything = [w for w in work if w.impl is compiled]
    kept = sample_slow_compilers(Namespace(impl=None), work)
    mine = [w for w in kept if w.impl is compiled]
    assert mine == sampled(everything, compiled.gate_cases_max)
    valid = [w for w in mine if w.expect == "valid"]
    assert 0 < len(valid) <= compiled.gate_cases_max < len(everything)
    assert {w.case.dtype for w in valid} == {w.case.dtype for w in everything}  # spread over dtypes
    assert [w for w in kept if w.impl is eager] == [w for w in work if w.impl is eager]
    assert (f"torch:rms_norm_compiled: {len(mine)} of its {len(everything)} cases"
            in capsys.readouterr().out)
    for named in ("torch:rms_norm_compiled", "rms_norm_compiled"):
        assert sample_slow_compilers(Namespace(impl=[named]), work) == work


def test_ops_matrix_fits_120_columns_and_html_has_the_full_grid(tmp_path, monkeypatch, capsys):
    """`ops --matrix` was ~330 lines of 150 columns: now impls as rows under their family and op,
    one line each within 120 columns whatever the terminal; --html writes every reason."""
    import gpu_impls
    from verbs.console import console

    monkeypatch.setattr(console, "width", 400)
    page = tmp_path / "matrix.html"
    assert main(["ops", "--matrix", "--html", str(page)]) == 0
    # the page's path is the machine's (pytest's tmp folder): its length is not the matrix's
    lines = capsys.readouterr().out.replace(str(tmp_path), "TMP").splitlines()
    assert max(len(line) for line in lines) <= 120
    impls = gpu_impls.impls()
    rows = [line.split()[0] for line in lines if line.split() and line.split()[0] in impls]
    assert sorted(rows) == sorted(impls)  # each impl on one line
    assert any(line.strip() == "norms" for line in lines)  # a family heading
    assert any(line.strip() == "rms_norm" for line in lines)  # an op heading under it
    text = page.read_text()
    assert text.count("<tr>") == len(impls) + 1  # the header and a row per impl
    missing = [impl.available(gpu_impls.backend(impl.backend)) for impl in impls.values()]
    assert all(html.escape(why) in text for ok, why in missing if not ok)  # in full
