"""`rcdiag report` on an async run with mixed lags: the "Policy lag" section (buckets, floor, staleness, the
cause) in report.md and metrics.json; a run without versions reports exactly as before (no section)."""
from __future__ import annotations

import json

from rcdiag.cli import main
from tests.lag.asyncrun import async_run


def test_report_has_the_lag_section(tmp_path, capsys):
    async_run(tmp_path / "run")
    assert main(["report", str(tmp_path / "run"), "-q"]) in (0, 1)
    md = (tmp_path / "run/report/report.md").read_text()
    assert "## Policy lag: engine mismatch vs staleness" in md
    assert "staleness: samples from older policy versions carry most of the gap" in md
    assert "lag = trainer_version − policy_version" in md
    everything = json.loads((tmp_path / "run/report/metrics.json").read_text())
    data = everything["lag"]
    assert [b["lag"] for b in data["split"]["buckets"]] == [0, 1, 2]
    assert data["cause"]["cause"].startswith("staleness")
    # the verdict names it too: staleness is a cause of its own, ahead of the numerical size of the gap
    causes = [c["kind"] for c in everything["verdict"]["causes"]]
    assert "staleness" in causes and causes.index("staleness") < len(causes) - 1
    assert everything["verdict"]["cause"]["kind"] in ("staleness", "step_change", "not_numerics")


def test_report_without_versions_has_no_lag_section(tmp_path, capsys):
    async_run(tmp_path / "plain", versions=False)
    assert main(["report", str(tmp_path / "plain"), "-q"]) in (0, 1)
    assert "Policy lag" not in (tmp_path / "plain/report/report.md").read_text()
    assert "lag" not in json.loads((tmp_path / "plain/report/metrics.json").read_text())
