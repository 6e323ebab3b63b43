"""Trends page on the multi-step heavy-tailed run: the timeline (step change or drift), and its state in the URL."""
from __future__ import annotations

import sys

from streamlit.testing.v1 import AppTest

from rcdiag.analysis.training.drift import timeline
from rcdiag.analysis.training.trend import trend
from tests.dashboard.conftest import APP, HEAVY_STEPS, assert_clean


def test_trends_link_reopens_step_and_settings(heavy_run, monkeypatch):
    """?convention=verl&threshold=3&step=2 opens Trends on step 2 with those settings, and the timeline is
    rcdiag's (rcdiag.analysis.training.drift over rcdiag.trend with the same settings)."""
    monkeypatch.setattr(sys, "argv", [str(APP), str(heavy_run.path)])
    app = AppTest.from_file(str(APP), default_timeout=120)
    app.query_params.update({"convention": "verl", "threshold": "3", "step": "2"})
    app.switch_page("views/trends.py").run()
    assert_clean(app)
    assert app.selectbox(key="trend_convention").value == "verl"
    assert app.number_input(key="trend_threshold").value == 3.0
    assert app.selectbox(key="trend_step").value == 2
    assert any(h.value == "Step 2" for h in app.subheader)
    frame = trend(heavy_run, "verl", "token_truncate", 3.0, replicates=200)
    assert len(frame) == HEAVY_STEPS
    found = timeline(frame)
    shown = " ".join(w.value for w in app.warning) + " ".join(s.value for s in app.success)
    assert ("Drift (warning)" in shown) == (found.drift is not None), shown
    assert ("Step change" in shown) == (found.change is not None), shown
    assert found.text.split(":")[0].replace("|", "\\|") in shown
