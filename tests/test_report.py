"""`kparity report` and `kparity nightly` on CPU: every page written, links that resolve, nothing
fetched from the network, the expected series on the impl pages, an empty store, regressions."""

from __future__ import annotations

import json
import re
from cases.distributions import DISTRIBUTIONS
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from results.history import MIN_HISTORY
from results.report import impl_page_name
from results.report_html import ASSETS, PLOTLY_JS
from results.store import Store
from verbs.cli import main

MUTANTS = str(Path(__file__).with_name("mutants.py"))
BENCH_IMPL = "cuda:kp_rms_norm"
BENCH_CASES = [("a1b2c3d4e5f6", "bench:decode-1x4096", {"rows": 1, "n": 4096}, 2000.0),
               ("0f9e8d7c6b5a", "bench:hbm-65536x4096", {"rows": 65536, "n": 4096}, 356000.0)]
N_BENCH_RUNS = MIN_HISTORY + 2  # enough history for the lookback z-score to judge the last run
# The last synthetic bench run is 60 % slower: a regression for the history rules, accepted by an
# annotation for the hbm case, open for the decode case.
SLOW_LAST = 1.6
ACCEPTED_CASE = BENCH_CASES[1][0]


def _run_id(at: datetime, tag: str) -> str:
    return at.strftime("%Y%m%dT%H%M%SZ") + "-" + tag


def _runs_row(run_id: str, at: datetime, verb: str, devices: str) -> dict:
    return {"run_id": run_id, "started": at, "command": f"kparity {verb}", "verb": verb,
            "git_sha": "0123456789abcdef", "git_dirty": False, "host": "test-host",
            "platform": "linux", "devices": devices, "versions": '{"python": "3"}',
            "filters": "{}"}


def _bench_row(run_id: str, case_id: str, label: str, dims: dict, median: float) -> dict:
    import json

    return {"run_id": run_id, "case_id": case_id, "impl": BENCH_IMPL, "op": "rms_norm",
            "backend": "cuda", "device": "cuda:0 NVIDIA H100", "dtype": "bf16", "dist": "normal",
            "dims": json.dumps(dims), "params": "{}", "label": label, "case_json": "{}",
            "mode": "graph_rot", "timer": "cuda_events", "status": "ok", "message": "",
            "ab_id": "", "arm": "", "rep": 0, "correct": "pass", "budget": 0.5,
            "samples_ns": [median * 0.99, median, median * 1.01], "median_ns": median,
            "q1_ns": median * 0.93, "q3_ns": median * 1.08, "pct_copy_ceiling": 40.0 + median % 7}


def write_synthetic_history(root: Path) -> dict:
    """Bench runs of one impl over two cases (the last one slower), an A/B row and an
    annotation, dated before now so the real check runs stay the newest."""
    store = Store(root)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    run_ids = []
    for i in range(N_BENCH_RUNS):
        at = now - timedelta(hours=N_BENCH_RUNS + 1 - i)
        run_id = _run_id(at, f"b{i:05d}")
        run_ids.append(run_id)
        store.write("runs", [_runs_row(run_id, at, "bench", '{"cuda": "cuda:0 NVIDIA H100"}')],
                    run_id, 0)
        scale = SLOW_LAST if i == N_BENCH_RUNS - 1 else 1.0 + 0.002 * (i % 3)
        store.write("bench", [_bench_row(run_id, cid, label, dims, base * scale)
                              for cid, label, dims, base in BENCH_CASES], run_id, 0)
    at = now - timedelta(minutes=30)
    ab_run = _run_id(at, "ab0001")
    store.write("runs", [_runs_row(ab_run, at, "ab", '{"cuda": "cuda:0 NVIDIA H100"}')], ab_run, 0)
    store.write("ab", [{"run_id": ab_run, "ab_id": "ab1", "case_id": "a1b2c3d4e5f6",
                        "impl_a": "torch:rms_norm", "impl_b": BENCH_IMPL, "op": "rms_norm",
                        "dtype": "bf16", "dims": '{"n": 4096, "rows": 1}',
                        "label": "bench:decode-1x4096", "mode": "graph_rot", "status": "ok",
                        "message": "", "correct_a": "pass", "correct_b": "pass",
                        "ab_max_abs": 0.0, "ab_max_ulp": 0,
                        "runs_a_ns": [8030.0, 8010.0, 8050.0, 8040.0, 8020.0],
                        "runs_b_ns": [1990.0, 1985.0, 2001.0, 1992.0, 1995.0], "ratio": 0.249,
                        "ci_lo": 0.248, "ci_hi": 0.2495, "aa_noise": 0.002, "delta": 0.02,
                        "verdict": "FASTER"}], ab_run, 0)
    store.write("annotations", [{"run_id": run_ids[-1], "created": now, "kind": "accept",
                                 "target": ACCEPTED_CASE, "metric": "median_ns",
                                 "reason": "new <b>reduction</b> & order",
                                 "command": "kparity accept", "host": "test-host"}],
                run_ids[-1], 0)
    return {"bench_runs": run_ids, "ab_run": ab_run}


# The torch impls of these ops, named: `--op X --backend torch` would also pick up the mutants
# that tests loading tests/mutants.py leave registered in this process.
NORM_IMPLS = "torch:rms_norm,torch:rms_norm_llama"
GEMV_IMPLS = "torch:dequant_linear"


def build_store(root: Path, impls: str = NORM_IMPLS, presets: str = "qwen3-8b",
                checks: int = 2) -> dict:
    """Real CPU check runs (torch), then the synthetic bench history, A/B and annotation."""
    for _ in range(checks):
        assert main(["--store", str(root), "check", "--impl", impls, "--preset", presets]) == 0
    return write_synthetic_history(root)


def report(root: Path, out: Path, *extra: str) -> int:
    return main(["--store", str(root), "report", "--out", str(out), *extra])


def local_refs(page: Path) -> list[str]:
    return re.findall(r'(?:href|src)="([^"]+)"', page.read_text())


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    ids = build_store(root / "store")
    assert report(root / "store", root / "site", "--baseline", "20") == 0
    return root / "site", ids


def test_every_page_is_written_and_every_link_resolves(site):
    out, _ = site
    expected = {"index.html", "regressions.html", "ab.html", impl_page_name(BENCH_IMPL),
                impl_page_name("torch:rms_norm"), impl_page_name("torch:rms_norm_llama")}
    pages = {p.name for p in out.glob("*.html")}
    assert pages == expected
    assert impl_page_name(BENCH_IMPL) == "impl-cuda_kp_rms_norm.html"
    index_links = set(local_refs(out / "index.html"))
    assert expected - {"index.html"} <= index_links, "the overview links to every other page"
    for name in pages:
        for ref in local_refs(out / name):
            assert not re.match(r"(?i)^(https?:)?//", ref), f"{name} fetches {ref}"
            assert (out / ref.split("#")[0]).is_file(), f"{name}: broken link {ref}"
        text = (out / name).read_text()
        assert "http://" not in text and "https://" not in text, name


def test_plotly_is_copied_once_and_referenced_relatively(site):
    out, _ = site
    js = out / ASSETS / PLOTLY_JS
    assert js.is_file() and js.stat().st_size > 1_000_000
    for page in out.glob("*.html"):
        assert f"{ASSETS}/{PLOTLY_JS}" in local_refs(page), page.name


def test_impl_page_has_the_series_and_their_run_ids(site):
    out, ids = site
    text = (out / impl_page_name(BENCH_IMPL)).read_text()
    for name in ("decode-1x4096 bf16 graph_rot", "hbm-65536x4096 bf16 graph_rot"):
        assert f'"name":"{name}"' in text and f'"name":"{name} IQR"' in text
    assert '"fill":"toself"' in text and ids["bench_runs"][-1] in text
    assert text.count("Plotly.newPlot(") == 2  # latency, % of copy; budget: no check rows
    check_page = (out / impl_page_name("torch:rms_norm")).read_text()
    assert '"name":"qwen3-8b bf16"' in check_page and '"name":"qwen3-8b f32"' in check_page
    assert "fig-budget" in check_page
    assert '<h2>latency</h2>\n<p class="empty">no rows yet' in check_page


def test_floats_are_rounded_in_the_figures(site):
    out, _ = site
    text = (out / impl_page_name(BENCH_IMPL)).read_text()
    assert not re.search(r"\d\.\d{6,}", text)


def test_overview_shows_the_latest_check_and_every_run(site):
    out, ids = site
    text = (out / "index.html").read_text()
    assert f"latest check: OK: {2 * 3 * len(DISTRIBUTIONS)}" in text  # 2 impls x 3 dtypes
    assert f"{3 * len(DISTRIBUTIONS)} pass" in text and 'class="ok"' in text
    for run_id in ids["bench_runs"] + [ids["ab_run"]]:
        assert run_id in text
    assert f"runs ({2 + N_BENCH_RUNS + 1})" in text  # 2 checks, the bench runs, 1 A/B


def test_regressions_page_lists_the_slow_run_and_escapes(site):
    out, ids = site
    text = (out / "regressions.html").read_text()
    section = text[text.index("<h2>regressions"):text.index("<h2>accepted")]
    assert ids["bench_runs"][-1] in section and "decode-1x4096 bf16" in section
    assert re.search(r"\+59\.\d%", section) and ACCEPTED_CASE not in section
    accepted = text[text.index("<h2>accepted"):text.index("<h2>improvements")]
    assert ACCEPTED_CASE in accepted and "hbm-65536x4096 bf16" in accepted
    assert "new &lt;b&gt;reduction&lt;/b&gt; &amp; order" in text and "<b>reduction" not in text


def test_ab_page_has_the_verdict_and_the_figure(site):
    out, _ = site
    text = (out / "ab.html").read_text()
    assert "FASTER" in text and "0.249" in text and "Plotly.newPlot(" in text
    assert f'"name":"{BENCH_IMPL} vs torch:rms_norm (graph_rot)"' in text


def test_empty_store_gives_pages_that_say_so(tmp_path, capsys):
    assert report(tmp_path / "none", tmp_path / "site") == 0
    out = capsys.readouterr().out
    assert "3 pages in" in out and str(tmp_path / "site" / "index.html") in out
    for name in ("index.html", "regressions.html", "ab.html"):
        assert "no rows yet" in (tmp_path / "site" / name).read_text()
    assert not (tmp_path / "site" / "model.html").exists()
    assert "model.html" not in (tmp_path / "site" / "index.html").read_text()


def _model_row(run_id: str, plan: str, mean_kld: float, gate: str, reasons: str = "",
               tok_s: float | None = None) -> dict:
    """A `model` table row as `kparity model` writes it (results/schema.py MODEL); 64
    positions, so the order statistics below 100 are null as models.metrics leaves them."""
    return {"run_id": run_id, "model": "smollm2-135m-instruct-q4_1", "model_sha256": "ab" * 32,
            "plan": plan, "plan_json": "{}", "backend": plan.split("+")[0], "device": "cpu",
            "dtype": "f32", "text": "gettysburg", "positions": 64, "mean_kld": mean_kld,
            "mean_kld_unc": mean_kld / 10, "median_kld": None, "kld_90": None, "kld_95": None,
            "kld_99": None, "kld_99_9": None, "max_kld": 20 * mean_kld, "same_top_p": 0.984375,
            "same_top_p_unc": 0.0156, "rms_dp": 0.0123, "rms_dp_unc": 0.001, "flips": 1,
            "near_ties": 0, "gate": gate, "gate_reasons": reasons,
            "prefill_tok_s": tok_s and 50 * tok_s, "prefill_tokens": tok_s and 512,
            "decode_mode": tok_s and "graph", "eager_tok_s": tok_s and tok_s / 10,
            "batch_size": tok_s and 8, "batch_tok_s": tok_s and 6 * tok_s,
            "decode_tok_s": tok_s, "ms_per_token": tok_s and 1e3 / tok_s,
            "ms_per_token_spread": tok_s and 0.05, "roofline_tok_s": tok_s and 4 * tok_s,
            "summary_json": "{}", "seconds": 1.0}


def test_model_page_shows_the_newest_run_per_plan_and_its_history(tmp_path):
    store = Store(tmp_path / "store")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    runs = [_run_id(now - timedelta(hours=2 - i), f"m{i:05d}") for i in range(2)]
    mutant = "torch+dequant_gemv=mutant:group_off_by_one"
    for i, run_id in enumerate(runs):
        store.write("runs", [_runs_row(run_id, now - timedelta(hours=2 - i), "model", "{}")],
                    run_id, 0)
        store.write("model", [_model_row(run_id, "torch", 1e-6 * (i + 1), "pass",
                                         tok_s=100.0 + i),
                              _model_row(run_id, mutant, 0.5 + i, "fail",
                                         f"mean KLD {0.5 + i} > 1e-4")], run_id, 0)
    assert report(tmp_path / "store", tmp_path / "site") == 0
    out = tmp_path / "site"
    assert "model.html" in local_refs(out / "index.html")
    for ref in local_refs(out / "model.html"):
        assert (out / ref.split("#")[0]).is_file(), f"model.html: broken link {ref}"
    text = (out / "model.html").read_text()
    table = text[text.index("<h2>newest run"):text.index("<h2>over runs")]
    assert runs[1] in table and runs[0] not in table  # the newest run's rows only
    assert '<td class="ok">pass</td>' in table
    assert '<td class="bad">fail: mean KLD 1.5 &gt; 1e-4</td>' in table and mutant in table
    assert "2e-06 ± 2e-07" in table and "98.44 ± 1.56" in table
    # null KLD order stats; the untimed row's decode, ms, eager, roofline, batch and prefill
    assert table.count("<td class=\"num\">-</td>") == 2 * 2 + 6
    assert "(8)</td>" in table and "(512)</td>" in table and "<td>graph</td>" in table
    assert text.count("Plotly.newPlot(") == 2  # one figure per (model, plan)
    assert '"name":"decode tok/s gettysburg"' in text and runs[0] in text


def test_unwritable_out_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert report(tmp_path / "none", blocker / "site") == 2
    assert "cannot write the report" in capsys.readouterr().out


def test_nightly_on_cpu_checks_skips_bench_and_reports(tmp_path, capsys):
    out = tmp_path / "site"
    argv = ["--store", str(tmp_path / "store"), "nightly", "--out", str(out), "--impl",
            NORM_IMPLS, "--preset", "qwen3-0.6b", "--dtype", "bf16"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "bench skipped: no selected backend runs on an accelerator" in text
    assert "insufficient history" in text and (out / "index.html").is_file()
    assert main(argv) == 0  # a second night: history enough to compare, nothing regressed
    assert "insufficient history" not in capsys.readouterr().out
    runs = Store(tmp_path / "store").read("runs").to_pylist()
    tiers = {json.loads(r["filters"])["tier"] for r in runs if r["verb"] == "check"}
    assert tiers == {"nightly"}  # the nightly job checks every gate case


def test_nightly_exits_1_when_the_check_fails(tmp_path, capsys):
    out = tmp_path / "site"
    rc = main(["--store", str(tmp_path / "store"), "--plugin", MUTANTS, "nightly", "--out",
               str(out), "--impl", "torch:mutant_drop_eps", "--preset", "qwen3-0.6b",
               "--dtype", "bf16", "--no-bench"])
    text = capsys.readouterr().out
    assert rc == 1 and "bench skipped: --no-bench" in text
    assert f"repro: kparity --store {tmp_path / 'store'} --plugin {MUTANTS}" in text
    page = (out / impl_page_name("torch:mutant_drop_eps")).read_text()
    assert "kparity repro" in page and f'class="mixed">{len(DISTRIBUTIONS) - 2} pass, 2 fail' in (out / "index.html"
                                                                         ).read_text()


def test_failing_rows_repro_names_the_runs_plugins():
    from results.report_impl import _failures

    row = {"case_id": "ef89a1a7dd0a", "label": "preset:qwen3-0.6b", "dtype": "bf16",
           "dist": "tiny", "dims": "{}", "status": "fail", "expect": "valid",
           "message": "out[0] = <inf>"}
    text = _failures("torch:mutant_drop_eps", [row, {**row, "status": "pass"}],
                     "kparity --plugin tests/mutants.py nightly --out site")
    assert text.count("<tr>") == 2 and "out[0] = &lt;inf&gt;" in text
    assert ("kparity --plugin tests/mutants.py repro ef89a1a7dd0a --impl torch:mutant_drop_eps"
            in text)


def test_nightly_benches_accelerated_backends_and_fails_on_a_regression(tmp_path, monkeypatch,
                                                                         capsys):
    """The bench and compare steps' plumbing, with torch posing as an accelerator and the two
    verbs stubbed out: bench gets the accelerated backend and the other filters, compare gets
    each run of the night, and a regression from compare fails the night."""
    import gpu_impls
    import verbs.history
    import verbs.timing

    monkeypatch.setattr(type(gpu_impls.backend("torch")), "accelerator", property(lambda s: True))
    benched, compared = [], []

    def bench(args):
        benched.append((args.backend, args.impl, args.preset))
        run_id = _run_id(datetime.now(timezone.utc) + timedelta(seconds=1), "bench1")
        Store(args.store).write("runs", [_runs_row(run_id, datetime.now(timezone.utc), "bench",
                                                   '{"torch": "cpu"}')], run_id, 0)
        return 0

    def compare(args):
        compared.append((args.run_a, args.baseline))
        return 1 if args.run_a.endswith("bench1") else 0
    monkeypatch.setitem(verbs.timing.VERBS, "bench", bench)
    monkeypatch.setitem(verbs.history.VERBS, "compare", compare)
    rc = main(["--store", str(tmp_path / "store"), "nightly", "--out", str(tmp_path / "site"),
               "--impl", "torch:rms_norm", "--preset", "qwen3-0.6b", "--dtype", "bf16",
               "--baseline", "7"])
    out = capsys.readouterr().out
    assert rc == 1 and "bench on torch" in out, out
    assert benched == [(["torch"], ["torch:rms_norm"], ["qwen3-0.6b"])]
    assert [run[-6:] for run, _ in compared][1] == "bench1" and len(compared) == 2
    assert {n for _, n in compared} == {7} and (tmp_path / "site" / "index.html").is_file()


def test_nightly_refuses_a_baseline_under_2(tmp_path, capsys):
    assert main(["--store", str(tmp_path / "store"), "nightly", "--out", str(tmp_path / "site"),
                 "--baseline", "1"]) == 2
    assert "needs at least 2 runs" in capsys.readouterr().out


# --- the headline, repro runs, retired impls, a missing extra (issue 25) -----------------------

def test_headline_is_the_latest_sweep_not_a_repro_and_retired_impls_are_apart(tmp_path):
    from tests.test_history import MUTANT, NORM, run_id, sweeps_with_a_plugin_impl_and_a_repro

    store = Store(tmp_path / "store")
    sweeps_with_a_plugin_impl_and_a_repro(store)
    repro = run_id(1)
    # A repro after the last sweep: still not the headline.
    from tests.test_history import write_sweep
    write_sweep(store, 4, "repro", [(NORM, "rms_norm", "c0", "fail", 9.0)], impls=[NORM])
    assert report(tmp_path / "store", tmp_path / "site") == 0
    index = (tmp_path / "site" / "index.html").read_text()
    assert "latest check: OK: 1</h2>" in index and f"<td>{run_id(3)}</td>" in index
    assert "FAILED" not in index
    assert index.count("repro (not in the history)") == 2 and repro in index
    current, retired = index.split("retired impls (1)")
    assert MUTANT not in current and NORM in current
    assert MUTANT in retired and run_id(3) in retired and NORM not in retired
    page = (tmp_path / "site" / impl_page_name(NORM)).read_text()
    assert f"latest check (run {run_id(3)})" in page and "9.0" not in page  # no repro point
    regressions = (tmp_path / "site" / "regressions.html").read_text()
    assert f"0 series judged; 5 not judged (fewer than {MIN_HISTORY} runs" in regressions


def test_report_and_nightly_without_plotly_exit_2_naming_the_extra(tmp_path, monkeypatch,
                                                                    capsys):
    import sys

    monkeypatch.setitem(sys.modules, "plotly", None)  # `import plotly` raises ImportError
    assert report(tmp_path / "store", tmp_path / "site") == 2
    assert "kparity report needs plotly: pip install 'kparity[history]'" in \
        capsys.readouterr().out
    assert main(["--store", str(tmp_path / "store"), "nightly", "--out", str(tmp_path / "site"),
                 "--impl", "torch:rms_norm", "--preset", "qwen3-0.6b", "--dtype", "bf16",
                 "--no-bench"]) == 2
    assert "kparity nightly needs plotly" in capsys.readouterr().out
    assert not (tmp_path / "store").exists()  # refused before its check ran
