"""The dashboard in a real browser: `rcdiag dashboard` serves two runs, headless Debian Chromium (Playwright) opens
every page, clicks into a sequence, checks the shown values and saves screenshots.

Screenshots go to $RCDIAG_SCREENSHOTS when set, else to the test's tmp dir. $RCDIAG_SCREENSHOT_RUNS (paths joined
by ':') serves other runs instead of the synthetic pair; every expected value is computed from the first one.
docs/screenshots was made with:

    RCDIAG_SCREENSHOTS=docs/screenshots RCDIAG_SCREENSHOT_RUNS=runs/sample:runs/other \
        .venv/bin/python -m pytest tests/dashboard/test_browser.py
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import rcdiag
from app import data, tokenstrip, ui
from rcdiag.commands.dashboard import free_port

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
RCDIAG = Path(sys.executable).with_name("rcdiag")
START_TIMEOUT = 90


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
            return response.read().strip() == b"ok"
    except OSError:
        return False


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def served(noisy_run, clean_dash_run) -> list[Path]:
    """The runs the server opens: $RCDIAG_SCREENSHOT_RUNS, else the synthetic noisy and clean runs."""
    chosen = os.environ.get("RCDIAG_SCREENSHOT_RUNS")
    return [Path(p) for p in chosen.split(":")] if chosen else [noisy_run.path, clean_dash_run.path]


@pytest.fixture(scope="module")
def server(served, tmp_path_factory):
    """`rcdiag dashboard RUN RUN --port P` as a subprocess; always stopped (SIGTERM) at the end, and the port
    must then be closed (the command stops its streamlit child)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install -y chromium)")
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(RCDIAG), "dashboard", *map(str, served), "--port", str(port)], stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _healthy(url):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"server did not start:\n{log.read_text()}"
            time.sleep(0.5)
        assert f"rcdiag dashboard: {url}" in log.read_text()
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for _ in range(40):
        if not _port_open(port):
            break
        time.sleep(0.25)
    assert not _port_open(port), "streamlit still listening after rcdiag dashboard was stopped"


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1250})
            yield context.new_page()
        finally:
            browser.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    target = Path(os.environ.get("RCDIAG_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    target.mkdir(parents=True, exist_ok=True)
    return target


def settle(page, text: str) -> None:
    """Wait until `text` shows and the script has finished running (stApp's script state), then let charts draw."""
    page.get_by_text(text, exact=False).first.wait_for(timeout=60_000)
    page.locator('[data-testid="stApp"][data-test-script-state="notRunning"]').wait_for(timeout=120_000)
    page.wait_for_timeout(1200)


def assert_no_exception(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0
    body = page.inner_text("body")
    assert "Traceback" not in body and "Internal error" not in body, body[:2000]


def test_every_page_in_chromium(server, page, shots, served):
    run = rcdiag.open_run(served[0])
    metrics = rcdiag.compute_metrics(run)
    tis = rcdiag.simulate(run, "token_truncate", threshold=2.0)

    page.goto(server)
    settle(page, f"Overview · {run.name}")
    page.locator(".rcdiag-card").nth(7).wait_for(timeout=30_000)  # st.html renders after the script ends
    assert page.locator(".rcdiag-card").count() == 8
    kl_card = page.locator(".rcdiag-card").filter(has_text="· kl").first.inner_text()
    assert ui.fmt(metrics["kl"]) in kl_card, kl_card
    assert_no_exception(page)
    page.screenshot(path=str(shots / "overview.png"), full_page=True)

    page.goto(f"{server}/distributions")
    settle(page, "valid tokens in")
    assert f"{int(metrics['tokens']):,} valid tokens" in page.inner_text("body")
    page.locator('[data-testid="stVegaLiteChart"]').nth(4).wait_for(timeout=30_000)
    assert_no_exception(page)
    page.screenshot(path=str(shots / "distributions.png"), full_page=True)

    page.goto(f"{server}/simulator")
    settle(page, "clipped_frac")
    assert _metric(page, "clipped_frac") == ui.fmt(tis["clipped_frac"])
    assert _metric(page, "ess") == ui.fmt(tis["ess"])
    page.screenshot(path=str(shots / "simulator.png"), full_page=True)
    page.locator('[data-testid="stSlider"] input[type="range"]').first.focus()
    page.keyboard.press("Home")
    low = rcdiag.simulate(run, "token_truncate", threshold=1.01)
    page.wait_for_function(f"() => document.body.innerText.includes('{ui.fmt(low['clipped_frac'])}')",
                           timeout=60_000)
    assert _metric(page, "clipped_frac") == ui.fmt(low["clipped_frac"])
    assert_no_exception(page)

    page.goto(f"{server}/sequences")
    settle(page, "Sequence ")
    page.locator('[data-testid="stSelectbox"]').filter(has_text="Sequence").last.click()
    option = page.get_by_role("option").nth(1)
    chosen = option.inner_text().strip()
    option.click()
    settle(page, chosen.replace("seq", "Sequence"))
    token = page.locator("#rcdiag-token-strip .rcdiag-tok").first
    token.wait_for(timeout=30_000)
    title = token.get_attribute("title")
    assert "train a =" in title and "rollout b =" in title and "entropy =" in title, title
    _check_token_text(run, int(chosen.split()[1]), token.inner_text())
    token.hover()
    assert_no_exception(page)
    third = _worst_seq_ids(run)[2]
    _click_table_row(page, 2)
    settle(page, f"Sequence {third}")
    assert page.get_by_role("heading", name=f"Sequence {third}").count() == 1
    page.locator("#rcdiag-token-strip").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "sequences.png"), full_page=True)

    page.goto(f"{server}/compare")
    settle(page, "Compare runs")
    page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=30_000)
    page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=30_000)
    page.wait_for_timeout(1500)
    assert_no_exception(page)
    page.screenshot(path=str(shots / "compare.png"), full_page=True)


def _check_token_text(run, seq_id: int, shown: str) -> None:
    """The first token shows its text decoded by the run's tokenizer (the manifest's model path), else [id]."""
    first = run.tokens().query("seq_id == @seq_id").sort_values("pos").iloc[0]
    texts = data.decode_tokens(run.manifest, (int(first["token_id"]),))
    expected = tokenstrip.visible(texts[0]) if texts else f"[{int(first['token_id'])}]"
    assert shown == expected, (shown, expected)


def _click_table_row(page, row: int) -> None:
    """Click the row marker of row `row` (0-based) of the sequences table (35-pixel header and rows)."""
    grid = page.locator('[data-testid="stDataFrame"]').first
    grid.scroll_into_view_if_needed()
    box = grid.bounding_box()
    header = row_height = 35
    page.mouse.click(box["x"] + 12, box["y"] + header + row_height * row + row_height / 2)


def _worst_seq_ids(run) -> list[int]:
    """seq_ids sorted as the Sequences page sorts by default (max |ℓ| descending, then seq_id)."""
    from rcdiag.analysis.metrics import sequence_stats

    stats = sequence_stats(run)
    return stats.sort_values(["max_abs_log_ratio", "seq_id"], ascending=[False, True])["seq_id"].tolist()


def _metric(page, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]').filter(has_text=label).first
    return box.locator('[data-testid="stMetricValue"]').inner_text().strip()
