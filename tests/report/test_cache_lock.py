"""The pass cache never follows a lock file planted as a symlink (issue #34 item 6): its lock used to be opened
with open(…, "a+b"), which created (or opened) whatever file a symlink of that name pointed at."""
from __future__ import annotations

import pandas as pd

from rcdiag.store.writer import write_run
from tests.fixtures.cli import run_cli


def test_planted_lock_symlink_is_not_followed(tmp_path):
    run = write_run(tmp_path / "run", pd.DataFrame({"seq_id": [0, 0, 1], "pos": [0, 1, 0],
                                                    "rollout_logprob": [-0.1, -0.2, -0.3],
                                                    "train_logprob": [-0.1, -0.25, -0.3]}))
    first = tmp_path / "cache-a"
    assert run_cli(["report", str(run.path), "--out", str(tmp_path / "r1"), "-q"],
                   env={"RCDIAG_CACHE_DIR": str(first)}).rc == 0
    locks = sorted(p.name for p in (first / "passes").glob(".*.lock"))
    assert locks, "the report took no pass-cache lock"
    second = tmp_path / "cache-b"
    (second / "passes").mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    for name in locks:
        (second / "passes" / name).symlink_to(victim)
    result = run_cli(["report", str(run.path), "--out", str(tmp_path / "r2"), "-q"],
                     env={"RCDIAG_CACHE_DIR": str(second)})
    assert result.rc == 0, result.text
    assert not victim.exists(), "the planted symlink's target was created"
