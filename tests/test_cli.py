"""The CLI end to end on CPU backends: exit codes, rows in the store, repro, mutants go red."""

from __future__ import annotations

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
