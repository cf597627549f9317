"""The report in headless Chromium (Playwright): every page loads from file:// with no console
error, no page error and no request leaving the folder; every plot renders its series.

Skips only when Chromium or Playwright is missing (CI installs Debian's chromium). Full-page
screenshots of the overview and one impl page land in tmp_path, and in $KPARITY_SCREENSHOT_DIR
when set. The README's pictures of the report (docs/img/) are taken by `readme_screenshots`, here
into tmp_path and by `python -m scripts.report_screenshot` into docs/img/.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from unittest import mock

import pytest

from results.report import impl_page_name
from tests.test_report import BENCH_IMPL, GEMV_IMPLS, NORM_IMPLS, build_store, report

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists()
                                        else None)
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

BENCH_SERIES = ["decode-1x4096 bf16 graph_rot", "hbm-65536x4096 bf16 graph_rot"]
# page -> plot div id -> series names it must draw (a subset: bands carry their own names)
EXPECTED = {
    "index.html": {},
    "regressions.html": {},
    "ab.html": {"fig-ab": [f"{BENCH_IMPL} vs torch:rms_norm (graph_rot)"]},
    impl_page_name(BENCH_IMPL): {"fig-latency": BENCH_SERIES + [f"{s} IQR" for s in BENCH_SERIES],
                                 "fig-copy": BENCH_SERIES},
    impl_page_name("torch:rms_norm"): {"fig-budget": ["qwen3-8b f32", "qwen3-8b f16",
                                                      "qwen3-8b bf16"]},
    impl_page_name("torch:rms_norm_llama"): {"fig-budget": ["qwen3-8b bf16"]},
    impl_page_name("torch:dequant_linear"): {"fig-budget": ["int8-g64 f32", "int8-g64 f16",
                                                            "int8-g64 bf16"]},
}
SCREENSHOTS = ["index.html", impl_page_name(BENCH_IMPL)]
VIEWPORT = {"width": 1300, "height": 900}
# The README's pictures (docs/img/): page -> (file, the top of the page kept, CSS px)
README_SHOTS = {"index.html": ("report.png", 712),
                impl_page_name(BENCH_IMPL): ("report-impl.png", 640)}

PLOTS_DRAWN = """() => Array.from(document.querySelectorAll('.plot')).every(
    el => el.classList.contains('js-plotly-plot') && el.querySelector('.main-svg'))"""
PLOTS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => ({
    id: el.id, names: el.data.map(t => t.name),
    drawn: el.querySelectorAll('.scatterlayer .trace').length}))"""


def build_site(root: Path) -> Path:
    """Two real torch CPU checks and the synthetic bench history (tests/test_report.py), then
    the report of that store: root/site. Each run records the kparity command that made it."""
    impls, presets = f"{NORM_IMPLS},{GEMV_IMPLS}", "qwen3-8b,int8-g64"
    argv = ["kparity", "--store", str(root / "store"), "check", "--impl", impls,
            "--preset", presets]
    with mock.patch.object(sys, "argv", argv):
        build_store(root / "store", impls=impls, presets=presets)
    assert report(root / "store", root / "site") == 0
    return root / "site"


def launch(playwright):
    """Chromium as the test drives it (CHROMIUM, ARGS)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)


def readme_screenshots(context, site: Path, folder: Path) -> list[Path]:
    """The README's pictures of the report: the top of each README_SHOTS page, once its plots
    are drawn, as a PNG in folder."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (png, height) in README_SHOTS.items():
        page = context.new_page()
        page.goto((site / name).as_uri())
        page.wait_for_function(PLOTS_DRAWN, timeout=15_000)
        page.screenshot(path=str(folder / png),
                        clip={"x": 0, "y": 0, "width": VIEWPORT["width"], "height": height})
        page.close()
        written.append(folder / png)
    return written


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return build_site(tmp_path_factory.mktemp("browser"))


def test_every_page_renders_in_chromium_without_errors(site, tmp_path):
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (CI installs Debian's chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    assert {p.name for p in site.glob("*.html")} == set(EXPECTED)
    shots = [tmp_path] + ([Path(os.environ["KPARITY_SCREENSHOT_DIR"])]
                          if os.environ.get("KPARITY_SCREENSHOT_DIR") else [])
    problems, outside = [], []
    with sync_api.sync_playwright() as p:
        browser = launch(p)
        try:
            context = browser.new_context(viewport=VIEWPORT)

            def only_local(route):  # the site must not reach anything outside its folder
                if route.request.url.startswith("file://"):
                    route.continue_()
                else:
                    outside.append(route.request.url)
                    route.abort()
            context.route("**/*", only_local)
            for name, plots in EXPECTED.items():
                page = context.new_page()
                page.on("console", lambda m, n=name: problems.append(f"{n}: console {m.text}")
                        if m.type == "error" else None)
                page.on("pageerror", lambda e, n=name: problems.append(f"{n}: page error {e}"))
                page.goto((site / name).as_uri())
                page.wait_for_function(PLOTS_DRAWN, timeout=15_000)
                got = {p["id"]: p for p in page.evaluate(PLOTS)}
                assert set(got) == set(plots), f"{name}: plots {sorted(got)}"
                for div, names in plots.items():
                    assert set(names) <= set(got[div]["names"]), (name, div, got[div]["names"])
                    assert got[div]["drawn"] > 0, f"{name} {div}: no trace drawn"
                if name in SCREENSHOTS:
                    for folder in shots:
                        folder.mkdir(parents=True, exist_ok=True)
                        page.screenshot(path=str(folder / name.replace(".html", ".png")),
                                        full_page=True)
                page.close()
            readme = readme_screenshots(context, site, tmp_path / "readme")
        finally:
            browser.close()
    assert not problems, problems
    assert not outside, f"requests outside the folder: {outside}"
    for name in SCREENSHOTS:
        assert (tmp_path / name.replace(".html", ".png")).stat().st_size > 10_000
    assert [p.name for p in readme] == [png for png, _ in README_SHOTS.values()]
    assert all(p.stat().st_size > 10_000 for p in readme)
