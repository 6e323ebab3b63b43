"""Same-named runs: the sidebar, Compare and links use the report's unique run names (store.names)."""
from __future__ import annotations

from rcdiag.store.names import unique_run_names
from tests.dashboard.conftest import assert_clean
from tests.fixtures.runs import build_run


def test_same_named_runs_get_the_reports_unique_names(make_app, tmp_path):
    first = build_run(tmp_path / "exp1" / "run", "clean", seed=1)
    second = build_run(tmp_path / "exp2" / "run", "clean", seed=2, noise=0.3)
    expected = unique_run_names([str(first.path), str(second.path)])
    assert expected[0] != expected[1]
    app = make_app(first, second)
    assert_clean(app)
    box = app.sidebar.selectbox(key="run_choice")
    assert box.options[:2] == expected
    app.switch_page("views/compare.py").run()
    assert_clean(app)
    columns = list(app.dataframe[0].value.columns)
    assert columns == ["metric", *expected, f"Δ {expected[1]}"], columns
