"""rcdiag.trend and drift: per-step numbers equal an independent float64 reference on each step's sequences, in
one pass whatever the file/chunk boundaries; a mismatch growing from a known step is found at that step."""
from __future__ import annotations

import pandas as pd
import pytest

import rcdiag
from rcdiag.analysis.training.drift import timeline
from rcdiag.analysis.training.trend import step_index, trend
from rcdiag.errors import InputError
from tests.analysis import reference
from tests.trend.conftest import CHANGE, STEPS


@pytest.mark.parametrize("convention", ["canonical", "verl", "swift"])
def test_each_step_matches_the_float64_reference(drifting_run, convention):
    """Guards routing sequences to the wrong step (or mixing steps inside a chunk cut across a file boundary)."""
    frame = trend(drifting_run, convention, threshold=2.0, replicates=50)
    tokens, seqs = drifting_run.tokens(), drifting_run.sequences()
    assert frame["step"].tolist() == list(range(STEPS))
    for step in (0, CHANGE, STEPS - 1):
        ids = seqs.loc[seqs["step"] == step, "seq_id"]
        ref_seqs = reference.sequences(tokens[tokens["seq_id"].isin(ids)], universe=ids.tolist())
        want = reference.metrics(ref_seqs, convention)
        want_is = reference.is_metrics(ref_seqs, convention, "token_truncate", 2.0)
        row = frame.loc[frame["step"] == step].iloc[0]
        assert row["sequences"] == len(ids)
        for name in ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_abs_diff", "training_ppl"):
            assert row[name] == pytest.approx(want[name], rel=1e-9, abs=1e-12), (step, name)
        for name in ("ess", "clipped_frac", "is_weight_mean"):
            assert row[name] == pytest.approx(want_is[name], rel=1e-9, abs=1e-12), (step, name)
        assert row["k3_kl_low"] <= row["k3_kl"] <= row["k3_kl_high"]


def test_run_without_steps_is_step_zero(tmp_path, drifting_run):
    tokens = drifting_run.tokens()
    run = rcdiag.write_run(tmp_path / "one", tokens)
    frame = trend(run, replicates=20)
    assert frame["step"].tolist() == [0]
    assert frame["kl"].iloc[0] == pytest.approx(rcdiag.compute_metrics(run)["kl"], rel=1e-12)


def test_partly_missing_steps_are_refused(tmp_path, drifting_run):
    seqs = drifting_run.sequences()
    seqs["step"] = seqs["step"].astype("Int64")
    seqs.loc[seqs["seq_id"] == 7, "step"] = pd.NA
    run = rcdiag.write_run(tmp_path / "holes", drifting_run.tokens(), seqs)
    with pytest.raises(InputError, match="seq 7 has no step"):
        step_index(run)


def test_drift_found_at_the_step_it_starts_not_before(drifting_run):
    """A noise that doubles every step from CHANGE is a ramp on a log scale: a drift from CHANGE, not a step change
    (and the same steps cut off before the change are steady)."""
    frame = trend(drifting_run, replicates=50)
    found = timeline(frame)
    assert found.change is None and found.drift is not None and found.drift.start_step == CHANGE, found.text
    assert found.drift.rise > 1.5
    before = timeline(frame[frame["step"] < CHANGE])
    assert before.change is None and before.drift is None and before.text.startswith("Steady")


def test_no_drift_on_a_flat_run(flat_run):
    found = timeline(trend(flat_run, replicates=50))
    assert found.change is None and found.drift is None and found.text.startswith("Steady"), found.text
