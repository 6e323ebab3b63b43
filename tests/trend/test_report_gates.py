"""`rcdiag report` across training and stacks: the trend section and by_step, --fail-on-drift, and --baseline with
ratio gates — each must fire where it should and stay silent where it should not."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

import rcdiag
from rcdiag.cli import main
from tests.fixtures.runs import SyntheticSpec, synthetic_frames
from tests.trend.conftest import CHANGE, STEPS


def report(args, capsys):
    code = main(["report", *args, "--quiet"])
    return code, capsys.readouterr().err


def test_drifting_run_fails_on_drift_and_reports_the_trend(drifting_run, tmp_path, capsys):
    code, err = report([str(drifting_run.path), "--out", str(tmp_path / "r"), "--fail-on-drift"], capsys)
    assert code == 1
    assert err.splitlines()[0] == "Failed --fail-if / --fail-on-drift conditions:"
    assert f"drifting: The mismatch drifts up from step {CHANGE}: mean |ℓ| ×" in err
    data = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert [row["step"] for row in data["by_step"]] == list(range(STEPS))
    assert data["timeline"]["drift"]["start_step"] == CHANGE and data["timeline"]["change"] is None
    assert data["verdict"]["causes"][0]["kind"] in ("drift", "heavy_tail", "above_floor")
    assert any(c["kind"] == "drift" and c["step"] == CHANGE for c in data["verdict"]["causes"])
    assert (tmp_path / "r" / "trend.png").stat().st_size > 10_000
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Across training" in md and f"Drift (warning): The mismatch drifts up from step {CHANGE}" in md
    # what changed across training is news: the section comes before the headline cards
    assert md.index("## Across training") < md.index("## Headline")
    # the per-step numbers are the library's
    frame = rcdiag.trend(drifting_run, replicates=10)
    assert [row["k3_kl"] for row in data["by_step"]] == pytest.approx(frame["k3_kl"].tolist(), rel=1e-12)


def test_flat_run_passes_the_drift_gate(flat_run, tmp_path, capsys):
    code, err = report([str(flat_run.path), "--out", str(tmp_path / "r"), "--fail-on-drift"], capsys)
    assert code == 0 and err == ""
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Steady across training: no step change" in md and md.index("## Headline") < md.index("## Across")


def test_one_step_run_has_one_by_step_row_and_no_trend_section(tmp_path, capsys):
    tokens, seqs = synthetic_frames(SyntheticSpec(n_seq=30))
    run = rcdiag.write_run(tmp_path / "one", tokens, seqs)
    code, _ = report([str(run.path), "--fail-on-drift"], capsys)
    data = json.loads((run.path / "report" / "metrics.json").read_text())
    assert code == 0 and len(data["by_step"]) == 1 and data["by_step"][0]["step"] == 0
    assert data["by_step"][0]["kl"] == data["metrics"]["kl"] and data["timeline"] is None
    assert "Across training" not in (run.path / "report" / "report.md").read_text()


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    """old: engine noise 0.03; same: another sample at 0.03; worse: noise 0.09 (k3_kl ≈ 9× old)."""
    root = tmp_path_factory.mktemp("stacks")
    out = {}
    for name, noise, seed in (("old", 0.03, 1), ("same", 0.03, 2), ("worse", 0.09, 1)):
        tokens, seqs = synthetic_frames(replace(SyntheticSpec(), n_seq=80, noise=noise, seed=seed))
        out[name] = rcdiag.write_run(root / name, tokens, seqs)
    return out


def test_baseline_ratio_gate_fires(stacks, tmp_path, capsys):
    code, err = report([str(stacks["worse"].path), "--baseline", str(stacks["old"].path), "--out",
                        str(tmp_path / "r"), "--fail-if", "k3_kl>2x"], capsys)
    assert code == 1
    line = err.splitlines()[1]
    assert line.startswith("  worse: k3_kl = ") and "× the baseline (" in line and line.endswith("(k3_kl>2x)")
    ratio = float(line.split("k3_kl = ")[1].split("×")[0])
    assert 5 < ratio < 15
    data = json.loads((tmp_path / "r" / "metrics.json").read_text())
    rows = {r["metric"]: r for r in data["baseline"]["comparison"]}
    assert rows["k3_kl"]["verdict"] == "worse" and rows["k3_kl"]["ratio"] == pytest.approx(ratio, rel=1e-2)
    assert "Against the baseline old" in (tmp_path / "r" / "report.md").read_text()


def test_baseline_ratio_gate_stays_silent(stacks, tmp_path, capsys):
    code, err = report([str(stacks["same"].path), "--baseline", str(stacks["old"].path), "--out",
                        str(tmp_path / "r"), "--fail-if", "k3_kl>2x", "--fail-if", "ess<0.9"], capsys)
    assert code == 0 and err == ""
    assert "No metric is worse than the baseline old" in (tmp_path / "r" / "report.md").read_text()


def test_ratio_without_baseline_is_refused_before_any_work(stacks, tmp_path, capsys):
    code, err = report([str(stacks["same"].path), "--out", str(tmp_path / "r"), "--fail-if", "k3_kl>2x"], capsys)
    assert code == 2 and "is a ratio to a baseline run: add --baseline OTHER_RUN" in err
    assert not (tmp_path / "r").exists()
