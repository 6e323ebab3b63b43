"""Papercuts seen as a user in the dashboard (issue #34 item 7), in headless Chromium against `rcdiag dashboard`:

- every page opened by its URL (a pasted link, a reload) logged two 404s, /<page>/_stcore/health and
  /<page>/_stcore/host-config (12 console errors over the 7 pages): Streamlit's front end looked for its server
  under the page's path first. app/serve.py tells it the backend is at the root; no request fails now;
- the Compare table formatted every cell with %.4g, so 45,533 tokens read 45530 (and a Δ of −43,733 read −43730).
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app.views import compare
from rcdiag.commands.dashboard import free_port

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
PAGES = ("", "distributions", "simulator", "sequences", "trends", "compare", "probes")


@pytest.fixture(scope="module")
def dashboard(noisy_run, clean_dash_run, tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed")
    pytest.importorskip("playwright")
    port = free_port()
    log = tmp_path_factory.mktemp("deep") / "server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rcdiag", "dashboard", str(noisy_run.path),
                                 str(clean_dash_run.path), "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                    if response.read().strip() == b"ok":
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.browser
def test_pages_opened_by_url_log_no_404(dashboard):
    from playwright.sync_api import sync_playwright

    failed, errors = [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
        try:
            for path in PAGES:  # a fresh tab per page: each is a deep link, as a pasted URL is
                tab = browser.new_page()
                tab.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
                tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                tab.goto(f"{dashboard}/{path}")
                tab.locator('[data-testid="stApp"][data-test-script-state="notRunning"]').wait_for(timeout=120_000)
                tab.wait_for_timeout(800)
                assert not tab.locator('[data-testid="stException"]').count(), path
                tab.close()
        finally:
            browser.close()
    assert failed == [] and errors == [], (failed, errors)


def test_compare_shows_counts_in_full_and_metrics_to_four_digits():
    table = pd.DataFrame({"metric": ["tokens", "sequences", "kl", "ess"], "a": [45533.0, 1801.0, 4.123456e-4, 0.99],
                          "b": [1800.0, 64.0, math.nan, 0.5]})
    table["Δ b"] = table["b"] - table["a"]
    html = compare.styled_table(table, pd.DataFrame("", index=table.index, columns=table.columns)).to_html()
    for shown in ("45,533", "1,801", "1,800", "-43,733", "-1,737", "0.0004123", "0.99", "—"):
        assert f">{shown}<" in html, shown
    assert "45530" not in html and "4.553e" not in html
    assert np.asarray(table["a"]).dtype == np.float64  # still numbers: the columns sort as numbers
