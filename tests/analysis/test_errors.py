"""Rows count from 1. Bad input is an InputError (a ValueError) naming file, row and column — on every path (DataFrame, Arrow, Run
files, metrics, simulate, sweep, sequence_stats) — never silently masked."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rcdiag
from rcdiag.errors import ConfigError, InputError
from tests.analysis.helpers import make_tokens

ENTRY_POINTS = {
    "compute_metrics": lambda d: rcdiag.compute_metrics(d),
    "simulate": lambda d: rcdiag.simulate(d, "sequence_mask"),
    "sweep": lambda d: rcdiag.sweep(d, thresholds=(2.0,)),
    "sequence_stats": lambda d: rcdiag.sequence_stats(d),
}


def clean() -> pd.DataFrame:
    return make_tokens(11, n_seq=40, max_len=12, min_len=3, mask_p=0.0).drop(columns="token_id")


def _expect(data, *, field: str, row: int | None, file: str = "tokens", match: str = "") -> None:
    for name, call in ENTRY_POINTS.items():
        with pytest.raises(InputError, match=match) as info:
            call(data)
        error = info.value
        assert isinstance(error, ValueError)
        assert (error.file, error.row, error.field) == (file, row, field), (name, str(error))
        text = str(error)
        assert field in text and file in text and (row is None or f"row {row}" in text), text


@pytest.mark.parametrize("column", ["train_logprob", "rollout_logprob"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_on_valid_position(column, value):
    tokens = clean()
    tokens.loc[57, column] = value
    _expect(tokens, field=column, row=58, match="valid position")


def test_null_logprob_in_arrow_table():
    tokens = clean()
    table = pa.Table.from_pandas(tokens, preserve_index=False)
    values = table.column("train_logprob").to_pylist()
    values[23] = None
    table = table.set_column(table.schema.get_field_index("train_logprob"), "train_logprob",
                             pa.array(values, pa.float32()))
    _expect(table, field="train_logprob", row=24, match="missing")


def test_non_finite_on_masked_position_is_ignored():
    tokens = clean()
    tokens.loc[57, "train_logprob"] = np.nan
    tokens.loc[57, "mask"] = False
    assert rcdiag.compute_metrics(tokens)["tokens"] == len(tokens) - 1


@pytest.mark.parametrize("column", ["seq_id", "pos", "rollout_logprob", "train_logprob"])
def test_missing_column(column):
    _expect(clean().drop(columns=column), field=column, row=None, match="missing required column")


@pytest.mark.parametrize("column, dtype", [("seq_id", "float64"), ("pos", "float32"),
                                           ("train_logprob", "str"), ("rollout_logprob", "str")])
def test_wrong_dtype(column, dtype):
    tokens = clean()
    tokens[column] = tokens[column].astype(dtype)
    _expect(tokens, field=column, row=None, match="wrong dtype")


def test_negative_position():
    tokens = clean()
    tokens.loc[31, "pos"] = -1
    _expect(tokens, field="pos", row=32, match="negative position")


def test_unsorted_and_duplicated_keys():
    tokens = clean()
    order = np.arange(len(tokens))
    order[[40, 41]] = [41, 40]
    swapped = tokens.iloc[order].reset_index(drop=True)
    _expect(swapped, field="seq_id/pos", row=42, match="unsorted")
    duplicated = tokens.copy()
    duplicated.loc[12, "seq_id"] = duplicated.loc[11, "seq_id"]
    duplicated.loc[12, "pos"] = duplicated.loc[11, "pos"]
    _expect(duplicated, field="seq_id/pos", row=13, match="duplicated")


def test_error_in_a_run_file_names_the_file_and_its_row(tmp_path):
    """Corrupt one shard of a real multi-file run: the message names `tokens/part-00003.parquet`, the row within
    that file, the column, and suggests the fix."""
    run = rcdiag.write_run(tmp_path / "run", clean(), shard_tokens=40)
    target = run.path / "tokens" / "part-00003.parquet"
    table = pq.read_table(target)
    values = table.column("rollout_logprob").to_numpy().copy()
    values[5] = -np.inf
    pq.write_table(table.set_column(table.schema.get_field_index("rollout_logprob"), "rollout_logprob",
                                    pa.array(values)), target)
    _expect(rcdiag.open_run(run.path), field="rollout_logprob", row=6, file="tokens/part-00003.parquet",
            match="processed log-probs")


def test_unsorted_across_files_and_null_keys(tmp_path):
    run = rcdiag.write_run(tmp_path / "run", clean(), shard_tokens=40)
    target = run.path / "tokens" / "part-00002.parquet"
    table = pq.read_table(target)
    seq = table.column("seq_id").to_numpy().copy()
    seq[:] = pq.read_table(run.path / "tokens" / "part-00000.parquet").column("seq_id")[0].as_py()
    # ^ a seq_id that exists (an unknown one is refused when the run is opened), behind part-00001's sequences
    pq.write_table(table.set_column(0, "seq_id", pa.array(seq)), target)
    with pytest.raises(InputError, match="unsorted") as info:
        rcdiag.compute_metrics(rcdiag.open_run(run.path))
    assert info.value.file == "tokens/part-00002.parquet" and info.value.row == 1
    tokens = pa.Table.from_pandas(clean(), preserve_index=False)
    ids = tokens.column("seq_id").to_pylist()
    ids[9] = None
    _expect(tokens.set_column(0, "seq_id", pa.array(ids, pa.int64())), field="seq_id", row=10, match="null key")


@pytest.mark.parametrize("call, match", [
    (lambda d: rcdiag.simulate(d, "token_clip"), "unknown correction mode 'token_clip'"),
    (lambda d: rcdiag.compute_metrics(d, "slime"), "unknown convention 'slime'"),
    (lambda d: rcdiag.simulate(d, "token_mask", 0.5), "threshold C must be a number ≥ 1"),
    (lambda d: rcdiag.simulate(d, "token_mask", 2.0, lower=1.5), r"lower bound L must be in \(0, 1\]"),
    (lambda d: rcdiag.simulate(d, "token_mask", 2.0, lower=0.5, convention="swift"), "swift has no lower bound"),
    (lambda d: rcdiag.simulate(d, "token_truncate", 2.0, lower=0.5, convention="verl"), "verl has no lower"),
    (lambda d: rcdiag.simulate(d, "token_mask", rejection=["token_k9:1"]), "unknown rejection option"),
    (lambda d: rcdiag.simulate(d, "token_mask", rejection=["token_k3"]), "cannot read rejection option"),
    (lambda d: rcdiag.sweep(d, thresholds=(float("nan"),)), "threshold C"),
])
def test_bad_options_are_config_errors(call, match):
    """Options are validated once, before any data is read, with the choices in the message."""
    with pytest.raises(ConfigError, match=match):
        call(clean())
