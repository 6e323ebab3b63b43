"""The one pass engine (rcdiag.analysis.passes.engine) and the accumulator contract it runs on (rcdiag.analysis.passes.accum)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import rcdiag
from rcdiag.analysis.metrics.compute import MetricsAccumulator
from rcdiag.analysis.passes.accum import BatchConsumer, ChunkConsumer, Totals
from rcdiag.analysis.passes.engine import Fresh, run_pass, stream
from rcdiag.errors import InputError
from rcdiag.store.batches import keep_seq_ids
from rcdiag.store.writer import write_run


class Rows(BatchConsumer):
    """Records what each batch consumer call saw: (file, row0, seq_ids)."""

    columns = ("seq_id", "pos", "rollout_logprob")

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, list[int]]] = []

    def update_batch(self, rows, file, row0):
        self.seen.append((file, row0, rows.seq.tolist()))

    def fresh(self):
        return Rows()

    def merge(self, other):
        self.seen += other.seen
        return self

    def finish(self, totals):
        return self.seen


class Chunks(ChunkConsumer):
    """Records the seq_ids of each chunk."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def update_chunk(self, chunk):
        self.seen.append(chunk.seq_ids.tolist())

    def fresh(self):
        return Chunks()

    def merge(self, other):
        self.seen += other.seen
        return self

    def finish(self, totals):
        return self.seen


def _run(tmp_path, lengths=(3, 5, 2, 4, 6), shard_tokens=8):
    lengths = np.asarray(lengths)
    seq = np.repeat(np.arange(lengths.size), lengths)
    pos = np.concatenate([np.arange(n) for n in lengths])
    tokens = pd.DataFrame({"seq_id": seq, "pos": pos, "rollout_logprob": -np.arange(seq.size, dtype=float) / 10,
                           "train_logprob": -np.arange(seq.size, dtype=float) / 10 - 0.01})
    return write_run(tmp_path / "r", tokens, shard_tokens=shard_tokens)


def test_a_consumer_missing_a_method_fails_at_its_definition():
    """The contract is checked when the class statement runs (review 3: `stream` found abilities by hasattr and
    fell back to one sequential stream silently when fresh/merge were missing)."""
    with pytest.raises(TypeError, match="defines no fresh"):
        class NoFresh(ChunkConsumer):  # noqa: F841
            def update_chunk(self, chunk): ...
            def merge(self, other): return self
            def finish(self, totals): ...
    with pytest.raises(TypeError, match=r"finish.*must take \(totals\)"):
        class OtherFinish(ChunkConsumer):  # noqa: F841
            def update_chunk(self, chunk): ...
            def fresh(self): ...
            def merge(self, other): return self
            def finish(self, num_sequences, batch_normalize=False): ...


def test_an_undeclared_consumer_is_refused_not_run_slowly(tmp_path):
    class Duck:
        def update_chunk(self, chunk): ...

    with pytest.raises(TypeError, match="ChunkConsumer or accum.BatchConsumer"):
        stream(_run(tmp_path), [Duck()])


def test_every_batch_once_in_file_order_with_offsets_per_file(tmp_path):
    """Batch consumers see every row once, files in order, each batch's first row counted within its file (what
    evidence locates rows by), whatever the threads."""
    run = _run(tmp_path)
    assert len(run.token_files) > 1
    seen = run_pass(run, Fresh((Rows(),)), batch_rows=3).consumers[0].seen
    assert [f for f, _, _ in seen] == sorted(f for f, _, _ in seen)
    assert sum(len(s) for _, _, s in seen) == run.num_tokens
    for file in {f for f, _, _ in seen}:
        starts = [(r0, len(ids)) for f, r0, ids in seen if f == file]
        assert [r0 for r0, _ in starts] == list(np.cumsum([0] + [n for _, n in starts])[:-1])


def test_keep_filter_drops_rows_but_offsets_count_the_file(tmp_path):
    run = _run(tmp_path)
    seen = run_pass(run, Fresh((Rows(),)), batch_rows=4, keep=keep_seq_ids([1, 4])).consumers[0].seen
    assert [i for _, _, ids in seen for i in ids] == [1] * 5 + [4] * 6
    assert all(r0 % 4 == 0 for _, r0, _ in seen)  # batch starts in the unfiltered file
    assert run_pass(run, Fresh((Rows(),)), keep=keep_seq_ids([99])).consumers[0].seen == []


def test_chunks_hold_whole_sequences_and_b_counts_the_sequences_table(tmp_path):
    run = _run(tmp_path)
    merged = run_pass(run, Fresh((Chunks(),)), batch_rows=3)
    chunks = merged.consumers[0].seen
    assert [i for c in chunks for i in c] == [0, 1, 2, 3, 4]  # each sequence in exactly one chunk
    assert merged.sequences == 5 and merged.totals == Totals(5) and merged.error is None


def test_a_refused_row_stops_the_chunk_consumers_but_not_the_batch_consumers(tmp_path):
    """The report's scan must still see every row of a run whose metrics are refused (its checks name the bad
    values); the InputError is kept as a value and `strict` raises it."""
    lengths = np.array([4, 4, 4, 4])
    seq = np.repeat(np.arange(4), lengths)
    b = np.full(seq.size, -1.0)
    a = b.copy()
    a[9] = np.nan  # sequence 2, in the second file
    tokens = pd.DataFrame({"seq_id": seq, "pos": np.tile(np.arange(4), 4), "rollout_logprob": b,
                           "train_logprob": a})
    run = write_run(tmp_path / "bad", tokens, shard_tokens=8)
    merged = run_pass(run, Fresh((Rows(), MetricsAccumulator())))
    assert isinstance(merged.error, InputError) and "train_logprob" in str(merged.error)
    assert sum(len(ids) for _, _, ids in merged.consumers[0].seen) == seq.size
    with pytest.raises(InputError, match="train_logprob"):
        run_pass(run, Fresh((MetricsAccumulator(),)), strict=True)
    with pytest.raises(InputError, match="train_logprob"):
        rcdiag.compute_metrics(run)


def test_files_merge_in_file_order_whatever_order_they_finish_in(tmp_path):
    """The merge takes the parts in file order as the map yields them: a map that computes the files last to
    first (as threads or Ray tasks may finish) gives the same chunks in the same order."""
    run = _run(tmp_path, lengths=(3, 5, 2, 4, 6, 1, 7), shard_tokens=6)

    def backwards(fn, items):
        items = list(items)
        done = {i: fn(i) for i in reversed(items)}
        return (done[i] for i in items)

    want = run_pass(run, Fresh((Chunks(),)), map_files=map).consumers[0].seen
    assert run_pass(run, Fresh((Chunks(),)), map_files=backwards).consumers[0].seen == want
    assert [i for c in want for i in c] == list(range(7))
