"""Errors the disk or the input's shape causes are `Error:` lines, exit 1, never a traceback (issue #34 item 6):
a 240-character run name (ENAMETOOLONG from a temporary sibling's longer name), a lone surrogate in the text,
`--to tensorboard FILE`; and report directories get the mode the umask gives (mkdtemp made every one 0700)."""
from __future__ import annotations

import os
import stat

import pandas as pd
import pytest

from rcdiag.store.writer import write_run
from tests.fixtures.cli import assert_user_error, run_cli


def _jsonl(tmp_path, prompt: str = "p"):
    file = tmp_path / "rollouts.jsonl"
    file.write_text(f'{{"response_ids": [1, 2], "rollout_logprobs": [-0.1, -0.2], "prompt": "{prompt}"}}\n')
    return file


def _run(path):
    return write_run(path, pd.DataFrame({"seq_id": [0, 0, 1], "pos": [0, 1, 0], "rollout_logprob": [-0.1, -0.2, -0.3],
                                         "train_logprob": [-0.1, -0.25, -0.3]}))


def test_long_run_name_is_an_error_not_a_traceback(tmp_path):
    # 250 bytes: the name itself fits NAME_MAX (255) but its lock file (".<name>.lock") never does, whatever the pid;
    # at 240 the staging folder ".<name>.importing-<pid>" fitted when the pid had three digits and the import passed
    out = tmp_path / ("r" * 250)
    result = run_cli(["import", "jsonl", str(_jsonl(tmp_path)), "--out", str(out), "-q"])
    assert_user_error(result, "File name too long", "shorter name")
    assert not any(p.name.startswith(".r") for p in tmp_path.iterdir())


def test_lone_surrogate_is_an_error_not_a_traceback(tmp_path):
    result = run_cli(["import", "jsonl", str(_jsonl(tmp_path, "\\ud800x")), "--out", str(tmp_path / "run"), "-q"])
    assert_user_error(result, "surrogate")
    assert not (tmp_path / "run").exists()


def test_export_to_tensorboard_onto_a_file_is_an_error(tmp_path):
    pytest.importorskip("tensorboard")
    run = _run(tmp_path / "run")
    (tmp_path / "tb").write_text("not a directory\n")
    result = run_cli(["export", str(run.path), "--to", "tensorboard", str(tmp_path / "tb"), "-q"])
    assert_user_error(result, "not a directory")
    assert (tmp_path / "tb").read_text() == "not a directory\n"


def test_tensorboard_reexport_replaces_its_file_and_a_dotdot_run_stays_inside(tmp_path):
    """A second export left a second event file (every curve twice); the temporary folder sat inside the log dir;
    a run opened as `runs/x/..` exported into the log dir's parent."""
    pytest.importorskip("tensorboard")
    run = _run(tmp_path / "runs" / "x" / "steps")
    logdir = tmp_path / "tb"
    for _ in range(2):
        assert run_cli(["export", str(run.path), "--to", "tensorboard", str(logdir), "-q"]).rc == 0
    assert len(list((logdir / "steps").glob("events.out.tfevents*"))) == 1
    assert sorted(p.name for p in logdir.iterdir()) == ["steps"]
    (run.path / "probes").mkdir()
    dotdot = run.path / "probes" / ".."  # the run itself, named `..`
    result = run_cli(["export", str(dotdot), "--to", "tensorboard", str(logdir), "-q"])
    assert result.rc == 0, result.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "tb"]
    assert not list(tmp_path.glob("events.out.tfevents*"))


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_report_directory_mode_follows_the_umask(tmp_path, umask):
    run = _run(tmp_path / "run")
    old = os.umask(umask)
    try:
        result = run_cli(["report", str(run.path), "--out", str(tmp_path / "rep"), "-q"])
    finally:
        os.umask(old)
    assert result.rc == 0, result.text
    assert stat.S_IMODE((tmp_path / "rep").stat().st_mode) == 0o777 & ~umask
