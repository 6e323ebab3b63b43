"""docs/recipes.md's recipes followed literally, each to its end: the one row the recipe names, then
`make_report` on a real run (Parquet written by rcdiag.write_run), and the new thing found in what the report
wrote (issue #46: following "Add an IS mode" made `rcdiag report` crash — recommend split the mode's name on "_").
"""
from __future__ import annotations

import json

import pytest

from rcdiag.analysis import defaults
from rcdiag.report.make import make_report
from rcdiag.report.options import ReportOptions
from rcdiag.report.settings import trainer_settings
from tests.analysis import reference as ref
from tests.analysis.helpers import assert_close
from tests.fixtures.scenarios import build_scenario


@pytest.fixture
def no_cache(monkeypatch):
    """The recipes edit tables in memory, which the pass cache's code fingerprint cannot see: no cache."""
    monkeypatch.setenv("RCDIAG_CACHE_DIR", "off")


def report_json(run, tmp_path, **options):
    """make_report of `run`: its metrics.json and report.md."""
    out = tmp_path / "report"
    result = make_report([run], out, ReportOptions(replicates=50, **options))
    assert not result.failed
    return json.loads((out / "metrics.json").read_text()), (out / "report.md").read_text()


def test_recipe_add_an_is_mode_reaches_the_report(monkeypatch, no_cache, tmp_path):
    """The IS-mode recipe's row, then `make_report`: the report's sweep has the mode at every C of its grid with
    the float64 reference's numbers (a token mask on [1/C, C]), the recommendation weighs it among the
    alternatives, and its settings to paste are the frameworks' own mask modes with L = 1/C."""
    monkeypatch.setitem(defaults.IS_MODE_TABLE, "token_band_mask", ("token", "mask", "reciprocal"))
    run = build_scenario(tmp_path / "run", "moe")  # heavy-tailed: the report weighs a correction
    data, markdown = report_json(run, tmp_path)
    tokens = run.token_table().to_pandas()
    rows = [r for r in data["sweep"] if r["mode"] == "token_band_mask"]
    assert sorted(r["threshold"] for r in rows) == sorted(defaults.DEFAULT_THRESHOLDS)
    seqs = ref.sequences(tokens)
    for row in rows:
        c = row["threshold"]
        want = ref.is_metrics(seqs, "canonical", "token_mask", c, 1 / c)
        assert_close(row, {k: want[k] for k in ("ess", "clipped_frac", "is_weight_mean", "kept_token_frac")},
                     what=f"[token_band_mask at C = {c}]")
    alternatives = {a["mode"]: a for a in data["recommendation"]["alternatives"]}
    assert "token_band_mask" in alternatives and alternatives["token_band_mask"]["why"]
    assert "token_band_mask" in markdown
    snippets = {s.framework: s for s in trainer_settings("token_band_mask", 2.0)}
    assert 'vllm_importance_sampling_mode="token_mask"' in snippets["TRL"].code
    assert "vllm_importance_sampling_clip_min=0.5" in snippets["TRL"].code
    assert "rollout_is_threshold=\"0.5_2\"" in snippets["verl"].code and "rollout_is=token" in snippets["verl"].code
    assert "icepop_function" in snippets["slime"].code and "--tis-clip-low 0.5" in snippets["slime"].code
