"""Staleness across training where people read it: the report's trend table and figure, metrics.json's by_step,
and the dashboard's Trends page (AppTest of the real app) — with the lag columns on a run with versions, exactly
as before on one without.

Guards issue #31 "the trends": the per-step lag existed in the library only; and the trend section must not grow
empty lag columns (or a panel of NaN) for a run without versions.
"""
from __future__ import annotations

import json

from rcdiag.analysis.training.trend import trend
from rcdiag.cli import main
from rcdiag.report.trend_section import LAG_COLUMNS, TABLE_COLUMNS
from tests.dashboard.conftest import make_app  # noqa: F401 (fixture)
from tests.lag.asyncrun import async_run


def _table_headers(md: str) -> list[str]:
    at = md.index("## Across training")
    return [line for line in md[at:].splitlines() if line.startswith("| step |")]


def test_report_trend_shows_lag_columns(tmp_path):
    async_run(tmp_path / "run")
    assert main(["report", str(tmp_path / "run"), "-q"]) in (0, 1)
    md = (tmp_path / "run/report/report.md").read_text()
    main_table, lag_table = _table_headers(md)[:2]
    assert main_table.split("|")[1:-1] == [f" {c} " for c in TABLE_COLUMNS]  # as before
    assert lag_table.split("|")[1:-1] == [f" {c} " for c in ("step", *LAG_COLUMNS)], lag_table
    assert "The run has policy versions: per step (second table) its token lag" in md
    by_step = json.loads((tmp_path / "run/report/metrics.json").read_text())["by_step"]
    frame = trend(tmp_path / "run", replicates=5)
    assert [r["stale_token_share"] for r in by_step] == frame["stale_token_share"].tolist()
    assert [r["seq_lag_mean"] for r in by_step] == frame["seq_lag_mean"].tolist()
    assert (tmp_path / "run/report/trend.png").stat().st_size > 10_000


def test_report_trend_without_versions_is_unchanged(tmp_path):
    async_run(tmp_path / "plain", versions=False)
    assert main(["report", str(tmp_path / "plain"), "-q"]) in (0, 1)
    md = (tmp_path / "plain/report/report.md").read_text()
    assert _table_headers(md)[0].split("|")[1:-1] == [f" {c} " for c in TABLE_COLUMNS]
    assert not any("token_lag_mean" in h for h in _table_headers(md))
    assert "policy versions" not in md[md.index("## Across training"):]
    by_step = json.loads((tmp_path / "plain/report/metrics.json").read_text())["by_step"]
    assert not any(c in by_step[0] for c in LAG_COLUMNS)


def test_trends_page_draws_the_lag(make_app, tmp_path, monkeypatch):  # noqa: F811
    """The stale share and the floor as two more panels; the chosen step's lag in words."""
    monkeypatch.chdir(tmp_path)
    async_run(tmp_path / "run")
    app = make_app(tmp_path / "run", page="trends")
    assert not app.exception, [e.value for e in app.exception]
    captions = " ".join(c.value for c in app.caption)
    assert "Policy lag: mean " in captions and "at lag ≥ 1; mean |ℓ|" in captions and "Trajectories:" in captions
    panels = {e.key for e in app.get("vega_lite_chart") if str(e.key).startswith("trend_chart_")}
    assert {"trend_chart_stale_token_share", "trend_chart_floor_abs_log_ratio_mean"} <= panels and len(panels) == 8
    async_run(tmp_path / "plain", versions=False)
    app = make_app(tmp_path / "plain", page="trends")
    assert not app.exception and "Policy lag" not in " ".join(c.value for c in app.caption)
    assert len([e for e in app.get("vega_lite_chart") if str(e.key).startswith("trend_chart_")]) == 6
