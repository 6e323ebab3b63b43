"""A standard deviation of identical values is exactly 0 (issue #34 item 8).

Guards: verl's rejection statistics (`rollout_rs_<option>_std`) came back as ~1e-16 where verl logs 0 when every
clamped k1 equals log 0.9 — the two-pass variance was centred on numpy's rounded mean of the equal values. Also
held: on varied values the std agrees with an independent float64 reference (population std of the clamped
values, as verl's `compute_rs_metrics` in verl/trainer/ppo/rollout_corr_helper.py at v0.9.0 takes it), and a run
split into many files gives the same zero.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import rcdiag
from rcdiag.analysis.passes.accum import Moments
from rcdiag.store.writer import write_run

KEY = "rollout_corr/rollout_rs_{}_std"


def _frame(seed: int, gap: tuple[float, float], n_seq: int = 300, length: int = 37) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    b = -rng.exponential(1.0, n_seq * length)
    a = b - rng.uniform(*gap, b.size)
    return pd.DataFrame({"seq_id": np.repeat(np.arange(n_seq), length), "pos": np.tile(np.arange(length), n_seq),
                         "rollout_logprob": b, "train_logprob": a})


@pytest.mark.parametrize("option", ["token_k1", "seq_mean_k1"])
@pytest.mark.parametrize("files", [1, 7])
def test_std_of_values_all_clamped_to_log_lower_is_exactly_zero(tmp_path, option, files):
    """Every ℓ < log 0.9, so every clamped k1 (token, and per-sequence mean) is log 0.9: std 0.0 exactly."""
    frame = _frame(0, (1.0, 3.0))
    run = write_run(tmp_path / "run", frame, shard_tokens=math.ceil(len(frame) / files))
    assert len(run.token_files) >= files
    out = rcdiag.simulate(run, "token_truncate", 2.0, keys="verl",
                          rejection=rcdiag.verl_rejections(option, "0.9_2.0"))
    assert out[KEY.format(option)] == 0.0, out[KEY.format(option)]


def test_std_of_varied_values_matches_a_float64_reference():
    frame = _frame(1, (-0.3, 0.3))
    out = rcdiag.simulate(frame, "token_truncate", 2.0, keys="verl",
                          rejection=rcdiag.verl_rejections("token_k1", "0.9_1.1"))
    stored = frame[["train_logprob", "rollout_logprob"]].to_numpy(np.float32).astype(np.float64)  # run columns: float32
    k1 = stored[:, 1] - stored[:, 0]  # verl's k1 = −log(π_train / π_rollout)
    want = float(np.std(np.clip(k1, math.log(0.9), math.log(1.1)), dtype=np.float64))
    # rcdiag's per-token ℓ̂ (analysis.passes.chunks) differs from this reference by ~1e-10 relative in the std (seen before
    # and after this fix alike): far below verl's float32, far above a wrong clamp or centring (~1e-2)
    assert out[KEY.format("token_k1")] == pytest.approx(want, rel=1e-9, abs=0)


@pytest.mark.parametrize("value", [math.log(0.9), 0.1, -1e300, 7.0 / 3.0])
def test_moments_of_equal_values_in_any_batching(value):
    rng = np.random.default_rng(0)
    moments = Moments()
    for size in rng.integers(1, 500, 20):
        part = Moments()
        part.add(np.full(size, value))
        moments.merge(part)
    weighted = Moments()
    weighted.add_weighted(np.full(9, value), np.array([0, 3, 1, 0, 7, 2, 2, 5, 1]))
    assert moments.m2 == 0.0 and moments.mean == value
    assert weighted.m2 == 0.0 and weighted.mean == value
