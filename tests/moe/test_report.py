"""The report on MoE runs with routes (tests/moe/routed_runs: per token and layer each side routes to its own top-k
of nearby router logits; the token's log-probs are the true log-softmax of logits perturbed by a small numeric
noise plus a larger one per disagreeing layer, so routing differences cause the gap): the Routing section, its
figure and metrics.json key, and the verdict's routing cause with each framework's replay setting — and none of
it on a dense run, on a run whose gap routing does not explain, or when a replay measured otherwise.

Guards #29: an MoE run's heavy tail was blamed on "MoE routing flips" in general, with nothing measured and no
replay setting to paste.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rcdiag.analysis.moe.routing import REPLAY_SETTINGS, agreement, routing_explains
from rcdiag.cli import main
from rcdiag.report.make import make_report
from rcdiag.report.options import ReportOptions
from rcdiag.report.routing_section import replay_measurement
from rcdiag.report.sections import verdict_phrase
from rcdiag.store.writer import write_run
from tests.moe.routed_runs import MoESpec, write_moe_run

FAST = ReportOptions(replicates=40)
HEAVY = MoESpec(n_seq=160, seed=3)
"""Each disagreeing layer adds logit noise of σ 0.25 on top of 0.01: the gap is routing's."""
NOT_ROUTING = MoESpec(n_seq=160, seed=3, numeric_noise=0.25, flip_noise=0.0)
"""The same routes, but every token carries the same larger noise: a heavy mismatch routing does not explain."""


def _report(tmp_path: Path, name: str, spec: MoESpec):
    path, seqs = write_moe_run(tmp_path / "runs" / name, spec)
    result = make_report([path], tmp_path / "reports" / name, FAST)
    return result.reports[0], result.out, seqs


@pytest.fixture(scope="module")
def heavy(tmp_path_factory):
    return _report(tmp_path_factory.mktemp("moe"), "heavy", HEAVY)


def _reference(seqs: list[dict]) -> tuple[float, float]:
    """(share of tokens with a disagreeing layer, routing's share of the gap) from the whole arrays at once, |ℓ|
    from the float32 values the run stores."""
    _, disagree = agreement(np.concatenate([s["engine_ids"] for s in seqs]),
                            np.concatenate([s["train_ids"] for s in seqs]))
    ell = np.abs(np.concatenate([s["rollout"].astype(np.float32).astype(np.float64)
                                 - s["train"].astype(np.float32).astype(np.float64) for s in seqs]))
    share = routing_explains(ell, disagree)
    return float((disagree > 0).mean()), share.share


def test_routing_is_the_verdicts_cause_with_each_frameworks_replay_setting(heavy):
    """Routing explains most of a heavy mismatch: the verdict's cause is routing, its title quotes the share and the
    tokens that see another expert (equal to the whole-array reference), its action names R3 with the setting of
    verl, ms-swift, slime, NeMo-RL and prime-rl, and a correction may still be advised (the recommendation bounds
    what is left)."""
    report, _, seqs = heavy
    cause = report.verdict.cause
    disagree, share = _reference(seqs)
    assert share > 0.8 and 0.2 < disagree < 0.5  # the built case is what the test claims
    assert cause.kind == "routing" and report.verdict.status in ("warning", "alarm"), report.verdict.line()
    assert cause.title == (f"routing differences explain {share:.0%} of the gap ({disagree:.0%} of tokens see a "
                           "different expert in some layer)")
    for _, setting, _ in REPLAY_SETTINGS:
        assert setting in cause.action
    assert "R3" in cause.action and "observational" in cause.action and "--factors router_replay" in cause.action
    assert cause.correct and report.recommendation.kind == "correct"
    assert any("layers whose experts differ" in e for e in cause.evidence)
    # the headline offers the correction as the stopgap it is, after the replay the action asks for first
    rec = report.recommendation
    assert rec.phrase.startswith(" — correct with ")
    assert verdict_phrase(report) == " — replay the engine's routes; until then, " + rec.phrase[len(" — "):]


def test_routing_section_figure_and_metrics_json(heavy):
    """report.md has the Routing section after 'Where the mismatch comes from' with the agreement table and the
    |ℓ| by disagreement rows; the figure is written; metrics.json's `routing` key has the per-layer rates and the
    share, equal to the reference."""
    report, out, seqs = heavy
    md = (out / "report.md").read_text()
    assert md.index("## Where the mismatch comes from") < md.index("## Routing (mixture of experts)") < \
        md.index("## Worst tokens")
    assert "|ℓ| by the number of layers whose experts differ" in md.replace("\\|", "|")
    assert (out / "routing.png").stat().st_size > 10_000
    data = json.loads((out / "metrics.json").read_text())
    routing = data["routing"]
    disagree, share = _reference(seqs)
    assert routing["any_disagree_share"] == pytest.approx(disagree)
    assert routing["explains"]["share"] == pytest.approx(share, rel=1e-12)
    assert routing["explains"]["method"] == "observational" and routing["judged"]
    assert len(routing["exact_by_layer"]) == HEAVY.layers and routing["confidence"]["trainer"]["tokens"] > 0
    assert data["verdict"]["cause"]["kind"] == "routing"
    html = (out / "report.html").read_text()
    assert "Routing (mixture of experts)" in html and "routing differences explain" in html


def test_a_gap_routing_does_not_explain_is_not_blamed_on_routing(tmp_path):
    """The same routes with the same noise on every token: routing explains little, so the verdict keeps the
    numerical cause (the section still shows the agreement)."""
    report, out, seqs = _report(tmp_path, "not_routing", NOT_ROUTING)
    _, share = _reference(seqs)
    assert share < 0.3
    assert report.verdict.cause.kind in ("heavy_tail", "above_floor", "bands"), report.verdict.line()
    assert "## Routing (mixture of experts)" in (out / "report.md").read_text()


def _probe(run: Path, gap: float, left: float) -> None:
    """A probe summary whose budget has a router_replay row (the fields rcdiag.probe.summary.budget writes)."""
    (run / "probes").mkdir(exist_ok=True)
    row = {"factor": "router_replay", "setting": "router_replay", "baseline": "reference", "side": "trainer",
           "change": "trainer replays the engine's routes", "mean_abs": gap - left, "k3_kl": 0.0,
           "share": 0.0, "share_k3": 0.0, "residual_mean_abs": left, "residual": left / gap,
           "removes": 1 - left / gap}
    settings = [{"name": name, "factor": factor, "side": "trainer", "description": name,
                 "vs_reference": {"mean_abs": value}} for name, factor, value in
                (("reference", "reference", 0.0), ("router_replay", "router_replay", left))]
    summary = {"name": "replay", "sample": {"sequences": 10, "tokens": 100, "valid_tokens": 100},
               "temperature": 1.0, "gap": {"mean_abs": gap, "k3_kl": 0.0, "kl": 0.0}, "settings": settings,
               "budget": [row], "notes": []}
    (run / "probes" / "replay.json").write_text(json.dumps(summary))


def test_a_measured_replay_replaces_the_estimate(tmp_path):
    """With a probe that forced the engine's routes: the share is the measured one (1 − 0.01/0.05 = 80 %) and the
    action no longer says it is observational; a replay that removes only 10 % takes routing out of the verdict."""
    path, _ = write_moe_run(tmp_path / "measured", HEAVY)
    _probe(path, 0.05, 0.01)
    report = make_report([path], tmp_path / "rep1", FAST).reports[0]
    assert report.routing.summary.explains.method == "replay" and report.routing.probe == "replay"
    assert report.routing.summary.explains.share == pytest.approx(0.8)
    assert report.verdict.cause.kind == "routing" and "explain 80% of the gap" in report.verdict.cause.title
    assert "observational" not in report.verdict.cause.action
    _probe(path, 0.05, 0.045)
    report = make_report([path], tmp_path / "rep2", FAST).reports[0]
    assert report.routing.summary.explains.share == pytest.approx(0.1)
    assert report.verdict.cause.kind != "routing", report.verdict.line()


def test_a_probe_summary_that_is_a_fifo_is_skipped_not_waited_on(tmp_path):
    """replay_measurement reads probe summaries as the probe section does (bounded, never a FIFO): a FIFO newer
    than the real summary is passed over instead of blocking the report forever."""
    path = tmp_path / "run"
    path.mkdir()
    _probe(path, 0.05, 0.01)
    os.mkfifo(path / "probes" / "zz_fifo.json")
    found: list = []
    reader = threading.Thread(target=lambda: found.append(replay_measurement(path)), daemon=True)
    reader.start()
    reader.join(timeout=20)
    if reader.is_alive():  # let the blocked reader go, so the test fails instead of hanging
        os.close(os.open(path / "probes" / "zz_fifo.json", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("replay_measurement blocked on a FIFO probe summary")
    assert found == [(0.05, 0.01, "replay")]


def test_a_dense_run_has_no_routing_section_and_no_key(tmp_path):
    """No routing section, no `routing` key, no routing cause for a run without routes."""
    rng = np.random.default_rng(0)
    a = -rng.exponential(1.0, 400)
    tokens = pd.DataFrame({"seq_id": np.repeat(np.arange(20), 20), "pos": np.tile(np.arange(20), 20),
                           "train_logprob": a, "rollout_logprob": a + rng.normal(0, 0.01, 400)})
    run = write_run(tmp_path / "dense", tokens)
    result = make_report([run], tmp_path / "rep", FAST)
    assert result.reports[0].routing.summary is None
    assert "Routing" not in (result.out / "report.md").read_text()
    assert "routing" not in json.loads((result.out / "metrics.json").read_text())


def test_the_cli_line_names_routing(tmp_path, capsys):
    """`rcdiag report RUN` on a heavy routed run prints the routing cause as its verdict line, and --fail-on warning
    fails it."""
    path, _ = write_moe_run(tmp_path / "cli", MoESpec(n_seq=120, seed=5))
    assert main(["report", str(path), "--out", str(tmp_path / "r"), "--fail-on", "warning"]) == 1
    assert "routing differences explain" in capsys.readouterr().out


def test_notebook_routing_is_the_reports(heavy, tmp_path):
    """run.routing() gives the report's numbers (the same summary), its frames have a row per layer / bin, it
    renders in Jupyter; a dense run's is a ConfigError that says why."""
    import rcdiag
    from rcdiag.errors import ConfigError

    report, out, _ = heavy
    result = rcdiag.open_run(report.path).routing()
    data = json.loads((out / "metrics.json").read_text())["routing"]
    assert result["routing_explains"] == pytest.approx(data["explains"]["share"], rel=1e-15)
    assert result["any_disagree_share"] == data["any_disagree_share"] and result["explains_method"] == "observational"
    assert len(result.by_layer) == HEAVY.layers and list(result.by_disagreement["layers_disagree"]) == \
        ["0", "1", "2–3", "4"]
    assert result.by_disagreement["tokens"].sum() == data["tokens"]
    assert "routing (mixture of experts)" in result._repr_html_()
    dense = write_run(tmp_path / "dense", pd.DataFrame({"seq_id": [0], "pos": [0], "rollout_logprob": [-1.0],
                                                        "train_logprob": [-1.0]}))
    with pytest.raises(ConfigError, match="no routes in this run"):
        rcdiag.open_run(dense.path).routing()
