"""A FIFO, /dev/zero, a directory or a huge file where a run's manifest or a shard is expected is refused at once
with `Error:` (issue #34 item 6) — it used to hang (a FIFO blocks its reader forever), read without end, or fail
deep inside a reader with a traceback."""
from __future__ import annotations

import os
import shutil

import pandas as pd
import pytest

from rcdiag.store.writer import write_run
from tests.fixtures.cli import assert_user_error, run_cli


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "run", pd.DataFrame({"seq_id": [0, 0, 1], "pos": [0, 1, 0],
                                                     "rollout_logprob": [-0.1, -0.2, -0.3]})).path


def _fifo(path):
    path.unlink() if path.is_file() else shutil.rmtree(path, ignore_errors=True)
    os.mkfifo(path)


ODD = {
    "fifo_manifest": lambda run: _fifo(run / "manifest.json"),
    "dev_zero_manifest": lambda run: ((run / "manifest.json").unlink(), (run / "manifest.json").symlink_to("/dev/zero")),
    "huge_manifest": lambda run: os.truncate(run / "manifest.json", 100 << 20),  # sparse: 100 MiB of zeros
    "fifo_shard": lambda run: _fifo(run / "tokens" / "part-00000.parquet"),
    "directory_shard": lambda run: ((run / "sequences" / "part-00000.parquet").unlink(),
                                    (run / "sequences" / "part-00000.parquet").mkdir()),
}


@pytest.mark.parametrize("case", sorted(ODD))
def test_odd_file_in_a_run_is_refused_at_once(run, case):
    ODD[case](run)
    result = run_cli(["report", str(run), "--out", str(run.parent / "rep"), "-q"], timeout=120)
    assert_user_error(result, str(run))
    assert any(word in result.err for word in ("not a regular file", "more than the")), result.err
