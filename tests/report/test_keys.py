"""`rcdiag report --keys verl|swift|trl`: metrics.json under the framework's logged key names, numbers equal to
the library's compute_metrics / simulate with the same keys (rcdiag.analysis.keys is the one table)."""
from __future__ import annotations

import json

import pandas as pd

import rcdiag
from rcdiag.cli import main
from tests.analysis.helpers import make_tokens


def _run_dir(tmp_path):
    tokens = make_tokens(7, n_seq=40, max_len=12, scale=0.3, big_p=0.0)
    sequences = pd.DataFrame({"seq_id": sorted(set(tokens["seq_id"].tolist()))})
    return rcdiag.write_run(tmp_path / "run", tokens.drop(columns=["token_id"]), sequences)


def test_report_keys_verl_and_trl(tmp_path, capsys):
    run = _run_dir(tmp_path)
    assert main(["report", str(run.path), "--keys", "verl", "--out", str(tmp_path / "verl"), "--quiet"]) == 0
    data = json.loads((tmp_path / "verl" / "metrics.json").read_text())
    assert data["options"]["keys"] == "verl" and data["options"]["convention"] == "verl"
    want = rcdiag.compute_metrics(run, keys="verl")
    assert data["metrics"]["rollout_corr/kl"] == want["rollout_corr/kl"]
    assert "rollout_corr/rollout_is_eff_sample_size" in data["is_modes"]["token_truncate"]
    assert main(["report", str(run.path), "--keys", "trl", "--out", str(tmp_path / "trl"), "--quiet"]) == 0
    trl = json.loads((tmp_path / "trl" / "metrics.json").read_text())
    assert trl["metrics"]["sampling/sampling_logp_difference/max"] == rcdiag.compute_metrics(
        run, keys="trl")["sampling/sampling_logp_difference/max"]
    assert "sampling/importance_sampling_ratio/mean" in trl["is_modes"]["sequence_mask"]


def test_report_keys_refuses_another_convention(tmp_path, capsys):
    run = _run_dir(tmp_path)
    assert main(["report", str(run.path), "--keys", "verl", "--convention", "swift", "--out", str(tmp_path / "x")]) != 0
    assert "keys='verl'" in capsys.readouterr().err
