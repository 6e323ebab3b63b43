"""The one pass engine: every statistic over token rows is a consumer fed by `run_pass`, file by file.

    merged = run_pass(run, Fresh([MetricsAccumulator(), ISAccumulator(modes)]))
    metrics = merged.consumers[0].finish(merged.totals)

A pass reads each token file once. Every record batch goes to the batch consumers (accum.BatchConsumer: the
checks, the report's scan) as read, refused rows included; the batch, validated and re-cut into whole sequences
(chunks.Chunker), goes to the chunk consumers (accum.ChunkConsumer: metrics, IS modes, trends) until the first
refused row, whose InputError the pass keeps as a value (`Merged.error`) so the batch consumers still see every
row. A Run's files are mapped on a thread per core (threads.ordered_map; the kernels and pyarrow release the GIL)
or as Ray tasks (rcdiag.distributed.report), each into its own consumers (`make(shard)`, the shard being
`Run.shard(k)`: token file k and its own sequences file), and merged on the caller in file order as they arrive —
so the numbers are the same bits whatever the number of threads, the order the files finish in, or --ray, and
memory holds at most the files in flight, never one part per file. Anything else (a DataFrame, an Arrow table)
is one stream, read ahead on a second thread.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag.analysis.passes import kernels
from rcdiag.analysis.passes.accum import BatchConsumer, ChunkConsumer, Totals
from rcdiag.analysis.passes.allocator import reuse_batch_memory
from rcdiag.analysis.passes.chunks import (
    DEFAULT_BATCH_ROWS,
    REQUIRED_COLUMNS,
    Chunker,
    TokenChunk,
    check_columns,
    check_in_universe,
    iter_sources,
    sequence_universe,
)
from rcdiag.analysis.passes.rows import BatchRows
from rcdiag.analysis.passes.threads import in_background, ordered_map, prefetch
from rcdiag.errors import InputError, RunDirError
from rcdiag.progress import progress, say
from rcdiag.store.run import Run
from rcdiag.store.schema import check_keys

Consumer = ChunkConsumer | BatchConsumer
Make = Callable[[Run | None], list[Consumer]]
"""Builds one file's fresh consumers from its shard (a Run of one token file; None for a single stream)."""
Keep = Callable[[pa.RecordBatch], pa.Array]
"""A row filter applied to each batch before any consumer sees it (rcdiag.store.batches.keep_seq_ids)."""
MapFiles = Callable[[Callable[[int], "FilePart"], Iterable[int]], Iterable["FilePart"]]
"""Like the builtin `map`: applies the per-file task to file indices, yielding results in index order (default:
threads.ordered_map, a thread per core; rcdiag.distributed.report.ray_map runs them as Ray tasks)."""
Key = tuple[int, int]
_COLUMN_OF = {"entropy": "train_entropy"}
"""The token column behind each carried chunk column (chunks.TokenChunk.extra)."""


@dataclass(frozen=True)
class Fresh:
    """The Make of fresh twins of template consumers (`c.fresh()` each): what a library call merges back into its
    own accumulators. Picklable when the templates are (a Ray task receives it)."""

    templates: tuple[Consumer, ...]

    def __post_init__(self) -> None:
        check_consumers(self.templates)

    def __call__(self, shard: Run | None) -> list[Consumer]:
        return [c.fresh() for c in self.templates]


def check_consumers(consumers: Sequence[Any]) -> None:
    """TypeError for anything that does not declare the contract (no duck typing, no silent fallback)."""
    unknown = [type(c).__name__ for c in consumers if not isinstance(c, (ChunkConsumer, BatchConsumer))]
    if unknown:
        raise TypeError(f"{', '.join(unknown)}: a pass consumer must be an accum.ChunkConsumer or "
                        "accum.BatchConsumer (fresh, merge, update_chunk / update_batch, finish)")


@dataclass
class FilePart:
    """One token file's consumers after its rows, with what the merge checks: token rows read, sequences fed to
    the chunk consumers, the first and last (seq_id, pos) key read, and the InputError the chunk consumers
    stopped at (None: every row was accepted)."""

    consumers: list[Consumer]
    file: str = "tokens"
    rows: int = 0
    seen: int = 0
    first: Key | None = None
    last: Key | None = None
    error: InputError | None = None


@dataclass
class Merged:
    """A pass's merged consumers (in the order `make` gave them), B (`sequences`: the sequences table's rows when
    known, else the distinct seq_ids the chunk consumers saw), the token rows read and the first InputError in
    file order (then the chunk consumers' states are those before it and must not be finished)."""

    consumers: list[Consumer]
    sequences: int
    tokens: int
    error: InputError | None = None

    @property
    def totals(self) -> Totals:
        return Totals(self.sequences)

    def raise_error(self) -> Merged:
        """self, or the pass's InputError raised (what a library call that returns numbers does)."""
        if self.error is not None:
            raise self.error
        return self


# --------------------------------------------------------------------------------------------------- one stream
class Feed:
    """Feeds one stream of record batches to consumers: each batch to the batch consumers, decoded once
    (rows.BatchRows); validated whole-sequence chunks to the chunk consumers until the first InputError — after it
    only to the consumers that report on refused data (`strict = False`), the rows cut but not validated."""

    def __init__(self, consumers: Sequence[Consumer], universe: np.ndarray | None) -> None:
        check_consumers(consumers)
        self.batch = [c for c in consumers if isinstance(c, BatchConsumer)]
        self.chunk = [c for c in consumers if isinstance(c, ChunkConsumer)]
        self.lenient = [c for c in self.chunk if not c.strict]
        self.universe = universe
        self.chunker = Chunker(tuple(dict.fromkeys(n for c in self.chunk for n in c.chunk_columns)))
        self.error: InputError | None = None
        self.seen = 0
        self._checked: set[str] = set()

    def push(self, source: str, batch: pa.RecordBatch, row0: int) -> None:
        """One record batch of `source` whose first row is row `row0` of it."""
        if not batch.num_rows:
            return
        rows = BatchRows(batch)
        for consumer in self.batch:
            consumer.update_batch(rows, source, row0)
        if self.error is None and self.chunk:
            try:
                if source not in self._checked:
                    check_columns(batch.schema, source)
                    self._checked.add(source)
                chunks = self.chunker.push(source, rows)
            except InputError as exc:
                self.error = exc
            else:
                for chunk in chunks:
                    self._feed(chunk)
                return
        if self.lenient:
            for chunk in self.chunker.push(source, rows, validate=False):
                self._feed(chunk)

    def _feed(self, chunk: TokenChunk) -> None:
        if self.error is None and chunk.validated:
            try:
                check_in_universe(chunk, self.universe)
            except InputError as exc:
                self.error = exc
        if self.error is None and chunk.validated:
            self.seen += chunk.seq_ids.size
            for consumer in self.chunk:
                consumer.update_chunk(chunk)
        else:
            for consumer in self.lenient:
                consumer.update_chunk(chunk)

    def finish(self) -> None:
        """Feed the rows still carried (the stream's last sequence)."""
        if not self.chunk or (self.error is not None and not self.lenient):
            return
        tail = self.chunker.flush()
        if tail is not None:
            self._feed(tail)


def feed_stream(part: FilePart, universe: np.ndarray | None, batches: Iterator[tuple[str, pa.RecordBatch]],
                keep: Keep | None = None, error: InputError | None = None) -> FilePart:
    """Feed `batches` (read ahead on a thread) into `part`'s consumers; returns `part` with its counts, keys and
    error. `keep` filters each batch after its keys and row offsets are taken (rows are located as written).
    `error`: the chunk consumers are refused from the start (the batch consumers still see every row)."""
    feed = Feed(part.consumers, universe)
    feed.error = error
    offsets: dict[str, int] = {}
    for source, batch in prefetch(batches):
        row0 = offsets.get(source, 0)
        offsets[source] = row0 + batch.num_rows
        part.rows += batch.num_rows
        if batch.num_rows:
            part.first = part.first or batch_key(batch, 0)
            part.last = batch_key(batch, batch.num_rows - 1)
        feed.push(source, batch if keep is None else batch.filter(keep(batch)), row0)
    feed.finish()
    part.seen, part.error = feed.seen, feed.error
    return part


def batch_key(batch: pa.RecordBatch, row: int) -> Key:
    """(seq_id, pos) of one row of a batch: the keys check_file_start compares."""
    return int(batch.column("seq_id")[row].as_py()), int(batch.column("pos")[row].as_py())


# --------------------------------------------------------------------------------------------------- files
def file_batches(shard: Run, consumers: Sequence[Consumer], batch_rows: int
                 ) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The batches of a shard's one token file: the columns its consumers read (`columns` of each class; chunk
    consumers read REQUIRED_COLUMNS and `mask` when present). A column a batch consumer needs and the file lacks
    is a RunDirError; what the chunk consumers lack is their InputError (chunks.check_columns)."""
    file = shard.token_files[0]
    parquet = _parquet(file)
    names = parquet.schema_arrow.names
    wanted: dict[str, None] = {}
    for consumer in consumers:
        if isinstance(consumer, BatchConsumer):
            missing = [c for c in consumer.columns if c not in names]
            if missing:
                raise RunDirError(f"{file}: missing column(s) {missing}")
        wanted.update(dict.fromkeys(getattr(consumer, "columns", REQUIRED_COLUMNS)))
        wanted.update(dict.fromkeys(_COLUMN_OF.get(c, c) for c in getattr(consumer, "chunk_columns", ())))
    wanted.update(dict.fromkeys(c for c in ("seq_id", "pos", "mask") if c in names))
    columns = [c for c in wanted if c in names]
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
        yield f"tokens/{file.name}", batch


def _parquet(file: Any) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(file)
    except (pa.ArrowInvalid, OSError) as exc:
        raise RunDirError(f"{file}: unreadable Parquet file ({exc}); the run is corrupt — re-create it") from None


def file_part(run_path: str, make: Make, index: int, *, batch_rows: int = DEFAULT_BATCH_ROWS,
              keep: Keep | None = None, universe: np.ndarray | None = None, own_universe: bool = True) -> FilePart:
    """The part of token file `index` (sorted order) of the run at `run_path`: `make(shard)`'s consumers fed its
    rows. The membership check uses `universe` when given, else (own_universe) the shard's own sequences. A
    module-level function of picklable arguments: a Ray task runs it as it is."""
    reuse_batch_memory()  # here, not only in run_pass: a Ray task runs this alone
    shard = Run(run_path, validate=False, shard=index)  # the caller opened (and validated) the run; opening
    # the whole run first listed and stamped every shard once per task
    consumers = make(shard)
    error = None
    if universe is None and own_universe and any(isinstance(c, ChunkConsumer) for c in consumers):
        try:
            universe = sequence_universe(shard)
        except InputError as exc:
            error = exc
    part = FilePart(consumers, f"tokens/{shard.token_files[0].name}")
    return feed_stream(part, universe, file_batches(shard, consumers, batch_rows), keep, error)


def check_file_start(first: Key, previous: Key | None, source: str) -> None:
    """InputError unless a token file's first (seq_id, pos) key follows the previous file's last one and starts a
    new sequence: keys increase across files as within one, and each file holds whole sequences (the passes map
    the files separately and merge what they found)."""
    check_keys(np.array([first[0]]), np.array([first[1]]), source=source, previous=previous)
    if previous is not None and first[0] == previous[0]:
        raise InputError(f"seq_id {previous[0]} has token rows in two files: a run's token files hold whole "
                         "sequences — re-create the run (re-run the import or `rcdiag score`)", file=source, row=1,
                         field="seq_id")


class Merger:
    """Merges file parts in file order as they arrive: batch consumers always; chunk consumers until the first
    InputError (a file's own, or a file whose keys do not continue the previous file's), which is kept."""

    def __init__(self) -> None:
        self.target: list[Consumer] | None = None
        self.error: InputError | None = None
        self.tokens = self.seen = 0
        self.previous: Key | None = None

    def add(self, part: FilePart) -> None:
        self.tokens += part.rows
        if self.error is None and part.first is not None:
            try:
                check_file_start(part.first, self.previous, part.file)
            except InputError as exc:
                self.error = exc
        if self.error is None and part.error is not None:
            self.error = part.error
        if self.error is None:
            self.seen += part.seen
        if self.target is None:
            self.target = part.consumers
        else:
            for mine, theirs in zip(self.target, part.consumers, strict=True):
                if self.error is None or isinstance(mine, BatchConsumer) or not mine.strict:
                    mine.merge(theirs)
        self.previous = part.last if part.last is not None else self.previous


# --------------------------------------------------------------------------------------------------- the pass
_NOTICE = {"said": False}


def compile_notice(silent: bool) -> None:
    """Say kernels.FIRST_COMPILE on stderr, once per process, when numba's cache lacks the kernels (a fresh
    install: the first report compiled for ~20 s behind a bar at 0 %, or no bar at all on a one-file run)."""
    if not silent and not _NOTICE["said"] and not kernels.compiled_on_disk():
        _NOTICE["said"] = True
        say(kernels.FIRST_COMPILE)


def run_pass(data: Any, make: Make, *, sequences: Any = None, map_files: MapFiles | None = None,
             batch_rows: int = DEFAULT_BATCH_ROWS, keep: Keep | None = None, silent: bool = True,
             desc: str = "tokens", strict: bool = False) -> Merged:
    """One pass of `make`'s consumers over `data`: a Run (file by file, `map_files`), or a DataFrame / Arrow table /
    record batch / iterator of (source, batch) pairs (one stream). `sequences` (a frame or table with seq_id) gives
    B and the membership check instead of the Run's sequences table (or the distinct seq_ids seen). `keep` filters
    rows (the dashboard's filtered distributions). Returns the merged consumers, B and the first InputError in file
    order; `strict` raises it instead, as soon as it is known (a library call: nothing else would use the rest)."""
    reuse_batch_memory()
    compile_notice(silent)
    if isinstance(data, Run) and data.token_files:
        return _run_files(data, make, sequences, map_files, batch_rows, keep, silent, desc, strict)
    universe = sequence_universe(data, sequences)
    part = FilePart(make(data if isinstance(data, Run) else None))
    batches = iter(()) if isinstance(data, Run) else (data if isinstance(data, Iterator) else
                                                      iter_sources(data, batch_rows))
    with progress(total=_total_rows(data), desc=desc, unit="tok", unit_scale=True, silent=silent) as bar:
        feed_stream(part, universe, _counted(batches, bar), keep)
    rows = part.seen if universe is None else int(universe.size)
    merged = Merged(part.consumers, rows, part.rows, part.error)
    return merged.raise_error() if strict else merged


def _counted(batches: Iterator[tuple[str, pa.RecordBatch]], bar: Any) -> Iterator[tuple[str, pa.RecordBatch]]:
    for source, batch in batches:
        bar.update(batch.num_rows)
        yield source, batch


def _run_files(run: Run, make: Make, sequences: Any, map_files: MapFiles | None, batch_rows: int,
               keep: Keep | None, silent: bool, desc: str, strict: bool) -> Merged:
    """Per-file parts of a Run, merged in file order as they arrive. B and the duplicate check span the whole
    sequences table (or `sequences`), as one pass over the run does; each file checks membership against its own
    shard's sequences (the store writes shard k of both tables with the same sequences)."""
    merger = Merger()
    # B and the duplicate check read the whole sequences table; the files' tasks need it only when `sequences`
    # was given (otherwise each checks its own shard), so it is then read on a thread of its own while the first
    # files are read and computed (a serial ~10 ms of a 10 M-token analyze before any file started, issue #32),
    # and its InputError still comes first in file order: it is taken before the first part is merged
    whole = in_background(sequence_universe, run, sequences) if sequences is None else None
    universe = None if whole is not None else _universe(run, sequences, merger, strict)
    task = partial(file_part, str(run.path), make, batch_rows=batch_rows, keep=keep, universe=universe,
                   own_universe=sequences is None)
    files = run.token_files
    with progress(total=run.num_tokens, desc=desc, unit="tok", unit_scale=True, silent=silent) as bar:
        for part in (map_files or ordered_map)(task, range(len(files))):
            if whole is not None:
                universe, whole = _universe(run, sequences, merger, strict, whole), None
            merger.add(part)
            bar.update(part.rows)
            if strict and merger.error is not None:
                raise merger.error
    if whole is not None:  # no file was mapped
        universe = _universe(run, sequences, merger, strict, whole)
    run.check_unchanged()  # a run rewritten during the pass would mix two runs' numbers (rcdiag.store.run)
    rows = merger.seen if universe is None else int(universe.size)
    return Merged(merger.target or [], rows, merger.tokens, merger.error)


def _universe(run: Run, sequences: Any, merger: Merger, strict: bool, read: Future | None = None
              ) -> np.ndarray | None:
    """The sorted seq_ids of B (`read`: their read already started), or None with the InputError kept in `merger`
    (raised when `strict`)."""
    try:
        return read.result() if read is not None else sequence_universe(run, sequences)
    except InputError as exc:
        if strict:
            raise
        merger.error = exc
        return None


def stream(data: Any, consumers: list[Consumer], *, sequences: Any = None, batch_rows: int = DEFAULT_BATCH_ROWS,
           silent: bool = True, desc: str = "tokens") -> int:
    """Feed every chunk of `data` to `consumers` in one pass (their fresh twins per file, merged back into them
    in file order); raise the first InputError; return B (the sequences table's rows when known, else the
    distinct seq_ids seen). The library's calls (compute_metrics, simulate, sweep, analyze, trend, logged_values)
    are this."""
    merged = run_pass(data, Fresh(tuple(consumers)), sequences=sequences, batch_rows=batch_rows, silent=silent,
                      desc=desc, strict=True)
    for mine, theirs in zip(consumers, merged.consumers, strict=True):
        mine.merge(theirs)
    return merged.sequences


def _total_rows(data: Any) -> int | None:
    if isinstance(data, Run):
        return data.num_tokens
    return getattr(data, "num_rows", None) or (len(data) if hasattr(data, "__len__") else None)

