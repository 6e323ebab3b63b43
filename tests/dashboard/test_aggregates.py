"""The Distributions aggregates against independent numpy references on the same tokens."""
from __future__ import annotations

import numpy as np
import pandas as pd

from app import aggregates, data
from rcdiag.analysis.distributions.tails import DENSITY_BINS, DENSITY_RANGE


def _valid(run) -> pd.DataFrame:
    tokens = run.tokens()
    tokens = tokens[tokens["mask"]].copy()
    tokens["a"] = tokens["train_logprob"].astype(np.float64)
    tokens["b"] = tokens["rollout_logprob"].astype(np.float64)
    return tokens


def test_density_cells_hold_each_token(noisy_run):
    """Every valid token lands in the rebinned cell containing its (a, b) (float64 reference with np.histogram2d on
    the same edges), and no token is lost."""
    result = aggregates.distributions(str(noisy_run.path), 0.0, None)
    cells = aggregates.density(result["tails"])
    tokens = _valid(noisy_run)
    assert int(cells["count"].sum()) == len(tokens)
    lo, hi = DENSITY_RANGE
    fine = (hi - lo) / DENSITY_BINS
    step = float(cells["a_hi"].iloc[0] - cells["a_lo"].iloc[0])
    assert step >= fine and abs(step / fine - round(step / fine)) < 1e-9
    start = float(min(cells["a_lo"].min(), cells["b_lo"].min()))
    edges = np.arange(start, hi + step / 2, step)
    a = np.clip(tokens["a"], lo, hi - 1e-12)
    b = np.clip(tokens["b"], lo, hi - 1e-12)
    ref, _, _ = np.histogram2d(a, b, bins=[edges, edges])
    ia = np.rint((cells["a_lo"] - start) / step).astype(int)
    ib = np.rint((cells["b_lo"] - start) / step).astype(int)
    got = np.zeros_like(ref)
    got[ia, ib] = cells["count"]
    assert np.array_equal(got, ref), np.argwhere(got != ref)[:5]


def test_histogram_and_strata_counts(noisy_run):
    result = aggregates.distributions(str(noisy_run.path), 0.0, None)
    tokens = _valid(noisy_run)
    hist = aggregates.histogram(result["tails"])
    assert int(hist["count"].sum()) == len(tokens)
    lr = (tokens["a"] - tokens["b"]).to_numpy()
    assert hist["lo"].min() <= lr.min() and hist["hi"].max() >= lr.max()
    by_pos = result["strata"]["position"]
    first = by_pos[by_pos["bucket"] == "0"].iloc[0]
    at0 = tokens[tokens["pos"] == 0]
    assert first["tokens"] == len(at0)
    assert np.isclose(first["mean_log_ratio"], (at0["a"] - at0["b"]).mean(), rtol=1e-12, atol=1e-15)


def test_filtered_scan_matches_a_filtered_reference(noisy_run):
    index = data.sequence_index(str(noisy_run.path), 0.0)
    filters = (("length",), None, (10.0, 40.0))
    keep = data.seq_ids_where(index, *filters)
    result = aggregates.distributions(str(noisy_run.path), 0.0, filters)
    tokens = _valid(noisy_run)
    chosen = tokens[tokens["seq_id"].isin(keep)]
    assert result["tails"].n == len(chosen) > 0
    assert np.isclose(result["tail_stats"]["abs_log_ratio_mean"], (chosen["a"] - chosen["b"]).abs().mean(),
                      rtol=1e-12)
    assert "findings" not in result  # the checks are only gathered over the whole run


def test_sequence_stats_from_the_report_pass_equal_the_library(noisy_run, heavy_run):
    """The Sequences index reads the report's cached per-sequence sums (app.judged) instead of its own pass: the
    same columns and values as rcdiag.analysis.metrics.compute.sequence_stats."""
    from app import judged
    from rcdiag.analysis.metrics.compute import sequence_stats

    for run in (noisy_run, heavy_run):
        expected = sequence_stats(run).sort_values("seq_id", ignore_index=True)
        shown = judged.sequence_stats(str(run.path), "test").sort_values("seq_id", ignore_index=True)
        pd.testing.assert_frame_equal(shown, expected, check_exact=False, rtol=1e-12, atol=1e-15)
