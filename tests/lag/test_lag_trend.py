"""Staleness across training: the trend's per-step lag columns (rcdiag.analysis.training.lag_trend) against references
written here from the definitions — the token columns from the rows in plain Python (math.fsum), the frameworks'
per-sequence staleness as verl and TRL compute it.

Guards issue #31 "staleness in the trends": a run with versions showed the lag split for the run as a whole, so a
step whose weight sync lagged (or whose floor moved) could not be found; and the trend must not grow lag columns
on a run without versions, nor pass rcdiag's step-newest estimate off as a framework's logged staleness.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np
import pytest

from rcdiag.analysis.training.lag import lag_split
from rcdiag.analysis.training.lag_trend import LAG_NAMES, SEQUENCE_NAMES, TOKEN_NAMES
from rcdiag.analysis.training.trend import TREND_COLUMNS, trend
from rcdiag.importers import ImportOptions, import_run
from rcdiag.store.run import open_run
from tests.lag.asyncrun import async_run
from tests.lag.versioned import recorded_run, samples, verl_rows

Q = ImportOptions(quiet=True)


@pytest.fixture(scope="module")
def data():
    return samples()


@pytest.fixture(scope="module")
def verl_run(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("verl")
    return import_run("jsonl", verl_rows(root / "batch.jsonl", data), root / "run", Q)[0]


@pytest.fixture(scope="module")
def recorded(data, tmp_path_factory):
    return open_run(recorded_run(tmp_path_factory.mktemp("rec") / "run", data))


def token_reference(data, per_token: bool) -> dict[int, dict[str, float]]:
    """TOKEN_NAMES per step from the samples: every valid token, its lag = the trainer's version − the token's own
    version (per_token) or its sequence's newest; |ℓ| = |train − rollout| of the stored float32 values."""
    by_step: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for s in data:
        for t in range(len(s.tokens)):
            if s.mask[t]:
                version = int(s.versions[t]) if per_token else s.newest
                by_step[s.step].append((s.trainer - version, abs(float(s.train[t]) - float(s.rollout[t]))))
    out = {}
    for step, rows in by_step.items():
        lags = [lag for lag, _ in rows]
        floor = [a for lag, a in rows if lag == 0]
        stale = [a for lag, a in rows if lag >= 1]
        out[step] = {"lag_tokens": len(rows), "token_lag_mean": sum(lags) / len(lags),
                     "token_lag_max": float(max(lags)), "stale_token_share": len(stale) / len(rows),
                     "floor_abs_log_ratio_mean": math.fsum(floor) / len(floor) if floor else math.nan,
                     "stale_abs_log_ratio_mean": math.fsum(stale) / len(stale) if stale else math.nan}
    return out


def check_tokens(frame, reference, step_of=lambda s: s):
    """Every token column at every step equal to the reference, bit for bit (exact sums, one rounding each)."""
    for row in frame.to_dict(orient="records"):
        want = reference[step_of(row["step"])]
        for name in TOKEN_NAMES:
            got = row[name]
            assert (got == want[name]) or (math.isnan(got) and math.isnan(want[name])), (row["step"], name)


def test_per_token_versions_token_columns(recorded, data):
    """A partial rollout switches weights mid-response (AReaL's per-token versions): each token's own lag counts,
    masked tool tokens (rollout placeholder 0.0) do not."""
    frame = trend(recorded, replicates=5)
    assert frame.attrs["lag_reference"] == "trainer_version"
    check_tokens(frame, token_reference(data, per_token=True))
    assert (frame["stale_token_share"] > 0).all() and (frame["floor_abs_log_ratio_mean"] < 0.1).all()
    assert (frame["stale_abs_log_ratio_mean"] > 3 * frame["floor_abs_log_ratio_mean"]).all()


def test_sequence_versions_token_columns(verl_run, data):
    """verl stores one newest version per trajectory: every token of it takes that version's lag."""
    frame = trend(verl_run, "verl", replicates=5)
    check_tokens(frame, token_reference(data, per_token=False), step_of=lambda s: s - 5)  # global_steps = step + 5


def test_any_batching_gives_the_same_bits(recorded):
    """The sums are exact, so batches of 5 rows and the default ones (files read on threads) agree bit for bit."""
    a = trend(recorded, replicates=5)[list(LAG_NAMES)]
    b = trend(recorded, replicates=5, batch_rows=5)[list(LAG_NAMES)]
    assert a.equals(b)


def test_steps_add_up_to_the_lag_split(recorded):
    """The per-step token counts and the floor's |ℓ| summed over steps are the run's lag split (analysis.training.lag)."""
    frame = trend(recorded, replicates=5)
    split = lag_split(recorded)
    floor_tokens = (frame["lag_tokens"] * (1 - frame["stale_token_share"])).round()
    assert floor_tokens.sum() == split.floor["tokens"]
    assert (frame["lag_tokens"] * frame["stale_token_share"]).round().sum() == split.buckets.query("lag > 0")[
        "tokens"].sum()
    pooled = (frame["floor_abs_log_ratio_mean"] * floor_tokens).sum() / floor_tokens.sum()
    assert pooled == pytest.approx(split.floor["mean_abs_log_ratio"], rel=1e-12)


def verl_reference(path) -> dict[int, dict[str, float]]:
    """verl's logged staleness per global step, as its code computes it (every non-padding trajectory of the
    batch, numpy int arrays): verl/trainer/ppo/v1/trainer_base.py @ 1dda039, `_compute_metrics` step 5 —
    trajectory_spans = max_global_steps − min_global_steps + 1, trajectory_staleness = (global_steps − 1) −
    max_global_steps, trajectory_staleness_worst = (global_steps − 1) − min_global_steps, each mean/max/min; and
    verl/experimental/fully_async_policy/detach_utils.py @ 1dda039 (assemble_batch_from_rollout_samples):
    param_version_diff = |max − min| per sample, total_partial_num = len − count(0), partial_ratio =
    (len − count(0)) / len, max_partial_span = max(diff)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    out = {}
    for g in sorted({r["global_steps"] for r in rows}):
        batch = [r for r in rows if r["global_steps"] == g]
        max_gs = np.array([r["max_global_steps"] for r in batch], dtype=int)
        min_gs = np.array([r["min_global_steps"] for r in batch], dtype=int)
        values = {}
        for key, array in (("trajectory_spans", max_gs - min_gs + 1), ("trajectory_staleness", (g - 1) - max_gs),
                           ("trajectory_staleness_worst", (g - 1) - min_gs)):
            for stat in ("mean", "max", "min"):
                values[f"training/off_policy/{key}/{stat}"] = float(getattr(array, stat)())
        diff = [abs(a - b) for a, b in zip(max_gs.tolist(), min_gs.tolist(), strict=True)]
        values["fully_async/partial/total_partial_num"] = float(len(diff) - diff.count(0))
        values["fully_async/partial/partial_ratio"] = (len(diff) - diff.count(0)) / len(diff)
        values["fully_async/partial/max_partial_span"] = float(max(diff))
        out[g] = values
    return out


def test_verl_sequence_columns_are_verls_numbers(verl_run):
    """Every verl staleness key at every step, empty responses counted as the trajectories they are."""
    from rcdiag.trackers.export import export_table

    reference = verl_reference(verl_run.path.parent / "batch.jsonl")
    frame = trend(verl_run, "verl", replicates=5)
    table = {k: c for c, k in export_table("verl", frame.columns).items()}
    assert set(reference[5]) <= set(table)
    assert (verl_run.sequences()["response_len"] == 0).any()
    for row in frame.to_dict(orient="records"):
        for key, value in reference[row["step"]].items():
            assert row[table[key]] == value, (row["step"], key)
    assert frame["partial_seqs"].sum() > 0 and frame["seq_lag_worst_max"].max() > frame["seq_lag_max"].max()


def test_no_versions_no_lag_columns(tmp_path):
    """A run without versions has the trend it always had (no lag column, no lag_reference)."""
    rows = [json.loads(x) for x in verl_rows(tmp_path / "v.jsonl", samples(steps=2)).read_text().splitlines()]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({k: v for k, v in r.items() if "max_global" not in k and "min_global"
                                         not in k}) + "\n" for r in rows))
    run = import_run("jsonl", plain, tmp_path / "run", Q)[0]
    frame = trend(run, replicates=5)
    assert not set(LAG_NAMES) & set(frame.columns) and "lag_reference" not in frame.attrs
    assert list(frame.columns[:len(TREND_COLUMNS)]) == list(TREND_COLUMNS)


def test_step_newest_reference_has_no_framework_staleness(tmp_path):
    """Without the trainer's version (slime, AReaL) the lag is counted from the step's newest version: the token
    columns are there, the frameworks' staleness columns are not (that estimate is not their logged number)."""
    async_run(tmp_path / "run", trainer_version=False)
    frame = trend(tmp_path / "run", replicates=5)
    assert frame.attrs["lag_reference"] == "step_newest"
    assert set(TOKEN_NAMES) <= set(frame.columns) and not set(SEQUENCE_NAMES) & set(frame.columns)
    tokens = open_run(tmp_path / "run").tokens().merge(open_run(tmp_path / "run").sequences(), on="seq_id")
    for step, rows in tokens.groupby("step"):
        lag = rows["policy_version"].max() - rows["policy_version"]
        got = frame.set_index("step").loc[step]
        assert got["token_lag_mean"] == lag.sum() / len(lag) and got["token_lag_max"] == lag.max()
