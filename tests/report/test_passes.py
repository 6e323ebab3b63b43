"""Each file's report task reads only its own shard's sequences; the numbers equal those of tasks that read the
whole sequences table (the former O(files × sequences) path), bit for bit."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from rcdiag.analysis.passes.engine import file_part
from rcdiag.report import passes
from rcdiag.report.build import build_report
from rcdiag.report.options import ReportOptions
from rcdiag.store.run import Run, open_run
from rcdiag.store.writer import write_run
from tests.distributed.test_report import snapshot
from tests.fixtures.runs import build_run, defect_frames

OPTIONS = ReportOptions(replicates=30)


def _reads(monkeypatch):
    """Record which sequence files each read opens."""
    opened = []
    real = pq.read_table

    def spy(source, *args, **kwargs):
        opened.append(str(source))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(pq, "read_table", spy)
    return opened


@pytest.fixture(scope="module")
def uneven_run(tmp_path_factory):
    """Shards whose finish reasons differ (shard 0: all "stop"; others: stop, length, none), a reward column."""
    tokens, sequences = defect_frames("clean", n_seq=90)
    first = sequences["seq_id"] < 20
    sequences.loc[first, "finish_reason"] = "stop"
    sequences.loc[~first & (sequences["seq_id"] % 7 == 0), "finish_reason"] = None
    path = tmp_path_factory.mktemp("passes") / "uneven"
    return write_run(path, tokens, sequences, shard_tokens=250)


@pytest.mark.parametrize("name", ["uneven", "clean", "count_mismatch", "nan_placeholder"])
def test_own_shard_equals_whole_table(uneven_run, tmp_path, monkeypatch, name):
    run = uneven_run if name == "uneven" else build_run(tmp_path / name, name, shard_tokens=250, n_seq=90)
    assert len(run.token_files) > 3
    per_shard = snapshot(build_report(open_run(run.path), OPTIONS))
    monkeypatch.setattr(Run, "sequence_files", property(lambda self: sorted((self.path / "sequences").glob("*.parquet"))))
    whole = snapshot(build_report(open_run(run.path), OPTIONS))
    assert per_shard == whole


def test_a_file_task_reads_one_sequences_file(uneven_run, monkeypatch):
    opened = _reads(monkeypatch)
    file_part(str(uneven_run.path), passes.ReportParts(OPTIONS, ("(none)", "length", "stop")), 2)
    sequence_reads = [f for f in opened if "/sequences/" in f]
    assert sequence_reads and set(sequence_reads) == {str(uneven_run.sequence_files[2])}
