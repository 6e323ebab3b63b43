"""The lag split (rcdiag.analysis.training.lag) on an async run with mixed lags: buckets, the lag-0 floor, staleness per
lag, the exact per-token identity, and the verdict's lag cause. Guards issue #31: "the log-ratio a user sees is
engine mismatch plus staleness … rcdiag has neither versions nor a split"."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

import rcdiag
from rcdiag.analysis.training.lag import exact_split, lag_split
from rcdiag.analysis.training.lag_cause import lag_cause
from rcdiag.store.files import write_parquet_atomic
from rcdiag.store.manifest import update_manifest
from tests.lag.asyncrun import async_run


def _reference(run):
    """Independent float64 per-lag mean |ℓ| and k3 from the stored columns."""
    tokens, seqs = run.tokens(), run.sequences().set_index("seq_id")
    lag = tokens["seq_id"].map(seqs["trainer_version"] - seqs["policy_version"])
    ell = tokens["train_logprob"].astype(float) - tokens["rollout_logprob"].astype(float)
    return {int(k): (float(np.abs(ell[lag == k]).mean()), float((np.exp(ell[lag == k]) - ell[lag == k] - 1).mean()),
                     int((lag == k).sum())) for k in sorted(lag.unique())}


def test_split_buckets_floor_and_staleness(tmp_path):
    """Three lags; every bucket's numbers against a float64 reference; lag ≥ 1 well above the lag-0 floor."""
    async_run(tmp_path / "run")
    run = rcdiag.open_run(tmp_path / "run")
    split = lag_split(run)
    assert split.reference == "trainer_version" and split.unversioned_tokens == 0
    expected = _reference(run)
    assert split.buckets["lag"].tolist() == sorted(expected)
    for _, row in split.buckets.iterrows():
        mean_abs, k3, n = expected[int(row["lag"])]
        assert row["tokens"] == n
        assert row["mean_abs_log_ratio"] == pytest.approx(mean_abs, rel=1e-12)
        assert row["k3_kl"] == pytest.approx(k3, rel=1e-9)
        assert 0 < row["ess"] <= 1
    assert split.floor["lag"] == 0
    assert (split.staleness["times"] > 3).all(), split.staleness
    total = sum(n for _, _, n in expected.values())
    overall = sum(m * n for m, _, n in expected.values()) / total
    assert split.staleness_share == pytest.approx(1 - expected[0][0] / overall, rel=1e-12)
    cause = lag_cause(run)
    assert cause["cause"].startswith("staleness") and "lag-0 floor" in cause["evidence"]
    assert "max_staleness" in cause["action"] and cause["severity"] in ("warning", "alarm")
    assert json.dumps(split.to_dict(), default=float)


def test_exact_identity_per_token(tmp_path):
    """ℓ = (a_gen − b) + (a − a_gen) exactly, bit for bit, per token; through the run with checkpoint columns
    (as `score --checkpoint V=…` writes them): lag 0 has no staleness part, and the engine part of every lag is
    the engine noise alone (the same size at every lag)."""
    generating = async_run(tmp_path / "run", engine_noise=0.08)
    run = rcdiag.open_run(tmp_path / "run")
    tokens, seqs = run.tokens(), run.sequences().set_index("seq_id")
    gen = np.concatenate([generating[s] for s in sorted(generating)])
    engine, stale = exact_split(tokens["train_logprob"], tokens["rollout_logprob"], gen)
    ell = tokens["train_logprob"].to_numpy(np.float64) - tokens["rollout_logprob"].to_numpy(np.float64)
    assert np.array_equal(engine + stale, ell)  # exact, not approx
    versions = sorted(seqs["policy_version"].unique())
    table = pa.table({"seq_id": tokens["seq_id"], "pos": tokens["pos"]})
    version_of = tokens["seq_id"].map(seqs["policy_version"]).to_numpy()
    for v in versions:
        table = table.append_column(f"logprob:{v}", pa.array(np.where(version_of == v, gen, np.nan), pa.float32()))
    (run.path / "checkpoints").mkdir()
    write_parquet_atomic(table, run.path / "checkpoints/logprobs.parquet")
    update_manifest(run.path, {"checkpoints": {"logprobs": "checkpoints/logprobs.parquet",
                                               "versions": {str(v): int(v) for v in versions}}})
    exact = lag_split(rcdiag.open_run(run.path)).exact.set_index("lag")
    assert exact.loc[0, "staleness_mean_abs"] == 0.0
    assert exact["mean_log_ratio"].to_numpy() == pytest.approx(
        (exact["engine_mean"] + exact["staleness_mean"]).to_numpy(), abs=1e-15)
    assert exact["engine_mean_abs"].max() < 2 * exact["engine_mean_abs"].min()
    assert exact.loc[2, "staleness_mean_abs"] > 5 * exact.loc[2, "engine_mean_abs"]


def test_without_trainer_version_uses_the_steps_newest(tmp_path):
    """slime / AReaL record only the generating version: the lag is taken from the step's newest sample."""
    async_run(tmp_path / "run", trainer_version=False)
    run = rcdiag.open_run(tmp_path / "run")
    assert "trainer_version" not in run.sequences().columns
    split = lag_split(run)
    assert split.reference == "step_newest" and set(split.buckets["lag"]) == {0, 1, 2}


def test_no_versions_no_lag_and_a_synchronous_run_fires_nothing(tmp_path):
    """A run without versions has no split; an on-policy run (every lag 0: the A/A case) fires no lag cause."""
    async_run(tmp_path / "plain", versions=False)
    assert lag_split(rcdiag.open_run(tmp_path / "plain")) is None
    assert lag_cause(tmp_path / "plain") is None
    async_run(tmp_path / "sync", drift=0.0)
    assert lag_cause(tmp_path / "sync") is None
