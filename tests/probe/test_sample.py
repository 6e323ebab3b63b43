"""`probe.sample_tokens` reads only the sampled sequences (Parquet filters) and draws exactly what the former
whole-table read drew: same sequences, same token rows, same pairs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rcdiag.probe.run import ROLLOUT, sample_tokens
from rcdiag.score.rescore import shard_pairs
from rcdiag.store.writer import write_run
from tests.fixtures.runs import defect_frames


def _reference(run, n, seed):
    """The former implementation: the whole token and sequences tables, filtered in memory."""
    sequences = run.sequence_table(["seq_id", "prompt_token_ids", "response_len"])
    tokens = run.token_table(["seq_id", "pos", "token_id", "rollout_logprob", "mask"])
    counts = pd.Series(np.asarray(tokens.column("seq_id"))).value_counts()
    candidates = np.array(sorted(counts.index), dtype=np.int64)
    chosen = np.sort(np.random.default_rng(seed).choice(candidates, size=min(n, candidates.size), replace=False))
    sequences = sequences.filter(pc.is_in(sequences.column("seq_id"), pa.array(chosen)))
    tokens = tokens.filter(pc.is_in(tokens.column("seq_id"), pa.array(chosen)))
    pairs = shard_pairs(tokens, sequences, source="tokens", vocab_size=10**6, max_context=None)
    return tokens.to_pandas().rename(columns={"rollout_logprob": ROLLOUT}), pairs


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tokens, sequences = defect_frames("clean", n_seq=80)
    sequences["prompt_token_ids"] = [list(range(1, 2 + i % 5)) for i in range(len(sequences))]
    extra = pd.DataFrame({"seq_id": [1000], "prompt_token_ids": [[1, 2]], "response_len": [0]})  # no tokens
    sequences = pd.concat([sequences, extra], ignore_index=True)
    return write_run(tmp_path_factory.mktemp("sample") / "r", tokens, sequences, shard_tokens=300)


@pytest.mark.parametrize(("n", "seed"), [(5, 0), (17, 3), (500, 1)])
def test_same_draw_as_the_whole_table_read(run, n, seed):
    assert len(run.token_files) > 3
    frame, pairs = sample_tokens(run, n, seed, vocab_size=10**6, max_context=None)
    ref_frame, ref_pairs = _reference(run, n, seed)
    pd.testing.assert_frame_equal(frame, ref_frame)
    assert len(pairs) == len(ref_pairs) == min(n, 80) and 1000 not in set(frame["seq_id"])
    for (p, r), (rp, rr) in zip(pairs, ref_pairs, strict=True):
        assert np.array_equal(p, rp) and np.array_equal(r, rr)


def test_filtered_read_returns_only_the_asked_rows(run):
    wanted = np.array([3, 40, 79, 1000])
    tokens = run.token_table(["seq_id", "pos"], seq_ids=wanted)
    assert set(np.asarray(tokens.column("seq_id"))) == {3, 40, 79}
    all_tokens = run.tokens(["seq_id", "pos"])
    assert tokens.num_rows == all_tokens["seq_id"].isin(wanted).sum()
    assert list(np.asarray(run.sequence_table(["seq_id"], seq_ids=wanted).column(0))) == [3, 40, 79, 1000]
    assert run.token_table(["seq_id"], seq_ids=[]).num_rows == 0
