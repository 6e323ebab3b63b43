"""rcdiag crosscheck: a trainer log written from the run's own numbers agrees; one deliberately wrong step is named,
and only that step (TensorBoard written by TensorBoard's writer, history CSV, prefixed keys)."""
from __future__ import annotations

import pytest

from rcdiag.analysis.training.trend import trend
from rcdiag.cli import main
from rcdiag.trackers.crosscheck import crosscheck
from rcdiag.trackers.export import tracker_rows, write_tensorboard
from tests.trend.conftest import STEPS

pytest.importorskip("tensorboard")
WRONG_STEP = 3


def trainer_log(run, tmp_path, keys="verl", wrong_step=None, factor=1.0 + 5e-3, prefix=""):
    """A TensorBoard log as the trainer would have written it (its convention's numbers, float32 in the file),
    with every key of `wrong_step` off by `factor` (e.g. the wrong temperature at that step)."""
    rows = tracker_rows(trend(run, keys, replicates=10), keys)
    rows = [(s, {prefix + k: v * (factor if s == wrong_step else 1.0) for k, v in values.items()})
            for s, values in rows]
    write_tensorboard(rows, tmp_path / "tb", "trainer")
    return tmp_path / "tb"


def test_correct_log_agrees(drifting_run, tmp_path):
    result = crosscheck(drifting_run, trainer_log(drifting_run, tmp_path), "tensorboard")
    assert result.keys == "verl" and result.bad_steps == [] and len(result.table) == STEPS * 20
    assert result.summary().startswith("Agree (healthy): 200 logged values at 10 step(s)")


def test_one_wrong_step_is_named_and_only_it(drifting_run, tmp_path, capsys):
    log = trainer_log(drifting_run, tmp_path, wrong_step=WRONG_STEP, prefix="actor/")
    result = crosscheck(drifting_run, log, "tensorboard")
    assert result.bad_steps == [WRONG_STEP]
    code = main(["crosscheck", str(drifting_run.path), "--tensorboard", str(log), "--quiet"])
    out = capsys.readouterr().out
    assert code == 1 and out.startswith(f"Disagree (alarm) at step(s) {WRONG_STEP}: ")


def test_float32_rounding_is_within_tolerance_a_small_error_is_not(drifting_run, tmp_path):
    """1e-5 relative (float32 rounding is ~6e-8) passes, 1e-2 on one step fails."""
    assert crosscheck(drifting_run, trainer_log(drifting_run, tmp_path / "a", wrong_step=5, factor=1 + 1e-5),
                      "tensorboard").bad_steps == []
    assert crosscheck(drifting_run, trainer_log(drifting_run, tmp_path / "b", wrong_step=5, factor=1 + 1e-2),
                      "tensorboard").bad_steps == [5]


def test_history_csv_with_wandb_step_column(drifting_run, tmp_path, capsys):
    import pandas as pd

    rows = tracker_rows(trend(drifting_run, "swift", replicates=10), "swift")
    table = pd.DataFrame([{"_step": s, **v} for s, v in rows])
    table.loc[table["_step"] == 8, "rollout_correction/kl"] *= 2
    table.to_csv(tmp_path / "history.csv", index=False)
    code = main(["crosscheck", str(drifting_run.path), "--csv", str(tmp_path / "history.csv"),
                 "--out", str(tmp_path / "all.csv")])
    out = capsys.readouterr().out
    assert code == 1 and "at step(s) 8:" in out and "step 8: rollout_correction/kl logged" in out
    assert len(pd.read_csv(tmp_path / "all.csv")) == STEPS * 16


def test_no_known_keys_and_bad_usage(drifting_run, tmp_path, capsys):
    write_tensorboard([(0, {"loss": 1.0})], tmp_path / "tb", "x")
    assert main(["crosscheck", str(drifting_run.path), "--tensorboard", str(tmp_path / "tb")]) == 1
    assert "none of the logged keys is a known rollout-correction key" in capsys.readouterr().err
    assert main(["crosscheck", str(drifting_run.path)]) == 1
    assert "give exactly one of --tensorboard" in capsys.readouterr().err
