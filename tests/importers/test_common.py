"""Shared importer machinery: flat tables from records (property-based), length patterns, id checks, atomicity."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rcdiag.errors import InputError
from rcdiag.importers.common import (
    Imported,
    Record,
    check_token_ids,
    length_pattern,
    sequence_table,
    token_table,
    write_imported,
)

lengths = st.lists(st.integers(0, 9), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(lengths, st.data())
def test_token_table_matches_records(sizes, data):
    """seq_id/pos/ids/values/mask land on the right row for any mix of lengths (including empty responses)."""
    records = []
    for n in sizes:
        ids = np.array(data.draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n)), np.int64)
        mask = np.array(data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
        records.append(Record(response_ids=ids, rollout_logprobs=-np.arange(n, dtype=np.float32) / 7,
                              mask=mask, prompt_ids=np.arange(n % 3)))
    table = token_table(records).to_pandas()
    seqs = sequence_table(records).to_pandas()
    assert table["seq_id"].tolist() == [i for i, n in enumerate(sizes) for _ in range(n)]
    assert table["pos"].tolist() == [p for n in sizes for p in range(n)]
    assert table["token_id"].tolist() == [int(x) for r in records for x in r.response_ids]
    assert table["mask"].tolist() == [bool(x) for r in records for x in r.mask]
    np.testing.assert_array_equal(table["rollout_logprob"].to_numpy(np.float32),
                                  np.concatenate([r.rollout_logprobs for r in records]))
    assert table["train_logprob"].isna().all()
    assert seqs["response_len"].tolist() == sizes and seqs["prompt_len"].tolist() == [n % 3 for n in sizes]


@pytest.mark.parametrize(("n", "m", "prompt", "expected"), [
    (5, 6, None, "+1 pattern"), (5, 4, None, "-1 pattern"), (5, 11, None, "2n+1 pattern"),
    (5, 12, 7, "cover prompt+response"), (5, 11, 7, "2n+1 pattern"), (5, 9, 5, "cover prompt+response"),
    (5, 20, 3, "no known pattern"), (0, 1, None, "+1 pattern"),
])
def test_length_patterns(n, m, prompt, expected):
    assert expected in length_pattern(n, m, prompt)


@pytest.mark.parametrize("bad", [-100, 2**31])
def test_token_ids_out_of_range(bad):
    records = [Record(response_ids=np.array([1, 2])), Record(response_ids=np.array([3, bad]), where=("f", 1))]
    with pytest.raises(InputError, match=f"f row 1 field 'token ids': token id {bad} at response position 1"):
        check_token_ids(records)


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    """A disk failure after the tokens file is written (simulated: a full disk cannot be caused here) leaves
    neither the run nor its temporary directory, and an existing run at --out is untouched."""
    import rcdiag.store.writer as runstore

    real = runstore.write_parquet_atomic
    calls = []

    def failing(table, path):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("No space left on device")
        real(table, path)

    records = [Record(response_ids=np.array([1, 2]), rollout_logprobs=np.zeros(2))]
    import pandas as pd

    old = runstore.write_run(tmp_path / "out", pd.DataFrame({"seq_id": [0], "pos": [0], "rollout_logprob": [-1.0]}))
    before = {p.name: p.read_bytes() for p in old.path.rglob("*") if p.is_file()}  # --overwrite replaces only a run
    monkeypatch.setattr(runstore, "write_parquet_atomic", failing)
    with pytest.raises(OSError, match="No space"):
        write_imported(Imported("jsonl", tmp_path / "src", records), tmp_path / "out", overwrite=True)
    assert len(calls) == 2 and "importing" in str(calls[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()} == before
