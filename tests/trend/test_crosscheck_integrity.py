"""crosscheck on damaged, incomplete and shifted trainer logs, through the real CLI (issue #34 item 5).

Guards: TensorBoard's reader stopped at the first record failing its CRC and rcdiag compared what came before
("Agree … at N step(s)", exit 0); the W&B reader never checked record CRCs and reported file damage as the
trainer's disagreement; a log missing a middle step passed; a log at global_step = step + 1 (verl counts from 1)
was a wall of disagreements with no word of the offset.
"""
from __future__ import annotations

import pandas as pd
import pytest

from rcdiag.analysis.training.trend import trend
from rcdiag.trackers.export import tracker_rows
from tests.fixtures.cli import assert_user_error, run_cli
from tests.trend.conftest import STEPS

pytest.importorskip("tensorboard")


def _rows(run, keys="verl"):
    return tracker_rows(trend(run, keys, replicates=10), keys)


def _trainer_tensorboard(run, logdir, offset=0):
    """The trainer's log as torch's SummaryWriter writes it (one event per add_scalar, flushed as it goes)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(logdir))
    for step, values in _rows(run):
        for key, value in values.items():
            writer.add_scalar(key, value, step + offset)
    writer.close()
    (event,) = logdir.glob("events.out.tfevents*")
    return event


def _flip(file, where: float) -> int:
    data = bytearray(file.read_bytes())
    at = int(len(data) * where)
    data[at] ^= 0x40
    file.write_bytes(bytes(data))
    return at


def test_control_an_intact_trainer_log_agrees(drifting_run, tmp_path):
    _trainer_tensorboard(drifting_run, tmp_path / "tb")
    result = run_cli(["crosscheck", str(drifting_run.path), "--tensorboard", str(tmp_path / "tb"), "-q"])
    assert result.rc == 0 and result.out.startswith(f"Agree (healthy): {STEPS * 20} logged values"), result.text


def test_damaged_event_file_is_data_loss_not_agreement(drifting_run, tmp_path):
    event = _trainer_tensorboard(drifting_run, tmp_path / "tb")
    _flip(event, 0.5)
    result = run_cli(["crosscheck", str(drifting_run.path), "--tensorboard", str(tmp_path / "tb")])
    assert_user_error(result, str(event), "damaged at record", "crc32c", "not a disagreement")
    assert "Agree" not in result.out


def test_event_file_cut_short_is_data_loss(drifting_run, tmp_path):
    event = _trainer_tensorboard(drifting_run, tmp_path / "tb")
    event.write_bytes(event.read_bytes()[:-9])
    result = run_cli(["crosscheck", str(drifting_run.path), "--tensorboard", str(tmp_path / "tb")])
    assert_user_error(result, str(event), "cut short")


def _wandb_run(run, tmp_path):
    from rcdiag.trackers.export import export_run
    from rcdiag.trackers.read import wandb_file

    export_run(run, "wandb", tmp_path / "wb", "swift")  # wandb-core itself writes the offline run
    return wandb_file(tmp_path / "wb")


def test_damaged_wandb_log_is_file_damage_not_the_trainers_disagreement(drifting_run, tmp_path):
    log = _wandb_run(drifting_run, tmp_path)
    control = run_cli(["crosscheck", str(drifting_run.path), "--wandb", str(log), "-q"])
    assert control.rc == 0 and control.out.startswith("Agree (healthy)"), control.text
    data = log.read_bytes()
    at = data.index(b"rollout_correction/kl") + 40  # inside a history record's values
    log.write_bytes(data[:at] + bytes([data[at] ^ 0x08]) + data[at + 1:])
    result = run_cli(["crosscheck", str(drifting_run.path), "--wandb", str(log)])
    assert_user_error(result, str(log), "damaged W&B log", "fails its CRC-32", "not a disagreement")
    assert "Disagree" not in result.text


def test_missing_middle_step_fails(drifting_run, tmp_path):
    rows = [{"step": s, **v} for s, v in _rows(drifting_run) if s != 4]
    pd.DataFrame(rows).to_csv(tmp_path / "history.csv", index=False)
    result = run_cli(["crosscheck", str(drifting_run.path), "--csv", str(tmp_path / "history.csv")])
    assert result.rc == 1, result.text
    assert "Missing from the log (data loss): no logged value at run step(s) 4 " in result.out
    assert "Traceback" not in result.text


def test_one_step_offset_is_detected_and_fixed_by_step_offset(drifting_run, tmp_path):
    _trainer_tensorboard(drifting_run, tmp_path / "tb", offset=1)
    result = run_cli(["crosscheck", str(drifting_run.path), "--tensorboard", str(tmp_path / "tb"), "-q"])
    assert result.rc == 1, result.text
    assert "shifted by +1 step(s)" in result.out and "--step-offset 1" in result.out, result.out
    fixed = run_cli(["crosscheck", str(drifting_run.path), "--tensorboard", str(tmp_path / "tb"),
                     "--step-offset", "1", "-q"])
    assert fixed.rc == 0 and fixed.out.startswith(f"Agree (healthy): {STEPS * 20} logged values"), fixed.text
    assert "(logged step = run step +1)" in fixed.out
