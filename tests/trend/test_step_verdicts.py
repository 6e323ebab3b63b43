"""The health verdict per step: a run whose mismatch grows from a known step changes verdict at that step and not
before — in the library (rcdiag.analysis.verdict.health), the report (trend section, metrics.json by_step `status` and
`status_changes`) and the dashboard's Trends page (band-coloured points and cards)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import rcdiag
from rcdiag.analysis.verdict.health import ALARM, COLOURS, HEALTHY, WARNING
from rcdiag.analysis.verdict.judge import status_changes, step_verdicts
from rcdiag.cli import main
from tests.dashboard.conftest import assert_clean, make_app  # noqa: F401  (fixture)
from tests.trend.steps import write_step_run

GROWS = 6
"""The step from which the mismatch grows: engine noise 0.005 before, then ×8, ×8, ×5. Noise 0.04 is what a bf16
engine gives (rcdiag.analysis.metrics.floor: σ ≤ 0.1), so step 6 stays healthy — the fixed mean-|ℓ| band called it a
warning; 0.32 is ×9 the typical bf16 noise (warning), 1.6 trips verl's bands (alarm)."""
NOISES = [0.005] * GROWS + [0.04, 0.32, 1.6]
WANT = [HEALTHY] * (GROWS + 1) + [WARNING, ALARM]
CHANGES = [(GROWS + 1, HEALTHY, WARNING), (GROWS + 2, WARNING, ALARM)]


@pytest.fixture(scope="module")
def growing_run(tmp_path_factory):
    return write_step_run(tmp_path_factory.mktemp("verdict") / "growing", NOISES)


def _mean_abs_log_ratio(run):
    """float64 mean |a − b| over valid tokens per step, from the Parquet rows (independent of the library)."""
    tokens = run.tokens(["seq_id", "train_logprob", "rollout_logprob", "mask"])
    steps = run.sequences(["seq_id", "step"]).set_index("seq_id")["step"]
    tokens = tokens[tokens["mask"].fillna(True).astype(bool)]
    diff = (tokens["train_logprob"].astype(np.float64) - tokens["rollout_logprob"].astype(np.float64)).abs()
    return diff.groupby(tokens["seq_id"].map(steps)).mean()


def test_verdict_changes_at_the_step_the_mismatch_grows(growing_run):
    rows = rcdiag.trend(growing_run, replicates=10).to_dict(orient="records")
    verdicts = step_verdicts(rows)
    assert [v.status for v in verdicts] == WANT
    assert [v.cause.kind for v in verdicts] == ["floor"] * (GROWS + 1) + ["above_floor"] * 2
    changes = status_changes(rows)
    assert [(c.step, c.before, c.after) for c in changes] == CHANGES
    # the step noise scale recovers the injected logit noise (the floor model), measured per step
    assert [r["noise_sigma"] for r in rows] == pytest.approx(NOISES, rel=0.2)
    # mean |ℓ| at step 6 is over the old fixed band (0.02) yet inside what bf16 gives, measured independently
    reference = _mean_abs_log_ratio(growing_run)
    assert (reference.loc[:GROWS - 1] < 0.01).all() and 0.02 < reference.loc[GROWS] < 0.05
    assert "abs_log_ratio_mean" in changes[0].metrics
    assert changes[0].text().startswith(f"step {GROWS + 1}: healthy → warning (numerical mismatch above the "
                                        "bfloat16 floor: σ̂ 0.3")
    assert "k3_kl" in changes[1].metrics and changes[1].to_dict()["to"] == ALARM


def test_recovery_and_flapping_are_changes_too():
    """A recovery (alarm → warning → healthy) names what came back inside its band; a metric flipping across a band edge is a
    change each time; a missing value (NaN) judges nothing."""
    rows = [{"step": s, "k3_kl": v} for s, v in enumerate((0.5, 0.05, 0.001, 0.05, 0.001, math.nan))]
    changes = status_changes(rows)
    assert [(c.step, c.before, c.after) for c in changes] == [
        (1, ALARM, WARNING), (2, WARNING, HEALTHY), (3, HEALTHY, WARNING), (4, WARNING, HEALTHY)]
    assert changes[1].text() == "step 2: warning → healthy (k3_kl = 0.001, |value| ≤ 0.01)"
    assert changes[0].text() == "step 1: alarm → warning (the mismatch is outside the health bands)"
    assert status_changes(rows[:1]) == [] and status_changes([]) == []


def test_report_shows_the_change_step_and_by_step_status(growing_run, tmp_path, capsys):
    assert main(["report", str(growing_run.path), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    data = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert [row["status"] for row in data["by_step"]] == WANT
    assert [(c["step"], c["from"], c["to"]) for c in data["status_changes"]] == [list(c) for c in CHANGES] or \
        [(c["step"], c["from"], c["to"]) for c in data["status_changes"]] == CHANGES
    assert data["timeline"]["change"]["step"] == GROWS  # the run's own verdict: a jump ×8 at step 6 …
    assert data["verdict"]["cause"]["kind"] == "step_change" and data["verdict"]["cause"]["step"] == GROWS
    md = (tmp_path / "r" / "report.md").read_text()
    assert md.splitlines()[4].startswith("> **ALARM: the mismatch jumped ×")  # … named in the first lines
    section = md[md.index("## Across training"):]
    assert "healthy at step 0; it changes at 2 step(s): step 7: healthy → warning (numerical mismatch" in section
    assert "| abs_log_ratio_mean | status |" in section  # the per-step table has a status column
    html = (tmp_path / "r" / "report.html").read_text()
    assert "step 7: healthy → warning" in html


def test_one_step_run_has_a_status_and_no_change(tmp_path, capsys):
    run = write_step_run(tmp_path / "one", NOISES[:1])
    assert main(["report", str(run.path), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    data = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert [row["status"] for row in data["by_step"]] == [HEALTHY] and data["status_changes"] == []


def test_trends_page_colours_points_and_cards_by_band(make_app, growing_run):  # noqa: F811
    app = make_app(growing_run, page="trends")
    assert_clean(app)
    assert any("it changes at 2 step(s): step 7: healthy → warning" in m.value for m in app.markdown)
    assert app.warning[0].value.startswith("**Step change.** The mismatch jumped ×")
    spec = app.get("vega_lite_chart")[0].proto.spec
    assert '"band"' in spec and all(c in spec for c in (COLOURS[HEALTHY], COLOURS[WARNING], COLOURS[ALARM]))
    app.selectbox(key="trend_step").set_value(GROWS + 2).run()
    assert_clean(app)
    bodies = [h.proto.body for h in app.get("html")]
    assert any('class="rcdiag-verdict" data-status="alarm"' in b for b in bodies)
    k3 = next(b for b in bodies if "· k3_kl<" in b)
    assert COLOURS[ALARM] in k3 and ">alarm<" in k3
