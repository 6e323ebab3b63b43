"""The verdict is one claim, the same on every surface: report, dashboard Overview, Trends and Compare pages, the
notebook card. Trends judged steps on their own numbers and showed a green "no drift" while the Overview said a
weight sync had failed; Compare tinted mean |ℓ| by a fixed band while the Overview judged it against the run's floor.
Runs from tests/fixtures/mechanisms.py and tests/fixtures/scenarios.py, written as imports write them."""
from __future__ import annotations

import html
import re

import pytest

from rcdiag.notebook import open_run
from rcdiag.report.build import build_report
from rcdiag.report.options import ReportOptions
from tests.dashboard.conftest import assert_clean, make_app  # noqa: F401  (fixture)
from tests.fixtures.mechanisms import build_mechanism
from tests.fixtures.scenarios import build_scenario

VERDICT = re.compile(r'<div class="rcdiag-verdict" data-status="([^"]+)" data-cause="([^"]+)".*?font-weight:700">'
                     r'(.*?)</div>', re.S)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("surfaces")
    return {"batching_bug": build_mechanism(root / "batching_bug", "batching_bug", "import"),
            "one_step_off": build_mechanism(root / "one_step_off", "one_step_off", "import"),
            "sync_bug": build_scenario(root / "sync_bug", "sync_bug"),
            "dense_floor": build_mechanism(root / "dense_floor", "dense_floor", "import")}


def _banners(app) -> list[tuple[str, str, str]]:
    return [m.groups() for e in app.get("html") for m in VERDICT.finditer(e.proto.body)]


def _claim(run) -> tuple[str, str, str]:
    v = build_report(run, ReportOptions(replicates=20)).verdict
    return v.status, v.cause.kind, v.headline()


@pytest.mark.parametrize("name", ["batching_bug", "one_step_off", "sync_bug", "dense_floor"])
def test_overview_and_notebook_card_say_what_the_report_says(runs, make_app, name):
    run = runs[name]
    status, kind, headline = _claim(run)
    app = make_app(run)
    assert_clean(app)
    assert (status, kind, headline) in [(s, k, html.unescape(h)) for s, k, h in _banners(app)]
    card = open_run(run.path)._repr_html_()
    assert f'data-status="{status}" data-cause="{kind}"' in card and html.escape(headline) in card


@pytest.mark.parametrize("name", ["one_step_off", "sync_bug"])
def test_trends_page_leads_with_the_runs_verdict(runs, make_app, name):
    """The Trends page opens with the Overview's verdict; a run that is not healthy never gets the green box."""
    run = runs[name]
    status, kind, headline = _claim(run)
    app = make_app(run, page="trends")
    assert_clean(app)
    first = _banners(app)[0]
    assert (first[0], first[1], html.unescape(first[2])) == (status, kind, headline)
    if status != "healthy":
        assert not app.success, [s.value for s in app.success]


def test_compare_shows_each_runs_verdict_and_judges_cells_as_the_verdict(runs, make_app):
    chosen = [runs["batching_bug"], runs["dense_floor"]]
    app = make_app(*chosen, page="compare")
    assert_clean(app)
    shown = {(s, k) for s, k, _ in _banners(app)}
    for run in chosen:
        status, kind, _ = _claim(run)
        assert (status, kind) in shown
