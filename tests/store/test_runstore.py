"""Run directory contract: write_run/open_run round trips, shards, resumable writer, clear errors."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rcdiag
from rcdiag.errors import InputError, RunDirError
from rcdiag.store.files import MANIFEST_NAME, PENDING_NAME
from rcdiag.store.schema import SEQUENCE_SCHEMA, TOKEN_SCHEMA
from rcdiag.store.writer import RunWriter, prepare_sequences, prepare_tokens, split_into_shards, write_run


def random_tokens(rng: np.random.Generator, n_seq: int, max_len: int = 12, empty_every: int = 5) -> pd.DataFrame:
    rows = []
    for s in range(n_seq):
        length = 0 if s % empty_every == 0 else int(rng.integers(1, max_len))
        for p in range(length):
            b = float(-rng.exponential(1.0))
            rows.append((s, p, int(rng.integers(0, 100)), b, b + float(rng.normal(0, 0.01)),
                         float(rng.uniform(0, 3)), bool(rng.random() > 0.1)))
    return pd.DataFrame(rows, columns=TOKEN_SCHEMA.names)


def test_round_trip_keeps_every_value_and_sequence_without_tokens(tmp_path):
    rng = np.random.default_rng(0)
    tokens = random_tokens(rng, 40)
    sequences = pd.DataFrame({"seq_id": np.arange(40), "finish_reason": ["stop"] * 39 + ["length"]})
    run = write_run(tmp_path / "run", tokens, sequences, shard_tokens=50)

    back = run.tokens()
    assert list(back.columns) == TOKEN_SCHEMA.names
    for column in TOKEN_SCHEMA.names:
        expected = tokens[column].to_numpy()
        if column in ("rollout_logprob", "train_logprob", "train_entropy"):
            expected = expected.astype(np.float32)
        np.testing.assert_array_equal(back[column].to_numpy(), expected, err_msg=column)
    seqs = run.sequences()
    assert list(seqs.columns) == SEQUENCE_SCHEMA.names
    assert seqs["seq_id"].tolist() == list(range(40))
    counts = tokens.groupby("seq_id").size().reindex(range(40), fill_value=0)
    assert seqs["response_len"].tolist() == counts.tolist()
    assert seqs.loc[39, "finish_reason"] == "length"
    assert run.manifest["counts"] == {"sequences": 40, "tokens": len(tokens), "shards": len(run.token_files)}
    assert len(run.token_files) > 1


def test_sequence_never_spans_shards_and_shards_pair_up(tmp_path):
    rng = np.random.default_rng(1)
    tokens = random_tokens(rng, 60, max_len=30)
    run = write_run(tmp_path / "run", tokens, shard_tokens=37)
    seen: set[int] = set()
    for index, tok, seq in run.shards():
        tok_ids = set(tok.column("seq_id").to_pylist())
        assert tok_ids <= set(seq.column("seq_id").to_pylist()), f"shard {index}"
        assert not (tok_ids & seen), f"shard {index} repeats a sequence"
        seen |= tok_ids
    assert seen == set(tokens["seq_id"])


def test_sequence_longer_than_shard_gets_its_own_shard():
    tokens = prepare_tokens(pd.DataFrame({"seq_id": [0] * 10 + [1] * 2, "pos": list(range(10)) + [0, 1],
                                          "rollout_logprob": -1.0}))
    sequences = prepare_sequences(None, tokens)
    shards = list(split_into_shards(tokens, sequences, shard_tokens=3))
    assert [t.num_rows for t, _ in shards] == [10, 2]
    assert [s.num_rows for _, s in shards] == [1, 1]


def test_optional_columns_default_to_null_and_mask_true(tmp_path):
    run = write_run(tmp_path / "r", pd.DataFrame({"seq_id": [3, 3], "pos": [0, 1], "rollout_logprob": [-1, -2]}))
    df = run.tokens()
    assert df["mask"].tolist() == [True, True]
    assert df["train_logprob"].isna().all() and df["token_id"].isna().all()


def test_unsorted_input_is_sorted_and_duplicates_rejected(tmp_path):
    tokens = pd.DataFrame({"seq_id": [1, 0, 0], "pos": [0, 1, 0], "rollout_logprob": [-1.0, -2.0, -3.0]})
    run = write_run(tmp_path / "r", tokens)
    assert run.tokens()[["seq_id", "pos"]].values.tolist() == [[0, 0], [0, 1], [1, 0]]
    dup = pd.DataFrame({"seq_id": [0, 0], "pos": [1, 1], "rollout_logprob": [-1.0, -2.0]})
    with pytest.raises(InputError, match=r"row 2.*duplicated \(seq_id, pos\)"):
        write_run(tmp_path / "d", dup)
    assert not (tmp_path / "d" / MANIFEST_NAME).exists()


@pytest.mark.parametrize(("frame", "pattern"), [
    ({"seq_id": [0], "pos": [0]}, "missing required column 'rollout_logprob'"),
    ({"seq_id": [0.5], "pos": [0], "rollout_logprob": [-1.0]}, "field 'seq_id'.*must be an integer"),
    ({"seq_id": [0], "pos": [-1], "rollout_logprob": [-1.0]}, "row 1 field 'pos'.*negative position"),
    ({"seq_id": [0], "pos": [0], "rollout_logprob": ["x"]}, "field 'rollout_logprob'.*numeric"),
])
def test_bad_token_frames_name_the_field(tmp_path, frame, pattern):
    with pytest.raises(InputError, match=pattern):
        write_run(tmp_path / "bad", pd.DataFrame(frame))


def test_sequences_must_cover_token_ids(tmp_path):
    tokens = pd.DataFrame({"seq_id": [0, 5], "pos": [0, 0], "rollout_logprob": [-1.0, -1.0]})
    with pytest.raises(InputError, match="seq_id 5 which is not in the sequences table"):
        write_run(tmp_path / "r", tokens, pd.DataFrame({"seq_id": [0]}))
    with pytest.raises(InputError, match="seq_id 0 appears more than once"):
        write_run(tmp_path / "r2", tokens, pd.DataFrame({"seq_id": [0, 0, 5]}))


def test_open_run_errors_are_clear(tmp_path):
    with pytest.raises(RunDirError, match="no such run directory"):
        rcdiag.open_run(tmp_path / "nope")
    (tmp_path / "half").mkdir()
    with pytest.raises(RunDirError, match="not a complete run directory"):
        rcdiag.open_run(tmp_path / "half")
    (tmp_path / "future").mkdir()
    (tmp_path / "future" / MANIFEST_NAME).write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(RunDirError, match="schema_version 99 is not supported"):
        rcdiag.open_run(tmp_path / "future")


def test_corrupt_parquet_is_reported_with_its_path(tmp_path):
    run = write_run(tmp_path / "r", pd.DataFrame({"seq_id": [0], "pos": [0], "rollout_logprob": [-1.0]}))
    run.token_files[0].write_bytes(b"not parquet")
    with pytest.raises(RunDirError, match=r"part-00000\.parquet: unreadable Parquet"):
        run.tokens()


def test_writer_resumes_with_same_spec_and_refuses_a_different_one(tmp_path):
    path = tmp_path / "run"
    tokens = prepare_tokens(pd.DataFrame({"seq_id": [0, 1], "pos": [0, 0], "rollout_logprob": [-1.0, -2.0]}))
    sequences = prepare_sequences(None, tokens)
    writer = RunWriter(path, spec={"temperature": 0.7})
    writer.write_shard(0, tokens.slice(0, 1), sequences.slice(0, 1))
    (path / "tokens" / ".part-00001.parquet.tmp").write_bytes(b"partial")  # a killed write

    resumed = RunWriter(path, spec={"temperature": 0.7})
    assert resumed.complete_shards() == [0]
    assert not list(path.glob("*/.*.tmp"))
    with pytest.raises(RunDirError, match=r"different settings \(temperature: 0.7 → 1.0\).*--overwrite"):
        RunWriter(path, spec={"temperature": 1.0})

    resumed.write_shard(1, tokens.slice(1, 1), sequences.slice(1, 1))
    manifest = resumed.finish({"schema_version": 1})
    assert manifest["counts"] == {"sequences": 2, "tokens": 2, "shards": 2}
    assert not (path / PENDING_NAME).exists()
    assert rcdiag.open_run(path).tokens()["rollout_logprob"].tolist() == [-1.0, -2.0]

    fresh = RunWriter(path, spec={"temperature": 1.0}, overwrite=True)
    assert fresh.complete_shards() == []


def test_iter_batches_streams_per_file_with_requested_columns(tmp_path):
    rng = np.random.default_rng(2)
    tokens = random_tokens(rng, 30)
    run = write_run(tmp_path / "r", tokens, shard_tokens=40)
    pieces = list(run.iter_batches(["seq_id", "rollout_logprob"], batch_size=16))
    assert all(batch.schema.names == ["seq_id", "rollout_logprob"] for _, batch in pieces)
    assert all(batch.num_rows <= 16 for _, batch in pieces)
    assert {name for name, _ in pieces} == {f"tokens/{f.name}" for f in run.token_files}
    joined = np.concatenate([batch.column("rollout_logprob").to_numpy() for _, batch in pieces])
    np.testing.assert_array_equal(joined, tokens["rollout_logprob"].to_numpy(np.float32))
    with pytest.raises(RunDirError, match="missing column"):
        next(run.iter_batches(["nope"]))


def test_files_are_zstd_parquet_with_the_declared_schema(tmp_path):
    run = write_run(tmp_path / "r", pd.DataFrame({"seq_id": [0], "pos": [0], "rollout_logprob": [-1.0]}))
    meta = pq.ParquetFile(run.token_files[0])
    assert meta.schema_arrow.equals(TOKEN_SCHEMA)
    assert meta.metadata.row_group(0).column(0).compression == "ZSTD"


def test_write_run_refuses_a_non_empty_directory_unless_overwrite(tmp_path):
    big = pd.DataFrame({"seq_id": range(10), "pos": 0, "rollout_logprob": -1.0})
    write_run(tmp_path / "r", big, shard_tokens=2)
    small = pd.DataFrame({"seq_id": [0], "pos": [0], "rollout_logprob": [-5.0]})
    with pytest.raises(RunDirError, match="exists and is not empty; pass overwrite=True"):
        write_run(tmp_path / "r", small)
    run = write_run(tmp_path / "r", small, overwrite=True)
    assert run.tokens()["rollout_logprob"].tolist() == [-5.0]  # no stale shards of the bigger run
    assert run.manifest["counts"]["shards"] == 1


def test_pandas_round_trip_of_a_read_run(tmp_path):
    """pandas reads integer columns with nulls (step, token_id) as float; writing them back must work."""
    tokens = pd.DataFrame({"seq_id": [0, 0, 1], "pos": [0, 1, 0], "rollout_logprob": [-1.0, -2.0, -3.0]})
    run = write_run(tmp_path / "a", tokens, pd.DataFrame({"seq_id": [0, 1], "step": [None, 3]}))
    again = write_run(tmp_path / "b", run.tokens(), run.sequences())
    assert again.sequences()["step"].tolist()[1] == 3
    assert again.tokens()["rollout_logprob"].tolist() == [-1.0, -2.0, -3.0]
    with pytest.raises(InputError, match="field 'step'.*must be an integer"):
        write_run(tmp_path / "c", tokens, pd.DataFrame({"seq_id": [0, 1], "step": [0.5, 1.0]}))


def test_is_member_against_a_set_reference():
    from rcdiag.store.validate import is_member

    rng = np.random.default_rng(3)
    for _ in range(200):
        known = np.unique(rng.integers(-5, 40, rng.integers(0, 30)))
        values = rng.integers(-8, 45, rng.integers(0, 60))  # unsorted, repeated, beyond both ends
        assert is_member(known, values).tolist() == [v in set(known.tolist()) for v in values.tolist()]


def test_reopen_reads_a_stage_s_rewrite_without_a_second_door_check(tmp_path, monkeypatch):
    """`rcdiag score --rescore-both`: the replay rewrites the engine section, rescoring reads it through
    Run.reopen() — the new manifest, and the door check (every file's seq_id column) not repeated."""
    import rcdiag.store.run as store_run
    from rcdiag.store.manifest import update_manifest

    run = write_run(tmp_path / "r", pd.DataFrame({"seq_id": [0, 1], "pos": [0, 0], "rollout_logprob": [-1.0, -2.0]}))
    checks = []
    real = store_run.validate_run
    monkeypatch.setattr(store_run, "validate_run", lambda *a: checks.append(a) or real(*a))
    opened = rcdiag.open_run(run.path)
    update_manifest(run.path, {"engine": {"name": "vllm", "temperature": 0.7, "replayed": True}})
    again = opened.reopen()
    assert len(checks) == 1 and opened.info.engine is None
    assert again.info.engine.temperature == 0.7 and again.info.measured.rollout == "prefill_replay"
    assert again.token_files == opened.token_files and again.changed() is None


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 65_536, 100_003])
def test_mask_bitmap_unpacks_like_arrow_at_every_offset(n):
    """store.schema.bool_values (numpy's unpackbits of the bitmap) against Arrow's own conversion: slices at odd
    bit offsets, chunked columns, nulls filled as valid, a mask stored as integers."""
    from rcdiag.store.schema import bool_values, mask_as_bool

    rng = np.random.default_rng(n)
    values = rng.random(n + 21) < 0.7
    whole = pa.array(values)
    for offset in (0, 1, 3, 8, 13):
        part = whole.slice(offset, n)
        assert np.array_equal(bool_values(part), values[offset:offset + n])
        assert bool_values(part).dtype == np.bool_
    chunked = pa.chunked_array([whole.slice(0, 5), whole.slice(5 + 3, n)])
    assert np.array_equal(bool_values(chunked), np.asarray(chunked, dtype=bool))
    nulls = [None if i % 5 == 0 else bool(v) for i, v in enumerate(values[:n])]
    batch = pa.record_batch({"mask": pa.array(nulls, pa.bool_())})
    assert np.array_equal(mask_as_bool(batch), [True if v is None else v for v in nulls])
    ints = pa.record_batch({"mask": pa.array(values[:n].astype(np.int8) * 3, pa.int8())})
    assert np.array_equal(mask_as_bool(ints), values[:n])
