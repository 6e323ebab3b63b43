"""An offline W&B export after the process changed directory (a notebook's os.chdir, the docs test): the relative
destination is the caller's, not wandb-core's. Guards the export that waited 60 s and failed ("wandb wrote 0 of 6
steps") because the service, started by the process's first export, resolved the relative dir against its own
working directory."""
from __future__ import annotations

import pytest

from rcdiag.trackers.export import export_run
from rcdiag.trackers.read import read_wandb
from tests.trend.steps import noise_schedule, write_step_run

pytest.importorskip("wandb")


def test_second_wandb_export_after_chdir_writes_every_step(tmp_path, monkeypatch):
    run = write_step_run(tmp_path / "steps", noise_schedule(3, None), n_seq=8)
    export_run(run, "wandb", tmp_path / "first", "verl")  # starts wandb-core with the test's working directory
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    result = export_run(run, "wandb", "wb", "swift")
    runs = list((tmp_path / "elsewhere/wb/wandb").glob("offline-run-*"))
    assert len(runs) == 1 and sorted(set(read_wandb(runs[0])["step"])) == [0, 1, 2], result
