"""The one streaming loop (rcdiag.store.batches): file order, row offsets counted before the keep-filter."""
from __future__ import annotations

import numpy as np
import pandas as pd

from rcdiag.store.batches import feed_batches, keep_seq_ids
from rcdiag.store.writer import write_run


def _run(tmp_path):
    lengths = np.array([3, 5, 2, 4, 6])
    seq = np.repeat(np.arange(lengths.size), lengths)
    pos = np.concatenate([np.arange(n) for n in lengths])
    tokens = pd.DataFrame({"seq_id": seq, "pos": pos, "rollout_logprob": -np.arange(seq.size, dtype=float)})
    return write_run(tmp_path / "r", tokens, shard_tokens=8)


def test_every_row_once_in_file_order(tmp_path):
    run = _run(tmp_path)
    seen = []
    feed_batches(run, ["seq_id", "rollout_logprob"], lambda b, f, r0: seen.append((f, r0, b.num_rows)), batch_size=3)
    assert [f for f, _, _ in seen] == sorted(f for f, _, _ in seen) and len(run.token_files) > 1
    assert sum(n for _, _, n in seen) == run.num_tokens
    for file in {f for f, _, _ in seen}:  # offsets restart at 0 in each file and are contiguous
        starts = [(r0, n) for f, r0, n in seen if f == file]
        assert [r0 for r0, _ in starts] == list(np.cumsum([0] + [n for _, n in starts])[:-1])


def test_keep_filter_drops_rows_but_offsets_count_the_file(tmp_path):
    run = _run(tmp_path)
    frame = run.tokens()
    rows = []

    def feed(batch, file, row0):
        rows.extend(zip(batch.column("seq_id").to_pylist(), batch.column("rollout_logprob").to_pylist(),
                        [row0] * batch.num_rows, strict=True))

    feed_batches(run, ["seq_id", "rollout_logprob"], feed, keep=keep_seq_ids([1, 4]), batch_size=4)
    expected = frame[frame["seq_id"].isin([1, 4])]
    assert [r[:2] for r in rows] == list(zip(expected["seq_id"], expected["rollout_logprob"], strict=True))
    assert all(r0 % 4 == 0 for _, _, r0 in rows)  # batch starts in the unfiltered file
    none = []
    feed_batches(run, ["seq_id"], lambda *a: none.append(a), keep=keep_seq_ids([99]))
    assert none == []
