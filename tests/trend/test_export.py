"""rcdiag export: TensorBoard files read back with TensorBoard's own EventAccumulator, the offline W&B run read back
from its .wandb log with wandb's protobuf (no network), CSV/JSONL — every value equal to the trend's."""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from rcdiag.analysis.training.trend import trend
from rcdiag.cli import main
from rcdiag.trackers.export import export_run, export_table
from rcdiag.trackers.read import read_history_csv, read_wandb
from tests.trend.conftest import STEPS

pytest.importorskip("tensorboard")


def test_tensorboard_scalars_at_their_steps(drifting_run, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert main(["export", str(drifting_run.path), "--to", "tensorboard", str(tmp_path / "tb"),
                 "--keys", "verl"]) == 0
    assert capsys.readouterr().out.startswith("Wrote 200 scalars (20 keys × 10 step(s)) to ")
    (event,) = (tmp_path / "tb" / "drifting").glob("events.out.tfevents*")  # TensorBoard run "drifting"
    accumulator = EventAccumulator(str(event))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    frame = trend(drifting_run, "verl", replicates=10)
    assert tags == set(export_table("verl", frame.columns).values())  # no versions: no staleness keys
    for column, key in (("k3_kl", "rollout_corr/k3_kl"), ("ess", "rollout_corr/rollout_is_eff_sample_size")):
        got = [(e.step, e.value) for e in accumulator.Scalars(key)]
        assert [s for s, _ in got] == list(range(STEPS))
        assert [v for _, v in got] == pytest.approx(frame[column].tolist(), rel=1e-6)  # float32 in the file
    assert not list((tmp_path / "tb").rglob(".rcdiag-export-*")), "temporary directory left behind"


def test_wandb_offline_run_reads_back(drifting_run, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    result = export_run(drifting_run, "wandb", tmp_path / "wb", "swift")
    assert result.path.name.startswith("offline-run-") and list(result.path.glob("*.wandb"))
    logged = read_wandb(tmp_path / "wb")
    frame = trend(drifting_run, "swift", replicates=10)
    k3 = logged[logged["key"] == "rollout_correction/k3_kl"].sort_values("step")
    assert k3["step"].tolist() == list(range(STEPS))
    assert k3["value"].tolist() == pytest.approx(frame["k3_kl"].tolist(), rel=1e-12)
    assert set(logged["key"]) == set(export_table("swift").values())


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_flat_tables(drifting_run, tmp_path, fmt):
    dest = tmp_path / f"steps.{fmt}"
    export_run(drifting_run, fmt, dest, "trl")
    table = pd.read_csv(dest) if fmt == "csv" else pd.DataFrame([json.loads(x) for x in dest.read_text().splitlines()])
    assert table["step"].tolist() == list(range(STEPS))
    written = export_table("trl", trend(drifting_run, "trl", replicates=10).columns)
    assert set(table.columns) == {"step", *written.values()}
    if fmt == "csv":
        assert len(read_history_csv(dest)) == STEPS * len(written)


def test_missing_tracker_is_a_clear_error(drifting_run, tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what `import tensorboard` meets when not installed
    code = main(["export", str(drifting_run.path), "--to", "tensorboard", str(tmp_path / "tb")])
    err = capsys.readouterr().err
    assert code == 1 and "tensorboard is not installed" in err and "rcdiag[trackers]" in err
    assert "Traceback" not in err and not (tmp_path / "tb").exists()


def test_unknown_keys_and_target(drifting_run, tmp_path, capsys):
    assert main(["export", str(drifting_run.path), "--to", "tensorboard", str(tmp_path), "--keys", "x"]) == 1
    assert "unknown keys 'x'; choose one of canonical, verl, swift, trl" in capsys.readouterr().err
    assert main(["export", str(drifting_run.path), "--to", "mlflow", str(tmp_path)]) == 1
    assert "unknown --to 'mlflow'" in capsys.readouterr().err
    assert not os.listdir(tmp_path)


def test_export_keys_are_the_frameworks_own():
    """The exact strings verl 0.9 / ms-swift 4.5 / TRL 1.9 log (docs/framework-keys.md), from the one table
    metrics.json uses; nothing rcdiag-only is passed off under a framework's prefix."""
    off_policy = ("training_ppl", "training_log_ppl", "kl", "k3_kl", "rollout_ppl", "rollout_log_ppl",
                  "log_ppl_diff", "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio",
                  "chi2_token", "chi2_seq")
    verl_is = ("rollout_is_mean", "rollout_is_std", "rollout_is_min", "rollout_is_max", "rollout_is_eff_sample_size",
               "rollout_is_ratio_fraction_high", "rollout_is_ratio_fraction_low")
    staleness = {f"training/off_policy/trajectory_{k}/{s}" for k in ("staleness", "staleness_worst", "spans")
                 for s in ("mean", "max", "min")} | {f"fully_async/partial/{k}" for k in (
                     "total_partial_num", "partial_ratio", "max_partial_span")}
    assert set(export_table("verl").values()) == {f"rollout_corr/{k}" for k in (*off_policy, *verl_is)} | staleness
    assert set(export_table("swift").values()) == {f"rollout_correction/{k}" for k in (
        *off_policy, "is_weight_mean", "ess", "clipped_frac")}
    assert export_table("trl") == {
        "is_weight_min": "sampling/importance_sampling_ratio/min",
        "is_weight_mean": "sampling/importance_sampling_ratio/mean",
        "is_weight_max": "sampling/importance_sampling_ratio/max",
        "abs_log_ratio_mean": "sampling/sampling_logp_difference/mean",
        "abs_log_ratio_max": "sampling/sampling_logp_difference/max",
        "seq_lag_mean": "sample/staleness_mean", "seq_lag_max": "sample/staleness_max"}
    canonical = export_table("canonical")
    assert canonical["k3_kl"] == "rcdiag/k3_kl" and canonical["k3_kl_high"] == "rcdiag/k3_kl_high"
    assert "step" not in canonical and not any(k.endswith("_se") for k in canonical)
