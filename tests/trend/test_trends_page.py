"""The dashboard's Trends page through Streamlit's AppTest: the drift warning on a drifting run, the numbers of the
chosen step (the library's), and a one-step run's plain explanation."""
from __future__ import annotations

import re

import pytest

import rcdiag
from rcdiag.analysis.training.trend import trend
from tests.dashboard.conftest import assert_clean, make_app  # noqa: F401  (fixture)
from tests.trend.conftest import CHANGE


def test_drifting_run_warns_and_shows_the_drift_step(make_app, drifting_run):  # noqa: F811
    app = make_app(drifting_run, page="trends")
    assert_clean(app)
    assert app.warning and app.warning[0].value.startswith("**Drift (warning).** The mismatch drifts up from step 6")
    assert app.selectbox(key="trend_step").value == CHANGE  # opens at the step where the drift starts
    frame = trend(drifting_run, replicates=10)
    card = next(h.proto.body for h in app.get("html") if "· k3_kl<" in h.proto.body)  # the band-coloured card
    shown = re.search(r'font-weight:600">([^<]+)</div>', card).group(1)
    want = frame.loc[frame["step"] == CHANGE, "k3_kl"].iloc[0]
    assert float(shown) == pytest.approx(want, rel=1e-3)
    app.selectbox(key="trend_step").set_value(9).run()
    assert_clean(app)
    assert app.subheader[-1].value == "Step 9"
    assert app.dataframe[-1].value["seq_id"].between(9 * 40, 9 * 40 + 39).all()


def test_one_step_run_says_there_is_nothing_to_trend(make_app, tmp_path, drifting_run):  # noqa: F811
    run = rcdiag.write_run(tmp_path / "one", drifting_run.tokens())
    app = make_app(run, page="trends")
    assert_clean(app)
    assert "This run has one step (0): nothing to trend." in app.info[0].value
