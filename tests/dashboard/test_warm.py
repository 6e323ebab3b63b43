"""app.warm: after the Overview, the pages' first views are in the caches before the reader opens them."""
from __future__ import annotations

import threading

import pyarrow.parquet as pq
import pytest

from app import data, warm


def test_warming_fills_what_the_pages_open_with(noisy_run, monkeypatch):
    """The Sequences page's first sequence (its default order: data.SORT_KEYS' first, descending) and the
    simulator's sweep come from the caches afterwards: no Parquet read is left for the page to make."""
    ref = data.open_ref(noisy_run.path)
    warm.after_overview(*ref.key)
    for thread in [t for t in threading.enumerate() if t.name == "rcdiag-warm"]:
        thread.join(timeout=120)
    index = data.sequence_index(*ref.key)
    column = next(iter(data.SORT_KEYS.values()))
    first = int(index.sort_values([column, "seq_id"], ascending=[False, True])["seq_id"].iloc[0])

    def refuse(*args, **kwargs):
        raise AssertionError("read after warming")
    monkeypatch.setattr(pq, "read_table", refuse)
    row, tokens = data.sequence_detail(*ref.key, first)
    assert row["seq_id"] == first and len(tokens) == row["response_len"]
    with pytest.raises(AssertionError, match="read after warming"):  # the guard itself works
        data.sequence_detail(*ref.key, int(index["seq_id"].iloc[-1]) if first != int(index["seq_id"].iloc[-1])
                             else int(index["seq_id"].iloc[0]))
