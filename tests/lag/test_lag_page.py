"""The dashboard's Policy lag page on an async run with mixed lags (AppTest of the real app): the cause, the
buckets table and chart; a run without versions says how to get them. No exception on either."""
from __future__ import annotations

from app.text import plain
from tests.dashboard.conftest import make_app  # noqa: F401 (fixture)
from tests.lag.asyncrun import async_run


def test_lag_page(make_app, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    async_run(tmp_path / "run")
    app = make_app(tmp_path / "run", page="lag")
    assert not app.exception, [e.value for e in app.exception]
    assert "staleness: samples from older policy versions" in plain(app.error[0].value)
    table = app.dataframe[0].value
    assert table["lag"].tolist() == [0, 1, 2] and (table["tokens"] > 0).all()
    async_run(tmp_path / "plain", versions=False)
    app = make_app(tmp_path / "plain", page="lag")
    assert not app.exception and "carries no policy versions" in app.info[0].value


def test_lag_page_without_lag_is_one_line(make_app, tmp_path, monkeypatch):  # noqa: F811
    """A run with nothing lag-related (no versions, no repeated context to test the weights on): the page says
    so in one line, from the judged report's findings (no pass of its own)."""
    from tests.fixtures.runs import build_run

    monkeypatch.chdir(tmp_path)
    build_run(tmp_path / "plain", "clean", seed=4)
    app = make_app(tmp_path / "plain", page="lag")
    assert not app.exception, [e.value for e in app.exception]
    page = app.main
    assert len(page.info) == 1 and "carries no policy versions" in page.info[0].value
    assert not page.caption and not page.error and not page.warning and not page.dataframe
