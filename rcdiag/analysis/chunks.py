"""Token rows (Run, DataFrame or Arrow) as validated chunks of whole sequences, plus the sequence universe.

Every metric and IS simulation reads its input through `iter_chunks`: it streams record batches, checks them
(columns, dtypes, sorted unique (seq_id, pos), finite log-probs on valid positions, in one fused kernel pass) and
carries the rows of a sequence cut by a batch boundary into the next chunk, so every chunk holds whole sequences
and per-sequence reductions are identical however the input was batched. Log-probs stay in their stored dtype
(float32 or float64); the kernels widen them to float64 per row.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rcdiag.analysis import kernels
from rcdiag.analysis.conventions import LOG_RATIO_CLAMP
from rcdiag.analysis.rows import BatchRows
from rcdiag.errors import InputError
from rcdiag.store.files import DEFAULT_READ_ROWS
from rcdiag.store.run import Run
from rcdiag.store.schema import as_table, check_finite, check_keys
from rcdiag.store.validate import is_member

REQUIRED_COLUMNS = ("seq_id", "pos", "rollout_logprob", "train_logprob")
DEFAULT_BATCH_ROWS = DEFAULT_READ_ROWS
"""Rows per record batch read: the store's one read size (rcdiag.store.files.DEFAULT_READ_ROWS, why it is that)."""
_INTEGER_COLUMNS = ("seq_id", "pos")
_FLOAT_COLUMNS = ("rollout_logprob", "train_logprob")
_HINTS = {
    "rollout_logprob": "the rollout engine must report processed log-probs for every sampled token",
    "train_logprob": "re-run the rescoring stage; a missing train log-prob is not a zero mismatch",
}


@dataclass
class TokenChunk:
    """Whole sequences of token rows, sorted by (seq_id, pos).

    Arrays of length n (rows): `pos` int, `train` and `rollout` log-probs as read (float32 or float64; any value on
    masked rows), `mask` bool; `a` (train) and `b` (rollout) float64 with 0.0 on masked rows are built on first
    use (the kernels read `train`/`rollout` directly). Arrays of length S (sequences with ≥ 1 row): `seq_ids` int64,
    `starts` (first row), `lengths`.
    """

    seq_ids: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    pos: np.ndarray
    train: np.ndarray
    rollout: np.ndarray
    mask: np.ndarray
    all_valid: bool
    cache: dict = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        return int(self.mask.size)

    @cached_property
    def a(self) -> np.ndarray:
        """Train log-probs, float64 [n], 0.0 on masked rows."""
        return np.where(self.mask, self.train, 0.0)

    @cached_property
    def b(self) -> np.ndarray:
        """Rollout log-probs, float64 [n], 0.0 on masked rows."""
        return np.where(self.mask, self.rollout, 0.0)

    @cached_property
    def ell(self) -> np.ndarray:
        """ℓ = a − b per row (0 on masked rows)."""
        return self.a - self.b

    @cached_property
    def sums(self) -> tuple[np.ndarray, ...]:
        """Per-sequence sums in one fused pass: (float64 [9, S] in kernels.SEQ_SUM_COLUMNS order, int64 [S]
        counts T_i, float64 [S] max |ℓ| over valid rows, rows ℓ̂ and exp(ℓ̂) at the ±20 clamp); see
        kernels.seq_sums."""
        return kernels.seq_sums(self.train, self.rollout, self.mask, self.starts, LOG_RATIO_CLAMP)

    def seq_column(self, name: str) -> np.ndarray:
        """One per-sequence sum (float64 [S]) by kernels.SEQ_SUM_COLUMNS name, e.g. "ell" → S_i = Σ m_t ℓ_t."""
        return self.sums[0][kernels.SEQ_SUM_COLUMNS.index(name)]

    @property
    def sum_ell(self) -> np.ndarray:
        """S_i = Σ_t m_t ℓ_t per sequence (float64 [S])."""
        return self.seq_column("ell")

    @property
    def counts(self) -> np.ndarray:
        """T_i: valid tokens per sequence (int64)."""
        return self.lengths if self.all_valid else self.sums[1]

    def seq_sum(self, values: np.ndarray) -> np.ndarray:
        """Per-sequence sum of a row array (rows must already be 0 where masked)."""
        return np.add.reduceat(values, self.starts)

    def seq_max(self, values: np.ndarray, fill: float = -np.inf) -> np.ndarray:
        """Per-sequence max over valid rows (`fill` for a sequence without valid rows)."""
        return np.maximum.reduceat(self.valid_or(values, fill), self.starts)

    def valid_or(self, values: np.ndarray, fill: float) -> np.ndarray:
        return values if self.all_valid else np.where(self.mask, values, fill)

    def valid_values(self, values: np.ndarray) -> np.ndarray:
        """The values of the valid rows only (the array itself when every row is valid)."""
        return values if self.all_valid else values[self.mask]

    def per_row(self, per_sequence: np.ndarray) -> np.ndarray:
        """Broadcast a per-sequence array to rows."""
        return np.repeat(per_sequence, self.lengths)

    def memo(self, key: tuple, make: Callable[[], np.ndarray]) -> np.ndarray:
        """`make()`'s array, computed once per chunk for every consumer that asks for `key` (overflow ignored)."""
        if key not in self.cache:
            with np.errstate(over="ignore"):
                self.cache[key] = make()
        return self.cache[key]

    def token_rows(self, clamp: float | None) -> tuple[np.ndarray, np.ndarray]:
        """(ℓ̂, ρ = exp(ℓ̂)) per row, float64 [n], ℓ̂ = clamp(ℓ, ±clamp) (ℓ when None); one fused pass, cached."""
        if clamp == LOG_RATIO_CLAMP:
            return self.sums[3], self.sums[4]
        key = ("token_rows", clamp)
        if key not in self.cache:
            self.cache[key] = kernels.token_rows(self.train, self.rollout, self.mask,
                                                 np.inf if clamp is None else float(clamp))
        return self.cache[key]

    def log_ratio(self, clamp: float | None) -> np.ndarray:
        """ℓ̂ = clamp(ℓ, ±clamp) per row (ℓ itself when clamp is None; 0 on masked rows)."""
        return self.token_rows(clamp)[0]

    def ratio(self, clamp: float | None) -> np.ndarray:
        """ρ = exp(ℓ̂) per row (1 on masked rows; full relative precision for tiny ρ)."""
        return self.token_rows(clamp)[1]

    def ratio_m1(self, clamp: float | None) -> np.ndarray:
        """ρ − 1 = expm1(ℓ̂) per row (0 on masked rows; accurate for tiny ℓ); cached per chunk."""
        return self.memo(("ratio_m1", clamp), lambda: np.expm1(self.log_ratio(clamp)))


# --------------------------------------------------------------------------------------------------- sources
def iter_sources(data: object, batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[tuple[str, pa.RecordBatch]]:
    """(source name, record batch) pairs of the token rows of a Run, DataFrame, Arrow table or record batch."""
    if isinstance(data, Run):
        for file in data.token_files:
            parquet = pq.ParquetFile(file)
            name = f"tokens/{file.name}"
            check_columns(parquet.schema_arrow, name)
            columns = list(REQUIRED_COLUMNS) + (["mask"] if "mask" in parquet.schema_arrow.names else [])
            for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
                yield name, batch
        return
    table = as_table(data, source="tokens")
    check_columns(table.schema, "tokens")
    for batch in table.to_batches(max_chunksize=batch_rows):
        yield "tokens", batch


def check_columns(schema: pa.Schema, source: str) -> None:
    for name in REQUIRED_COLUMNS:
        if name not in schema.names:
            raise InputError(f"missing required column '{name}' (have: {', '.join(schema.names) or 'none'})",
                             file=source, field=name)
        kind = schema.field(name).type
        ok = pa.types.is_integer(kind) if name in _INTEGER_COLUMNS else (
            pa.types.is_floating(kind) or pa.types.is_integer(kind) or pa.types.is_null(kind))
        if not ok:
            want = "an integer" if name in _INTEGER_COLUMNS else "a floating-point"
            raise InputError(f"wrong dtype {kind}: must be {want} column", file=source, field=name)
    if "mask" in schema.names:
        kind = schema.field("mask").type
        if not (pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_null(kind)):
            raise InputError(f"wrong dtype {kind}: must be a boolean (or 0/1) column", file=source, field="mask")


# --------------------------------------------------------------------------------------------------- validation
@dataclass
class _Validator:
    """Checks one stream of batches; keeps the last key (order across batches and files) and row offsets."""

    previous: tuple[int, int] | None = None
    source: str | None = None
    offset: int = 0

    def __call__(self, source: str, rows: BatchRows) -> tuple[np.ndarray, ...]:
        batch = rows.batch
        if source != self.source:
            self.source, self.offset = source, 0
        offset = self.offset
        self.offset += batch.num_rows
        for name in _INTEGER_COLUMNS:
            column = batch.column(name)
            if column.null_count:
                row = int(np.flatnonzero(np.asarray(pc.is_null(column)))[0])
                raise InputError("null key", file=source, row=offset + row + 1, field=name)
        seq = rows.seq.astype(np.int64, copy=False)
        pos, mask, train, rollout = rows.pos, rows.mask, rows.train, rows.rollout
        has_prev = self.previous is not None
        prev = self.previous or (0, 0)
        if kernels.check_rows(seq, pos, train, rollout, mask, has_prev, prev[0], prev[1]) != kernels.OK:  # the numpy checks name the first offending row and column
            self._raise(source, offset, seq, pos, mask, {"train_logprob": train, "rollout_logprob": rollout})
        self.previous = int(seq[-1]), int(pos[-1])
        return seq, pos, train, rollout, mask

    def _raise(self, source: str, offset: int, seq: np.ndarray, pos: np.ndarray, mask: np.ndarray,
               values: dict[str, np.ndarray]) -> None:
        check_keys(seq, pos, source=source, row_offset=offset, previous=self.previous)
        for name, x in values.items():
            check_finite(x.astype(np.float64), mask, column=name, seq_id=seq, pos=pos, source=source,
                         row_offset=offset, hint=_HINTS[name])
        raise AssertionError("kernels.check_rows refused a batch that the numpy checks accept")


# --------------------------------------------------------------------------------------------------- chunks
def iter_chunks(data: object, batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[TokenChunk]:
    """Validated chunks of whole sequences from `data` (Run, DataFrame, Arrow table/batch, or an iterable of
    (source, RecordBatch) pairs). Raises InputError (file, row, column) on the first bad row."""
    sources: Iterable[tuple[str, pa.RecordBatch]]
    if isinstance(data, Iterator):
        sources = data
    else:
        sources = iter_sources(data, batch_rows)
    chunker = Chunker()
    for source, batch in sources:
        yield from chunker.push(source, batch)
    tail = chunker.flush()
    if tail is not None:
        yield tail


class Chunker:
    """Validates raw batches and re-cuts them at sequence boundaries: the last (possibly open) sequence of a batch
    is carried and completed with the head of the next batch. `push` returns the completed chunk — the carried rows
    and the batch up to its last sequence, ONE chunk per batch (each chunk costs every consumer its per-chunk
    Python work, which two chunks per batch doubled); `flush` returns what is still carried."""

    def __init__(self) -> None:
        self.validate = _Validator()
        self.carry: list[tuple[np.ndarray, ...]] = []

    def push(self, source: str, batch: pa.RecordBatch | pa.Table | BatchRows) -> list[TokenChunk]:
        if isinstance(batch, pa.Table):
            batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else None
        rows = batch if isinstance(batch, BatchRows) or batch is None else BatchRows(batch)
        if rows is None or rows.n == 0:
            return []
        arrays = self.validate(source, rows)
        seq = arrays[0]
        last = int(np.searchsorted(seq, seq[-1], side="left"))  # first row of the batch's last sequence
        if last == 0:  # one sequence throughout: it may go on in the next batch
            self.carry.append(arrays)
            return []
        pieces, self.carry = [*self.carry, tuple(x[:last] for x in arrays)], [tuple(x[last:] for x in arrays)]
        return [_joined(pieces)]

    def flush(self) -> TokenChunk | None:
        if not self.carry:
            return None
        pieces, self.carry = self.carry, []
        return _joined(pieces)


def _joined(pieces: list[tuple[np.ndarray, ...]]) -> TokenChunk:
    """One chunk of the pieces' rows in order (the arrays themselves, without a copy, for a single piece)."""
    if len(pieces) == 1:
        return _make_chunk(*pieces[0])
    return _make_chunk(*(np.concatenate([p[k] for p in pieces]) for k in range(5)))


def _make_chunk(seq: np.ndarray, pos: np.ndarray, train: np.ndarray, rollout: np.ndarray,
                mask: np.ndarray) -> TokenChunk:
    """A TokenChunk of whole sequences (validated rows)."""
    starts = kernels.segment_starts(seq)
    lengths = np.diff(np.append(starts, seq.size))
    return TokenChunk(seq_ids=seq[starts], starts=starts, lengths=lengths, pos=pos, train=train, rollout=rollout,
                      mask=mask, all_valid=bool(mask.all()))


# --------------------------------------------------------------------------------------------------- universe
def sequence_universe(data: object, sequences: object | None = None) -> np.ndarray | None:
    """Sorted seq_ids of every row B: a Run's sequences table, or the given `sequences` frame/table; None when only
    token rows are known (then B = the distinct seq_ids seen in the tokens)."""
    if sequences is None and isinstance(data, Run):
        table = data.sequence_table(["seq_id"])
    elif sequences is not None:
        table = as_table(sequences, source="sequences")
        if "seq_id" not in table.column_names:
            raise InputError("missing required column 'seq_id'", file="sequences", field="seq_id")
    else:
        return None
    column = table.column("seq_id")
    if not pa.types.is_integer(column.type):
        raise InputError(f"wrong dtype {column.type}: must be an integer column", file="sequences", field="seq_id")
    ids = np.sort(np.asarray(column.fill_null(-1)).astype(np.int64))
    if ids.size > 1 and (np.diff(ids) == 0).any():
        dup = int(ids[np.flatnonzero(np.diff(ids) == 0)[0]])
        raise InputError(f"seq_id {dup} appears more than once", file="sequences", field="seq_id")
    return ids


def check_in_universe(chunk: TokenChunk, universe: np.ndarray | None) -> None:
    """InputError when a token row's seq_id is not a row of the sequences table."""
    if universe is None or chunk.seq_ids.size == 0:
        return
    missing = ~is_member(universe, chunk.seq_ids)
    if missing.any():
        seq = int(chunk.seq_ids[np.flatnonzero(missing)[0]])
        raise InputError(f"token rows reference seq_id {seq}, which is not in the sequences table",
                         file="sequences", field="seq_id")
