"""Token rows (Run, DataFrame or Arrow) as validated chunks of whole sequences, plus the sequence universe.

Every metric and IS simulation reads its input through `iter_chunks`: it streams record batches, checks them
(columns, dtypes, sorted unique (seq_id, pos), finite log-probs on valid positions, in one fused kernel pass) and
carries the rows of a sequence cut by a batch boundary into the next chunk, so every chunk holds whole sequences
and per-sequence reductions are identical however the input was batched. Each chunk computes its row terms (ℓ, ℓ̂,
expm1, exp: numpy's SIMD loops) and THE per-sequence table (kernels.SEQ_COLUMNS) once, for every consumer.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rcdiag.analysis.conventions import LOG_RATIO_CLAMP
from rcdiag.analysis.defaults import DEFAULT_THRESHOLD
from rcdiag.analysis.passes import kernels
from rcdiag.analysis.passes.rows import BatchRows
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
_CORE_ROW = {name: j for j, name in enumerate(kernels.CORE_COLUMNS)}
_HINTS = {
    "rollout_logprob": "the rollout engine must report processed log-probs for every sampled token",
    "train_logprob": "re-run the rescoring stage; a missing train log-prob is not a zero mismatch",
}


@dataclass(frozen=True)
class RowTerms:
    """A chunk's per-row terms, float64 [n], computed once for every consumer by numpy's SIMD loops (~1 ns a value;
    libm row by row took ~6): a, b the log-probs as stored (any value on rows not kept), ℓ = a − b in float64 (0 on
    rows not kept),
    ℓ̂ = clamp(ℓ, ±20), expm1(ℓ̂) and ρ̂ = exp(ℓ̂) (0, 0 and 1 on rows not kept; ρ̂ = expm1 + 1 above ℓ̂ = −log 2,
    kernels.ratio_rows). numpy's SIMD expm1 may differ from libm's in the last bit for a few per cent of values
    (both within an ulp)."""

    a: np.ndarray
    b: np.ndarray
    ell: np.ndarray
    lh: np.ndarray
    em1: np.ndarray
    rho: np.ndarray


@dataclass
class TokenChunk:
    """Whole sequences of token rows, sorted by (seq_id, pos).

    Arrays of length n (rows): `pos` int, `train` and `rollout` log-probs as stored (float32 or float64; any value
    on masked rows; the kernels widen each value to float64), `mask` bool; `extra` further columns a consumer asked the engine to carry (entropy, token_id).
    Arrays of length S (sequences with ≥ 1 row): `seq_ids` int64, `starts` (first row), `lengths`. `validated`:
    the rows passed the checks (else the chunk only goes to consumers that read refused data, and `kept` leaves
    the non-finite rows out). The row terms and THE per-sequence table (kernels.SEQ_COLUMNS) are computed on
    first use, once for every consumer.
    """

    seq_ids: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    pos: np.ndarray
    train: np.ndarray
    rollout: np.ndarray
    mask: np.ndarray
    all_valid: bool
    validated: bool = True
    extra: dict = field(default_factory=dict, repr=False)
    cache: dict = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        return int(self.mask.size)

    @cached_property
    def kept(self) -> np.ndarray:
        """bool [n]: the rows every statistic uses — valid, and (on a chunk that was not validated) finite."""
        if self.validated:
            return self.mask
        with np.errstate(invalid="ignore"):
            return self.mask & np.isfinite(self.train) & np.isfinite(self.rollout)

    @cached_property
    def all_kept(self) -> bool:
        return self.all_valid if self.validated else bool(self.kept.all())

    @cached_property
    def terms(self) -> RowTerms:
        a, b = self.train, self.rollout
        ell, lh = kernels.clamped_log_ratio(a, b, self.kept, LOG_RATIO_CLAMP)  # placeholders on rows not kept: 0
        em1 = np.expm1(lh)
        return RowTerms(a, b, ell, lh, em1, kernels.ratio_rows(lh, em1))

    def table(self, threshold: float = DEFAULT_THRESHOLD, lower: float | None = None) -> np.ndarray:
        """The per-sequence table, float64 [len(SEQ_COLUMNS), S] (kernels.sequence_table), its token_truncate
        weight columns at (threshold, lower); computed once per chunk and bounds."""
        key = ("table", float(threshold), lower)
        if key not in self.cache:
            t = self.terms
            self.cache[key] = kernels.sequence_table(t.a, t.b, self.kept, t.lh, t.em1, t.rho, self.starts,
                                                     float(threshold), float(lower or 0.0))
        return self.cache[key]

    def column(self, name: str) -> np.ndarray:
        """One per-sequence column (float64 [S]) by kernels.SEQ_COLUMNS name, e.g. "sum_l" → S_i = Σ m_t ℓ_t. A
        kernels.CORE_COLUMNS column comes from the lean kernels.sequence_core (the same bits) while no consumer of
        the chunk has needed the whole table: analyze's metrics and IS modes read only those (issue #32: the
        whole table was a quarter of analyze's compute)."""
        if name in _CORE_ROW and not any(key[0] == "table" for key in self.cache):
            return self.core_table()[_CORE_ROW[name]]
        return self.table()[kernels.COLUMN[name]]

    @property
    def core_pending(self) -> bool:
        """No per-sequence column has been computed yet (neither core_table nor any table): a kernel that visits the
        rows anyway may sum CORE_COLUMNS for the chunk (is_kernels.token_modes_core) and hand them to core_table."""
        return not any(key[0] in ("core", "table") for key in self.cache)

    def core_table(self, computed: np.ndarray | None = None) -> np.ndarray:
        """float64 [len(kernels.CORE_COLUMNS), S]: those rows of `table()` (kernels.sequence_core); cached.
        `computed`: the same rows from a fused kernel (is_kernels.token_modes_core), cached as they are."""
        if computed is not None:
            self.cache[("core",)] = computed
        elif ("core",) not in self.cache:
            t = self.terms
            self.cache[("core",)] = kernels.sequence_core(t.a, t.b, self.kept, t.lh, t.em1, self.starts)
        return self.cache[("core",)]

    @property
    def a(self) -> np.ndarray:
        """Train log-probs, float64 [n], 0.0 on rows not kept."""
        return self.memo(("a0",), lambda: np.where(self.kept, self.train.astype(np.float64), 0.0))

    @property
    def b(self) -> np.ndarray:
        """Rollout log-probs, float64 [n], 0.0 on rows not kept."""
        return self.memo(("b0",), lambda: np.where(self.kept, self.rollout.astype(np.float64), 0.0))

    @property
    def ell(self) -> np.ndarray:
        """ℓ = a − b per row (0 on rows not kept)."""
        return self.terms.ell

    @property
    def sum_ell(self) -> np.ndarray:
        """S_i = Σ_t m_t ℓ_t per sequence (float64 [S])."""
        return self.column("sum_l")

    @property
    def counts(self) -> np.ndarray:
        """T_i: valid (kept) tokens per sequence (int64)."""
        if self.all_kept:
            return self.lengths
        return self.memo(("counts",), lambda: self.column("T").astype(np.int64))

    def seq_sum(self, values: np.ndarray) -> np.ndarray:
        """Per-sequence sum of a row array (rows must already be 0 where masked)."""
        return np.add.reduceat(values, self.starts)

    def seq_max(self, values: np.ndarray, fill: float = -np.inf) -> np.ndarray:
        """Per-sequence max over valid rows (`fill` for a sequence without valid rows)."""
        return np.maximum.reduceat(self.valid_or(values, fill), self.starts)

    def valid_or(self, values: np.ndarray, fill: float) -> np.ndarray:
        return values if self.all_kept else np.where(self.kept, values, fill)

    def valid_values(self, values: np.ndarray) -> np.ndarray:
        """The values of the valid rows only (the array itself when every row is valid)."""
        return values if self.all_kept else values[self.kept]

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
        """(ℓ̂, ρ = exp(ℓ̂)) per row, float64 [n], ℓ̂ = clamp(ℓ, ±clamp) (ℓ when None); cached."""
        if clamp == LOG_RATIO_CLAMP:
            return self.terms.lh, self.terms.rho
        key = ("token_rows", clamp)
        if key not in self.cache:
            self.cache[key] = kernels.token_rows(self.train, self.rollout, self.kept,
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
        if clamp == LOG_RATIO_CLAMP:
            return self.terms.em1
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
    Python work, which two chunks per batch doubled); `flush` returns what is still carried. `extra`: further
    BatchRows columns carried along (`entropy`, `token_id`). `push(..., validate=False)` cuts without checking
    (a pass that goes on after a refused row for the consumers that report on refused data)."""

    def __init__(self, extra: tuple[str, ...] = ()) -> None:
        self.validate = _Validator()
        self.extra = extra
        self.carry: list[tuple[tuple[np.ndarray, ...], bool]] = []

    def push(self, source: str, batch: pa.RecordBatch | pa.Table | BatchRows, validate: bool = True
             ) -> list[TokenChunk]:
        if isinstance(batch, pa.Table):
            batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else None
        rows = batch if isinstance(batch, BatchRows) or batch is None else BatchRows(batch)
        if rows is None or rows.n == 0:
            return []
        if validate:
            arrays = self.validate(source, rows)
        else:
            arrays = (rows.seq.astype(np.int64, copy=False), rows.pos, rows.train, rows.rollout, rows.mask)
        arrays = (*arrays, *(rows.column(name) for name in self.extra))
        seq = arrays[0]
        last = int(np.searchsorted(seq, seq[-1], side="left"))  # first row of the batch's last sequence
        if last <= 0:  # one sequence throughout: it may go on in the next batch
            self.carry.append((arrays, validate))
            return []
        pieces = [*self.carry, (tuple(x[:last] for x in arrays), validate)]
        self.carry = [(tuple(x[last:] for x in arrays), validate)]
        return [self._joined(pieces)]

    def flush(self) -> TokenChunk | None:
        if not self.carry:
            return None
        pieces, self.carry = self.carry, []
        return self._joined(pieces)

    def _joined(self, pieces: list[tuple[tuple[np.ndarray, ...], bool]]) -> TokenChunk:
        """One chunk of the pieces' rows in order (the arrays themselves, without a copy, for a single piece)."""
        arrays = pieces[0][0] if len(pieces) == 1 else tuple(
            np.concatenate([p[k] for p, _ in pieces]) for k in range(len(pieces[0][0])))
        seq, pos, train, rollout, mask = arrays[:5]
        starts = kernels.segment_starts(seq)
        lengths = np.diff(np.append(starts, seq.size))
        return TokenChunk(seq_ids=seq[starts], starts=starts, lengths=lengths, pos=pos, train=train,
                          rollout=rollout, mask=mask, all_valid=bool(mask.all()),
                          validated=all(ok for _, ok in pieces), extra=dict(zip(self.extra, arrays[5:], strict=True)))


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
