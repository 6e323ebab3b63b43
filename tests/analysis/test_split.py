"""The same numbers however the token rows are split: 1, 2 or 97 batches (sequences cut mid-way), accumulators
merged per file, and multi-shard Parquet runs (docs/metrics.md, 'Numerical rules': 1e-12 relative / 1e-14 absolute)."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rcdiag
from rcdiag.analysis.correction.modes import MODES, ISAccumulator
from rcdiag.analysis.metrics.compute import MetricsAccumulator
from rcdiag.analysis.passes.accum import Totals
from rcdiag.analysis.passes.chunks import iter_chunks
from tests.analysis.helpers import CONVENTIONS, assert_close, make_tokens, split_frame

SPLIT_REL, SPLIT_ABS = 1e-12, 1e-14


def _tokens():
    """~3k rows with long and empty sequences, |ℓ| > 20 outliers, masked NaN rows and cancelling ℓ."""
    return make_tokens(7, n_seq=300, max_len=20, scale=0.3, mask_p=0.1, big_p=0.02, zero_p=0.05)


def _metrics_by_batches(tokens, pieces: int, convention: str) -> dict:
    acc = MetricsAccumulator(convention)
    for part in split_frame(tokens, pieces, seed=pieces):
        acc.update(part)
    return acc.finish()


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("pieces", [2, 97])
def test_metrics_batch_split_invariant(convention, pieces):
    """Guards per-batch means and per-sequence sums restarted at a batch boundary."""
    tokens = _tokens()
    whole = rcdiag.compute_metrics(tokens, convention)
    assert whole["tokens"] > 2000 and math.isfinite(whole["kl"])
    split = _metrics_by_batches(tokens, pieces, convention)
    assert_close(split, whole, rel=SPLIT_REL, abs_tol=SPLIT_ABS, what=f"[{convention} {pieces} batches]")


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_merge_of_per_file_accumulators(convention):
    """Accumulators over disjoint row ranges (whole sequences, as files are) merge to the whole-data result."""
    tokens = _tokens()
    whole = rcdiag.compute_metrics(tokens, convention)
    seq = tokens["seq_id"].to_numpy()
    cuts = [0, int(np.searchsorted(seq, seq[len(seq) // 3])), int(np.searchsorted(seq, seq[2 * len(seq) // 3])),
            len(seq)]
    parts = []
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        acc = MetricsAccumulator(convention)
        acc.update(tokens.iloc[lo:hi])
        parts.append(acc)
    merged = parts[2].merge(parts[0]).merge(parts[1])  # order of merging must not matter
    assert_close(merged.finish(), whole, rel=SPLIT_REL, abs_tol=SPLIT_ABS, what=f"[{convention} merged]")


def test_merge_refuses_overlapping_sequences():
    tokens = _tokens()
    a, b = MetricsAccumulator(), MetricsAccumulator()
    a.update(tokens.iloc[:100])
    b.update(tokens.iloc[50:150].assign(pos=tokens.iloc[50:150]["pos"]))
    with pytest.raises(ValueError, match="overlap"):
        a.merge(b)


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("batch_rows", [1, 2, 97])
def test_sweep_batch_rows_invariant(convention, batch_rows):
    """All IS metrics, every mode and threshold, for reader batch sizes 1, 2 and 97 rows."""
    tokens = _tokens()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        whole = rcdiag.sweep(tokens, convention=convention)
        split = rcdiag.sweep(tokens, convention=convention, batch_rows=batch_rows)
    for a, b in zip(split.to_dict("records"), whole.to_dict("records"), strict=True):
        assert_close(a, {k: v for k, v in b.items() if k != "mode"}, rel=SPLIT_REL, abs_tol=SPLIT_ABS,
                     what=f"[{convention} {b['mode']} C={b['threshold']} batch_rows={batch_rows}]")


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_multi_shard_run_equals_dataframe(tmp_path, convention):
    """A run written in many small Parquet shards (read file by file, batch by batch) gives the DataFrame's
    numbers; B comes from the sequences table, so sequences with no token rows are counted."""
    tokens = _tokens()
    universe = np.sort(np.concatenate([tokens["seq_id"].unique(), [10_000, 10_001]]))
    seq_frame = pd.DataFrame({"seq_id": universe})
    run = rcdiag.write_run(tmp_path / "run", tokens, sequences=seq_frame, shard_tokens=50)
    assert len(run.token_files) > 20
    want = rcdiag.compute_metrics(tokens, convention, sequences=seq_frame)
    got = rcdiag.compute_metrics(run, convention)
    assert got["sequences"] == len(universe) and got["empty_sequences"] >= 2
    assert_close(got, want, rel=SPLIT_REL, abs_tol=SPLIT_ABS, what=f"[{convention} run vs frame]")
    small = rcdiag.compute_metrics(run, convention, batch_rows=7)
    assert_close(small, want, rel=SPLIT_REL, abs_tol=SPLIT_ABS, what=f"[{convention} run, 7-row batches]")
    for mode in MODES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            a = rcdiag.simulate(run, mode, 1.5, convention=convention)
            b = rcdiag.simulate(tokens, mode, 1.5, convention=convention, sequences=seq_frame)
        assert_close(a, b, rel=SPLIT_REL, abs_tol=SPLIT_ABS, what=f"[{convention} {mode} run vs frame]")


def test_chunks_hold_whole_sequences():
    """The chunker never cuts a sequence, whatever the batch size (the basis of the invariance above)."""
    tokens = _tokens()
    seen = []
    for chunk in iter_chunks(tokens, batch_rows=3):
        seen.extend(chunk.seq_ids.tolist())
    assert seen == sorted(set(tokens["seq_id"].tolist()))


def test_is_accumulator_merge():
    tokens = _tokens()
    grid = [m.with_bounds(c) for m in MODES.values() for c in (1.25, 3.0)]
    whole = ISAccumulator(grid)
    first, second = ISAccumulator(grid), ISAccumulator(grid)
    half = int(np.searchsorted(tokens["seq_id"].to_numpy(), tokens["seq_id"].iloc[len(tokens) // 2]))
    for chunk in iter_chunks(tokens):
        whole.update_chunk(chunk)
    for chunk in iter_chunks(tokens.iloc[:half]):
        first.update_chunk(chunk)
    for chunk in iter_chunks(tokens.iloc[half:]):
        second.update_chunk(chunk)
    rows = tokens["seq_id"].nunique()
    for a, b in zip(first.merge(second).finish(Totals(rows)), whole.finish(Totals(rows)), strict=True):
        assert_close(a, b, rel=SPLIT_REL, abs_tol=SPLIT_ABS, what="[IS merge]")


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_seq=st.integers(1, 60), max_len=st.integers(0, 30),
       scale=st.sampled_from([1e-7, 0.3, 5.0]), mask_p=st.sampled_from([0.0, 0.3]),
       pieces=st.sampled_from([2, 3, 97]), convention=st.sampled_from(CONVENTIONS))
def test_random_splits_give_identical_numbers(seed, n_seq, max_len, scale, mask_p, pieces, convention):
    """Random data and random cut points: metrics through update(batch) and IS metrics through small reader
    batches equal the one-batch values."""
    tokens = make_tokens(seed, n_seq=n_seq, max_len=max_len, scale=scale, mask_p=mask_p, big_p=0.05)
    whole = rcdiag.compute_metrics(tokens, convention)
    assert_close(_metrics_by_batches(tokens, pieces, convention), whole, rel=SPLIT_REL, abs_tol=SPLIT_ABS,
                 what=f"[{convention} {pieces} batches]")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        one = rcdiag.sweep(tokens, thresholds=(1.1, 3.0), convention=convention)
        many = rcdiag.sweep(tokens, thresholds=(1.1, 3.0), convention=convention, batch_rows=pieces)
    for a, b in zip(many.to_dict("records"), one.to_dict("records"), strict=True):
        assert_close(a, {k: v for k, v in b.items() if k != "mode"}, rel=SPLIT_REL, abs_tol=SPLIT_ABS,
                     what=f"[{convention} {b['mode']} C={b['threshold']} batch_rows={pieces}]")


@pytest.mark.parametrize("convention", ["canonical", "swift", "trl", "verl"])
def test_rejection_group_equals_each_accumulator_alone(convention):
    """ISGroup (the report's rejection options in one kernel call per chunk) finishes with exactly the numbers of
    the same accumulators fed one by one; under verl (rejection statistics of its own) it feeds them one by one."""
    from rcdiag.analysis.correction.modes import ISAccumulator, ISGroup, get_mode
    from rcdiag.analysis.correction.rejection import REJECTION_OPTIONS, rejection_bound
    from rcdiag.analysis.passes.engine import stream

    tokens = make_tokens(21, n_seq=300, max_len=80, scale=0.4, big_p=0.01)
    mode = [get_mode("token_truncate").with_bounds(2.0)]

    def fresh() -> list:
        return [ISAccumulator(mode, convention, rejection=[rejection_bound(o, 2.0)]) for o in REJECTION_OPTIONS]

    grouped, alone = fresh(), fresh()
    group = ISGroup(grouped)
    assert group.fused == (convention != "verl")
    rows = stream(tokens, [group], batch_rows=997)
    assert stream(tokens, alone, batch_rows=997) == rows
    for mine, theirs in zip(grouped, alone, strict=True):
        a, b = mine.finish(Totals(rows))[0], theirs.finish(Totals(rows))[0]
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == b[key] or (a[key] != a[key] and b[key] != b[key]), (key, a[key], b[key])


def test_a_sequence_split_across_token_files_is_refused_by_name(tmp_path):
    """A run's token files hold whole sequences (they are streamed one per thread): a sequence that goes on in
    the next file is an InputError naming that file, not a silently split sequence or a merge traceback."""
    import pyarrow.parquet as pq

    from rcdiag.errors import InputError

    tokens = make_tokens(4, n_seq=40, max_len=30, min_len=5)
    sequences = pd.DataFrame({"seq_id": np.unique(tokens["seq_id"])})
    run = rcdiag.write_run(tmp_path / "run", tokens, sequences, shard_tokens=200)
    first, second = run.token_files[:2]
    head, tail = pq.read_table(first), pq.read_table(second)
    last = head.slice(head.num_rows - 1)
    moved = last.set_column(last.column_names.index("pos"), "pos",
                            pa.array([last.column("pos")[0].as_py() + 1], last.schema.field("pos").type))
    pq.write_table(pa.concat_tables([moved, tail]), second)
    with pytest.raises(InputError, match="two files") as caught:
        rcdiag.compute_metrics(rcdiag.open_run(run.path))
    assert second.name in str(caught.value)
