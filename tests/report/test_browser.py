"""report.html in headless Chromium (Debian's, via Playwright): every plot decodes and the page is not blank."""
from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest

from rcdiag.report.make import make_report
from rcdiag.report.options import ReportOptions

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail("headless Chromium missing: run `make browser` (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield chromium
        chromium.close()


def _open(browser, path: Path, tmp_path: Path):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(path.resolve().as_uri())
    page.wait_for_load_state("load")
    shot = tmp_path / "shot.png"
    page.screenshot(path=str(shot), full_page=True)
    return page, shot


def _pixels(png: Path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png.read_bytes())).convert("RGB"), dtype=np.int16)


def _assert_rendered(page, shot: Path, expected_images: int) -> None:
    sizes = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
    assert len(sizes) == expected_images
    assert all(done and w > 100 and h > 100 for done, w, h in sizes), sizes
    pixels = _pixels(shot)
    assert pixels.shape[0] > 2000, "full page"
    colours = np.unique(pixels[::4, ::4].reshape(-1, 3), axis=0)
    assert len(colours) > 200, "screenshot is blank or nearly uniform"
    assert pixels.std() > 10
    assert page.locator(".finding").count() == 8


def test_single_report_renders(browser, synthetic_runs, tmp_path):
    result = make_report([synthetic_runs["top_p"]], tmp_path / "rep", ReportOptions(replicates=50))
    page, shot = _open(browser, result.out / "report.html", tmp_path)
    _assert_rendered(page, shot, expected_images=4)
    assert page.locator('.finding.warning[data-check="truncation_offset"]').count() == 1
    assert "Recommendation" in page.locator("h2#recommendation").inner_text()
    shutil.copy(shot, result.out / "screenshot.png")  # kept with the report for a human look on failure
    page.close()


def test_comparison_report_renders(browser, synthetic_runs, tmp_path):
    result = make_report([synthetic_runs["clean"], synthetic_runs["bf16"]], tmp_path / "cmp",
                         ReportOptions(replicates=50))
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto((result.out / "report.html").resolve().as_uri())
    sizes = page.evaluate("Array.from(document.images).map(i => i.naturalWidth)")
    assert len(sizes) == 4 and min(sizes) > 100
    assert page.locator("table").first.inner_text().count("warning") == 1
    page.close()
