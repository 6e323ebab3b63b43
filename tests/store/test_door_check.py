"""The door check's footer shortcut (store.validate.ids_all_known): a token file whose seq_id range the sequences
table covers is not read, and every other layout still is — an orphan seq_id is found whether the footer has
statistics or not, in the middle of a range as at its end."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rcdiag.errors import InputError
from rcdiag.store.run import open_run
from rcdiag.store.validate import ids_all_known
from rcdiag.store.writer import write_run


def _file(tmp_path, ids, **options) -> pq.ParquetFile:
    path = tmp_path / f"ids-{len(list(tmp_path.iterdir()))}.parquet"
    pq.write_table(pa.table({"seq_id": pa.array(ids, pa.int64())}), path, **options)
    return pq.ParquetFile(path)


@pytest.mark.parametrize(("ids", "known", "expected"), [
    ([0, 0, 1, 2, 2, 2], [0, 1, 2], True),                  # contiguous and covered
    ([5, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], True),   # a slice of a larger table
    ([0, 2], [0, 2], False),                                 # a gap in the range: read to tell
    ([0, 1, 3], [0, 1, 3, 4], False),                       # 2 is missing from known
    ([3, 1, 2], [1, 2, 3], True),                           # unsorted rows: the range is what counts
    ([0, 1], [], False),                                    # nothing known
])
def test_footer_shortcut_holds_only_when_the_range_is_covered(tmp_path, ids, known, expected):
    assert ids_all_known(_file(tmp_path, ids), np.array(known, np.int64)) is expected


def test_footer_without_statistics_or_in_several_row_groups(tmp_path):
    known = np.arange(10, dtype=np.int64)
    assert ids_all_known(_file(tmp_path, list(range(10)), write_statistics=False), known) is False
    assert ids_all_known(_file(tmp_path, list(range(10)), row_group_size=3), known) is True
    assert ids_all_known(_file(tmp_path, [0, 1, 2, 9], row_group_size=2), known) is True
    assert ids_all_known(_file(tmp_path, [0, 1, 2, 11], row_group_size=2), known) is False
    assert ids_all_known(_file(tmp_path, []), known) is True


def _run(tmp_path, token_ids, sequence_ids):
    tokens = pd.DataFrame({"seq_id": token_ids, "pos": [0] * len(token_ids),
                           "rollout_logprob": [-0.5] * len(token_ids), "train_logprob": [-0.5] * len(token_ids)})
    tokens["pos"] = tokens.groupby("seq_id").cumcount()
    run = write_run(tmp_path / "run", tokens)
    seq_file = run.path / "sequences" / "part-00000.parquet"
    table = pq.read_table(seq_file)
    keep = pa.array(np.isin(np.asarray(table["seq_id"]), sequence_ids))
    return run.path, seq_file, table.filter(keep)


@pytest.mark.parametrize("statistics", [True, False])
def test_an_orphan_in_the_middle_of_the_range_is_still_found(tmp_path, statistics):
    path, seq_file, table = _run(tmp_path, [0, 0, 1, 2, 2, 3], [0, 1, 3])
    pq.write_table(table, seq_file)
    tokens = path / "tokens" / "part-00000.parquet"
    pq.write_table(pq.read_table(tokens), tokens, write_statistics=statistics)
    with pytest.raises(InputError, match="seq_id 2 has token rows but no row in sequences/") as info:
        open_run(path)
    assert "row 4" in str(info.value)


def test_a_covered_run_opens(tmp_path):
    path, _, _ = _run(tmp_path, [0, 0, 1, 2, 2, 3], [0, 1, 2, 3])
    assert open_run(path).num_tokens == 6


def test_a_nested_column_before_seq_id_reads_the_column(tmp_path):
    """Arrow's field index is not the Parquet leaf index once a struct of two fields comes first: no shortcut
    then (the leaf at Arrow's index is the struct's second field, whose statistics say nothing of seq_id)."""
    path = tmp_path / "nested.parquet"
    pq.write_table(pa.table({"s": pa.array([{"a": 0, "b": 7}, {"a": 1, "b": 9}]),
                             "seq_id": pa.array([0, 5], pa.int64())}), path)
    assert ids_all_known(pq.ParquetFile(path), np.arange(10, dtype=np.int64)) is False
    listed = tmp_path / "listed.parquet"  # a list column has one leaf: the indices agree and the footer is read
    pq.write_table(pa.table({"ids": pa.array([[1, 2], [3]], pa.list_(pa.int64())),
                             "seq_id": pa.array([0, 1], pa.int64())}), listed)
    assert ids_all_known(pq.ParquetFile(listed), np.array([0, 1], np.int64)) is True


def test_a_null_seq_id_behind_a_struct_column_is_found(tmp_path):
    """The null check reads the footer of the leaf named seq_id, not of the struct's field at Arrow's index."""
    path, _, _ = _run(tmp_path, [0, 0, 1], [0, 1])
    tokens = path / "tokens" / "part-00000.parquet"
    table = pq.read_table(tokens)
    table = table.set_column(table.schema.get_field_index("seq_id"), "seq_id", pa.array([0, None, 1], pa.int64()))
    struct = pa.array([{"a": 0, "b": 1}] * 3)
    pq.write_table(pa.Table.from_arrays([struct, *table.columns], names=["s", *table.column_names]), tokens)
    with pytest.raises(InputError, match="is null"):
        open_run(path)
