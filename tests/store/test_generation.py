"""A run rewritten while it is read is never read as a mix of two runs, and a run being recorded opens at every
moment (issue #34 item 6). A report made while `import --overwrite` swapped a new run in used to compute its first
files from the old run and the rest from the new one, silently; a reader that listed the shards while the
Recorder was between its two renames (tokens written, sequences not yet) failed with "has no matching
sequences/part-…" in the middle of training."""
from __future__ import annotations

import os
import threading

import numpy as np
import pandas as pd
import pytest

import rcdiag
from rcdiag.errors import RunDirError
from rcdiag.record import Recorder
from rcdiag.report.make import make_report
from rcdiag.report.options import ReportOptions
from rcdiag.store.files import write_parquet_atomic
from rcdiag.store.run import open_run
from rcdiag.store.writer import write_run


def _tokens(seed: int, n_seq: int = 40, length: int = 6) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    b = -rng.uniform(0.05, 2.0, n_seq * length)
    return pd.DataFrame({"seq_id": np.repeat(np.arange(n_seq), length), "pos": np.tile(np.arange(length), n_seq),
                         "token_id": rng.integers(0, 100, n_seq * length), "rollout_logprob": b,
                         "train_logprob": b + rng.normal(0, 0.3 * seed + 0.01, b.size)})


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("RCDIAG_CACHE_DIR", "off")


def _swap_after_first(path, new):
    """A map over the per-file tasks that lets `import --overwrite` swap `new` in at `path` after the first file —
    what swap_in does: the old directory renamed away, the new one renamed in."""
    def map_files(task, indices):
        for k, index in enumerate(indices):
            if k == 1:
                os.replace(path, path.with_name(path.name + ".old"))
                os.replace(new, path)
            yield task(index)
    return map_files


def test_report_of_a_run_swapped_mid_pass_is_refused(tmp_path):
    path = write_run(tmp_path / "run", _tokens(1), shard_tokens=60).path
    new = write_run(tmp_path / "new", _tokens(5), shard_tokens=60).path
    run = open_run(path)
    assert len(run.token_files) == 4
    with pytest.raises(RunDirError, match="changed while rcdiag read it.*replaced"):
        make_report([run], tmp_path / "rep", ReportOptions(silent=True), map_files=_swap_after_first(path, new))
    assert not (tmp_path / "rep").exists()


def test_metrics_of_a_run_rewritten_in_place_are_refused(tmp_path):
    """`score --overwrite` / write_run(overwrite=True) rewrite the same paths: new inodes, new times."""
    path = write_run(tmp_path / "run", _tokens(1), shard_tokens=60).path
    run = open_run(path)
    write_run(path, _tokens(5), shard_tokens=120, overwrite=True)
    with pytest.raises(RunDirError, match="(changed|removed) while rcdiag read"):
        rcdiag.compute_metrics(run)
    assert np.isfinite(rcdiag.compute_metrics(open_run(path))["kl"])  # a fresh open reads the new run


def test_a_shard_run_stamps_only_its_own_files(tmp_path):
    """Each file task of a pass opens its shard: stamping the whole run there cost N² stats per pass (500
    shards: 13.7 s). The whole run's Run stamps every shard; a shard's Run its tokens and sequences file."""
    path = write_run(tmp_path / "run", _tokens(1), shard_tokens=60).path
    run = open_run(path)
    assert sorted(run.generation) == sorted([*run.token_files, *run.sequence_files]) and len(run.generation) == 8
    shard = run.shard(2)
    assert sorted(f"{f.parent.name}/{f.name}" for f in shard.generation) == [
        "sequences/part-00002.parquet", "tokens/part-00002.parquet"]
    with pytest.raises(IndexError, match="no token file 4"):
        run.shard(4)


def _record(path, steps, n=4, length=5, seed=0):
    rng = np.random.default_rng(seed)
    rec = Recorder(path)
    for step in steps:
        b = -rng.uniform(0.05, 2.0, (n, length))
        rec.add(step, [[1, 2]] * n, rng.integers(0, 50, (n, length)), b, b + rng.normal(0, 0.1, b.shape),
                np.ones((n, length)))
    return rec


def test_a_shard_between_its_two_renames_is_not_read(tmp_path):
    """The Recorder's window: tokens/part-00002 renamed in, sequences/part-00002 not yet."""
    path = tmp_path / "live"
    _record(path, [0, 1])
    write_parquet_atomic(open_run(path).token_table().slice(0, 5), path / "tokens" / "part-00002.parquet")
    run = open_run(path)
    assert [f.name for f in run.token_files] == ["part-00000.parquet", "part-00001.parquet"]
    assert run.num_tokens == 2 * 4 * 5 and np.isfinite(rcdiag.compute_metrics(run)["kl"])


def test_a_lost_sequences_file_is_still_damage(tmp_path):
    """The manifest (written after a shard is complete) counts the shard: its missing sequences file is damage."""
    path = write_run(tmp_path / "run", _tokens(1), shard_tokens=60).path
    (path / "sequences" / "part-00003.parquet").unlink()
    with pytest.raises(RunDirError, match="has no matching sequences/part-00003"):
        open_run(path)


def test_shards_appended_while_reading_are_not_a_change(tmp_path):
    path = tmp_path / "live"
    rec = _record(path, [0, 1])
    run = open_run(path)
    rec.add(2, [[1]] * 2, [[3, 4]] * 2, [[-0.1, -0.2]] * 2, [[-0.1, -0.3]] * 2, [[1, 1]] * 2)
    assert np.isfinite(rcdiag.compute_metrics(run)["kl"])
    assert run.token_table().num_rows == 2 * 4 * 5  # the run as it was when opened
    run.check_unchanged()
    assert len(open_run(path).token_files) == 3


def test_reader_never_fails_while_the_recorder_writes(tmp_path):
    """Open and measure the run in a loop while a Recorder records step after step in another thread."""
    path = tmp_path / "live"
    _record(path, [0])
    done, errors = threading.Event(), []

    def train():
        try:
            rec = Recorder(path)
            for step in range(1, 40):
                b = -np.linspace(0.1, 1.0, 30).reshape(3, 10)
                rec.add(step, [[1]] * 3, np.full((3, 10), 7), b, b - 0.01, np.ones((3, 10)))
        except Exception as exc:  # noqa: BLE001 — reported by the main thread
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=train)
    thread.start()
    reads = 0
    while not done.is_set() or reads < 3:
        run = open_run(path)  # raised "has no matching sequences/part-…" inside the Recorder's window
        assert run.token_table(["seq_id"]).num_rows == run.num_tokens == 30 * len(run.token_files) - 10
        run.check_unchanged()
        reads += 1
    thread.join()
    assert not errors, errors
    assert reads >= 3 and len(open_run(path).token_files) == 40
