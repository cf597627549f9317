"""The README's pictures of the report: docs/img/report.png (the overview page) and
docs/img/report-impl.png (an impl page's plots).

    python -m scripts.report_screenshot [--out docs/img]

Builds the site `tests/test_report_browser.py` renders (two torch CPU checks, then the synthetic
H100 bench history of tests/test_report.py with its planted regression, one A/B) and takes the
top of each page in the same headless Chromium, through the same code (`readme_screenshots`;
the test runs it into a temporary folder). Needs /usr/bin/chromium and Playwright (the `test`
extra).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.test_report_browser import CHROMIUM, VIEWPORT, build_site, launch, readme_screenshots

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img",
                        help="folder for the PNGs (default: docs/img)")
    args = parser.parse_args(argv)
    if CHROMIUM is None:
        print("no chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 3
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        site = build_site(Path(tmp))
        with sync_playwright() as p:
            browser = launch(p)
            try:
                context = browser.new_context(viewport=VIEWPORT)
                for path in readme_screenshots(context, site, args.out):
                    print(f"wrote {path}")
            finally:
                browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
