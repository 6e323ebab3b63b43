"""The dashboard in a real browser: `rcdiag dashboard` serves three runs, headless Debian Chromium (Playwright)
opens every page on the heavy-tailed one (the last; chosen through the URL), clicks into a sequence, checks the
shown values and saves screenshots (dashboard-<page>.png).

Screenshots go to $RCDIAG_SCREENSHOTS when set, else to the test's tmp dir. $RCDIAG_SCREENSHOT_RUNS (paths joined
by ':') serves other runs instead of the synthetic ones; every expected value is computed from the last one.
docs/screenshots/dashboard-*.png were made with:

    RCDIAG_SCREENSHOTS=docs/screenshots .venv/bin/python -m pytest tests/dashboard/test_browser.py -m browser
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
from app import bands, data, tokenstrip, ui
from app.simvalues import shown
from rcdiag.commands.dashboard import free_port
from tests.dashboard.conftest import PAYLOAD_HOST, PAYLOADS

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
def served(noisy_run, clean_dash_run, heavy_run) -> list[Path]:
    """The runs the server opens: $RCDIAG_SCREENSHOT_RUNS, else the synthetic noisy, clean and heavy-tailed runs
    (the heavy one carries Markdown/HTML payloads in its data)."""
    chosen = os.environ.get("RCDIAG_SCREENSHOT_RUNS")
    return [Path(p) for p in chosen.split(":")] if chosen else [noisy_run.path, clean_dash_run.path, heavy_run.path]


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
def traffic() -> dict[str, list]:
    """Every request URL and every console error of the module's browser (checked by test_offline_and_quiet)."""
    return {"requests": [], "console": [], "failed": []}


@pytest.fixture(scope="module")
def page(server, traffic):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 2400})
            context.on("request", lambda r: traffic["requests"].append(r.url))
            context.on("response", lambda r: traffic["failed"].append(r.url) if r.status >= 400 else None)
            tab = context.new_page()
            tab.on("console", lambda m: traffic["console"].append(m.text) if m.type == "error" else None)
            yield tab
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
    run = rcdiag.open_run(served[-1])
    metrics = rcdiag.compute_metrics(run)
    tis = rcdiag.simulate(run, "token_truncate", threshold=2.0)
    q = f"?run={run.name}"

    page.goto(f"{server}/{q}")
    settle(page, f"Overview · {run.name}")
    cards = len(bands.BANDS)  # one card per health band of the library (rcdiag.analysis.verdict.health)
    page.locator(".rcdiag-card").nth(cards - 1).wait_for(timeout=30_000)  # st.html renders after the script ends
    assert page.locator(".rcdiag-card").count() == cards
    kl_card = page.locator(".rcdiag-card").filter(has_text="· kl").first.inner_text()
    assert ui.fmt(metrics["kl"]) in kl_card, kl_card
    assert_no_exception(page)
    page.screenshot(path=str(shots / "dashboard-overview.png"), full_page=True)

    page.goto(f"{server}/distributions{q}")
    settle(page, "valid tokens in")
    assert f"{int(metrics['tokens']):,} valid tokens" in page.inner_text("body")
    page.locator('[data-testid="stVegaLiteChart"]').nth(4).wait_for(timeout=30_000)
    assert_no_exception(page)
    page.screenshot(path=str(shots / "dashboard-distributions.png"), full_page=True)

    page.goto(f"{server}/simulator{q}")
    settle(page, "clipped_frac")
    assert _metric(page, "clipped_frac") == shown("clipped_frac", tis["clipped_frac"])
    assert _metric(page, "ess") == shown("ess", tis["ess"])
    page.screenshot(path=str(shots / "dashboard-simulator.png"), full_page=True)
    page.locator('[data-testid="stSlider"] input[type="range"]').first.focus()
    page.keyboard.press("Home")
    low = rcdiag.simulate(run, "token_truncate", threshold=1.01)
    page.wait_for_function(f"() => document.body.innerText.includes('{shown('clipped_frac', low['clipped_frac'])}')",
                           timeout=60_000)
    assert _metric(page, "clipped_frac") == shown("clipped_frac", low["clipped_frac"])
    assert "threshold=1.01" in page.url  # the setting is in the address bar
    assert_no_exception(page)

    page.goto(f"{server}/sequences{q}")
    settle(page, "Sequence ")
    page.locator('[data-testid="stSelectbox"]').filter(has_text="Sequence").last.click()
    option = page.get_by_role("option").nth(1)
    chosen = option.inner_text().strip()
    option.click()
    settle(page, chosen.replace("seq", "Sequence"))
    token = page.locator("#rcdiag-token-strip .rcdiag-tok").first
    token.wait_for(timeout=30_000)
    title = token.get_attribute("title")
    assert "trainer a =" in title and "engine b =" in title and "entropy =" in title, title
    _check_token_text(run, int(chosen.split()[1]), token.inner_text())
    token.hover()
    assert_no_exception(page)
    third = _worst_seq_ids(run)[2]
    _click_table_row(page, 2)
    settle(page, f"Sequence {third}")
    assert page.get_by_role("heading", name=f"Sequence {third}").count() == 1
    page.locator("#rcdiag-token-strip").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "dashboard-sequences.png"), full_page=True)

    page.goto(f"{server}/compare{q}")
    settle(page, "Compare runs")
    page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=30_000)
    page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=30_000)
    page.wait_for_timeout(1500)
    assert_no_exception(page)
    page.screenshot(path=str(shots / "dashboard-compare.png"), full_page=True)

    page.goto(f"{server}/probes{q}")
    settle(page, "Probes")
    assert_no_exception(page)
    page.screenshot(path=str(shots / "dashboard-probes.png"), full_page=True)

    page.goto(f"{server}/trends{q}")
    settle(page, f"Trends · {run.name}")
    steps = run.sequences(["step"])["step"].nunique()
    if steps > 1:  # the heavy-tailed fixture: 8 steps, a tail growing with the step
        settle(page, "Step (or click a point above)")
        page.locator('[data-testid="stVegaLiteChart"]').nth(6).wait_for(timeout=30_000)  # 6 panels + the step's
        assert "drift" in page.inner_text("body").lower()
    assert_no_exception(page)
    page.screenshot(path=str(shots / "dashboard-trends.png"), full_page=True)


def test_link_reopens_the_view(server, page, served):
    """A pasted link with query parameters reopens the same run, sequence and simulator settings."""
    heavy = rcdiag.open_run(served[-1])
    page.goto(f"{server}/sequences?run={heavy.name}&seq=7&sort=seq_id&desc=0&page=2")
    settle(page, "Sequence 7")
    assert page.get_by_role("heading", name="Sequence 7").count() == 1
    assert page.get_by_role("heading", name=f"Sequences · {heavy.name}").count() == 1
    assert page.locator('[data-testid="stNumberInput"] input').first.input_value() == "2"
    assert "seq=7" in page.url and f"run={heavy.name}" in page.url
    page.goto(f"{server}/simulator?run={heavy.name}&mode=token_mask&convention=verl&threshold=1.5&lower=0.8")
    settle(page, "clipped_frac")
    expected = rcdiag.simulate(heavy, "token_mask", threshold=1.5, lower=0.8, convention="verl")
    assert _metric(page, "kept_token_frac") == shown("kept_token_frac", expected["kept_token_frac"])
    assert _metric(page, "clipped_frac") == shown("clipped_frac", expected["clipped_frac"])
    assert_no_exception(page)


def test_simulator_disables_an_invalid_combination(server, page, served):
    """verl + a lower bound + sequence_truncate blanked the page: now the lower bound is disabled with the reason."""
    page.goto(f"{server}/simulator?mode=sequence_truncate&convention=verl&lower=0.5")
    settle(page, "Lower bound unavailable")
    box = page.locator('[data-testid="stCheckbox"]').filter(has_text="Lower bound L").locator("input")
    assert box.is_disabled()
    assert "verl has no lower bound for truncate" in page.inner_text("body")
    run = rcdiag.open_run(served[0])
    expected = rcdiag.simulate(run, "sequence_truncate", threshold=2.0, convention="verl")
    assert _metric(page, "clipped_frac") == shown("clipped_frac", expected["clipped_frac"])
    assert_no_exception(page)


def test_simulator_scrubs_in_the_browser(server, page):
    """Hovering the sweep moves the read-out panel to another threshold without a rerun of the script."""
    page.goto(f"{server}/simulator")
    settle(page, "At the hovered threshold")
    chart = page.locator('[data-testid="stVegaLiteChart"]').first
    head = chart.locator("text").filter(has_text="token_truncate at C =")
    assert head.first.text_content().endswith("C = 2")
    runs = page.evaluate("() => window.__runs = 0")  # counts script runs from here on
    page.evaluate("""() => new MutationObserver(() => {
        const app = document.querySelector('[data-testid="stApp"]');
        if (app.getAttribute('data-test-script-state') === 'running') window.__runs += 1; })
        .observe(document.querySelector('[data-testid="stApp"]'), {attributes: true})""")
    box = chart.locator("svg").first.bounding_box()
    page.mouse.move(box["x"] + 80, box["y"] + 150)
    page.mouse.move(box["x"] + 90, box["y"] + 150)
    page.wait_for_timeout(500)
    text = head.first.text_content()
    assert text != "token_truncate at C = 2" and float(text.rsplit("= ", 1)[1]) < 2, text
    assert page.evaluate("() => window.__runs") == 0, runs


def test_simulator_controls_update_the_chart_in_place(server, page):
    """A threshold step and a mode change swap the sweep chart's datasets into the Vega view the page has (the same
    <svg> stays; re-creating the view cost 60-80 ms of the browser's main thread per control), the diamond and
    the read-out follow the setting while the mouse is off the chart, and hovering still reads other thresholds."""
    page.goto(f"{server}/simulator")
    settle(page, "At the hovered threshold")
    chart = page.locator('[data-testid="stVegaLiteChart"]').first
    head = chart.locator("text").filter(has_text=" at C =").first
    assert head.text_content() == "token_truncate at C = 2"
    chart.locator("svg").first.evaluate("svg => { svg.__rcdiag_marked = true; }")
    page.locator('[data-testid="stSlider"] input[type="range"]').first.focus()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("() => location.search.includes('threshold=1.98')", timeout=60_000)
    settle(page, "At the hovered threshold")
    assert head.text_content() == "token_truncate at C = 1.98"
    page.locator('[data-testid="stSelectbox"]').filter(has_text="Mode").first.click()
    page.get_by_role("option", name="token_mask", exact=True).click()
    page.wait_for_function("() => location.search.includes('mode=token_mask')", timeout=60_000)
    settle(page, "At the hovered threshold")
    assert head.text_content() == "token_mask at C = 1.98"
    assert chart.locator("svg").first.evaluate("svg => svg.__rcdiag_marked === true"), "the chart was re-created"
    box = chart.locator("svg").first.bounding_box()
    page.mouse.move(box["x"] + 80, box["y"] + 150)
    page.mouse.move(box["x"] + 90, box["y"] + 150)
    page.wait_for_timeout(300)
    hovered = head.text_content()
    assert hovered.startswith("token_mask at C = ") and hovered != "token_mask at C = 1.98", hovered
    page.mouse.move(5, 5)  # off the chart: back to the slider's setting
    page.wait_for_timeout(300)
    assert head.text_content() == "token_mask at C = 1.98"


def test_simulator_marks_the_recommended_setting(server, page, served):
    """The report's recommendation (rcdiag.report.recommend of the same one pass) is named under the sweep, and
    its button moves the controls there (the URL follows)."""
    from rcdiag.report.build import judge
    from rcdiag.report.recommend import recommend

    heavy = rcdiag.open_run(served[-1])
    advice = recommend(judge(heavy)).to_dict()
    assert advice["mode"], advice  # the heavy-tailed run needs a correction
    page.goto(f"{server}/simulator?run={heavy.name}&mode=sequence_mask&threshold=5")
    settle(page, "Red ring: the report's recommendation")
    assert f"{advice['mode']} at C = {advice['threshold']:g}" in page.inner_text("body")
    page.get_by_role("button", name="Use the recommended setting").click()
    page.wait_for_function(f"() => location.search.includes('mode={advice['mode']}')", timeout=60_000)
    settle(page, "clipped_frac")
    assert f"threshold={advice['threshold']:g}" in page.url
    expected = rcdiag.simulate(heavy, advice["mode"], threshold=advice["threshold"])
    assert _metric(page, "clipped_frac") == shown("clipped_frac", expected["clipped_frac"])
    assert_no_exception(page)


def test_compare_legend_has_one_colour_per_run(server, page, served):
    """Colour encodes the run: the histogram legend lists each run once, each with its own colour."""
    page.goto(f"{server}/compare")
    settle(page, "Compare runs")
    chart = page.locator('[data-testid="stVegaLiteChart"]').first
    chart.locator(".role-legend-label text").first.wait_for(timeout=30_000)
    labels = chart.locator(".role-legend-label text").all_text_contents()
    colours = chart.locator(".role-legend-symbol path").evaluate_all("els => els.map(e => e.getAttribute('stroke'))")
    names = [Path(p).name for p in served][:4]
    assert labels == names, labels
    assert len(set(colours)) == len(names), colours
    lines = chart.locator(".role-mark path").evaluate_all("els => els.map(e => e.getAttribute('stroke'))")
    assert set(lines) == set(colours), (lines, colours)


def test_charts_are_created_with_their_data(server, page):
    """Chart data travel as named datasets, which the browser compiles into the view it creates; as top-level
    inline data they were inserted only after the view had run once empty, and Vega warned of an infinite extent
    for every field of every chart (and computed each scale twice)."""
    warnings: list[str] = []
    listener = lambda m: warnings.append(m.text) if m.type == "warning" else None  # noqa: E731
    page.on("console", listener)
    try:
        for path, text in (("distributions", "valid tokens in"), ("compare", "Compare runs")):
            page.goto(f"{server}/{path}")
            settle(page, text)
            page.locator('[data-testid="stVegaLiteChart"]').nth(3).wait_for(timeout=30_000)
    finally:
        page.remove_listener("console", listener)
    assert not [w for w in warnings if "Infinite extent" in w or "domain includes zero" in w], warnings


def test_markdown_in_run_data_is_text(server, page, served, traffic):
    """prompt_id = ![x](http://host/pixel) and an <img>/link in finish_reason show as text and fetch nothing."""
    heavy = rcdiag.open_run(served[-1])
    page.goto(f"{server}/sequences?run={heavy.name}&seq=0")
    settle(page, "Sequence 0")
    body = page.inner_text("body").replace("\u200b", "")
    for payload in PAYLOADS.values():
        assert payload in body, payload
    caption = page.locator('[data-testid="stCaptionContainer"]').filter(has_text="prompt_id")
    assert caption.locator("img, a").count() == 0
    assert page.get_by_text("What is 0+0?").count() == 1  # the ChatML prompt as turns, not raw markers
    assert "<|im_start|>" not in body
    page.goto(f"{server}/distributions?run={heavy.name}")
    settle(page, "valid tokens in")
    assert not [u for u in traffic["requests"] if PAYLOAD_HOST in u]


def test_offline_and_quiet(server, page, traffic):
    """Every page, after the tests above: no request left 127.0.0.1, none failed and no console error (a deep link
    used to probe <page>/_stcore/health and host-config first: two 404s a page, gone since app/serve.py)."""
    for path in ("", "distributions", "simulator", "sequences", "trends", "compare", "probes"):
        page.goto(f"{server}/{path}")
        page.locator('[data-testid="stApp"][data-test-script-state="notRunning"]').wait_for(timeout=120_000)
        page.wait_for_timeout(1000)
        assert_no_exception(page)
    assert traffic["requests"]
    off = [u for u in traffic["requests"] if not u.startswith((server, "data:", "blob:"))]
    assert not off, off
    assert traffic["failed"] == [], traffic["failed"]
    assert traffic["console"] == [], traffic["console"]


def _check_token_text(run, seq_id: int, text: str) -> None:
    """The first token shows its text decoded by the run's tokenizer (the manifest's model path), else [id]."""
    first = run.tokens().query("seq_id == @seq_id").sort_values("pos").iloc[0]
    texts = data.decode_tokens(run.manifest, (int(first["token_id"]),))
    expected = tokenstrip.visible(texts[0]) if texts else f"[{int(first['token_id'])}]"
    assert text == expected, (text, expected)


def _click_table_row(page, row: int) -> None:
    """Click the row marker of row `row` (0-based) of the sequences table (35-pixel header and rows)."""
    grid = page.locator('[data-testid="stDataFrame"]').first
    grid.scroll_into_view_if_needed()
    box = grid.bounding_box()
    header = row_height = 35
    page.mouse.click(box["x"] + 12, box["y"] + header + row_height * row + row_height / 2)


def _worst_seq_ids(run) -> list[int]:
    """seq_ids sorted as the Sequences page sorts by default (max |ℓ| descending, then seq_id)."""
    from rcdiag.analysis.metrics.compute import sequence_stats

    stats = sequence_stats(run)
    return stats.sort_values(["max_abs_log_ratio", "seq_id"], ascending=[False, True])["seq_id"].tolist()


def _metric(page, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]').filter(has_text=label).first
    return box.locator('[data-testid="stMetricValue"]').inner_text().strip()
