"""The dashboard Overview shows the same verdict, reasons and context line as `rcdiag report` (one health table,
rcdiag.analysis.verdict.health) — the issue's run read 'all checks pass' in the report and 3 alarms on the dashboard."""
from __future__ import annotations

import html
import re

import pytest

from app.text import md
from rcdiag.report.build import build_report
from rcdiag.report.context import context_line
from rcdiag.report.options import ReportOptions
from tests.dashboard.conftest import assert_clean

VERDICT = re.compile(r'<div class="rcdiag-verdict" data-status="([^"]+)".*?</div>(?:<ul[^>]*>(.*?)</ul>)?', re.S)


@pytest.mark.parametrize("fixture", ["noisy_run", "clean_dash_run"])
def test_overview_verdict_equals_the_report(make_app, request, fixture):
    run = request.getfixturevalue(fixture)
    app = make_app(run)
    assert_clean(app)
    shown = [VERDICT.search(e.proto.body) for e in app.get("html")]
    status, items = next(m.groups() for m in shown if m)
    report = build_report(run, ReportOptions(replicates=20))
    assert status == report.verdict.status
    assert [html.unescape(r) for r in re.findall(r"<li>(.*?)</li>", items or "")] == report.verdict.reasons
    assert any(c.value == md(context_line(run.manifest)) for c in app.caption)  # data strings are escaped
