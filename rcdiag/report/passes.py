"""The report's passes as per-token-file partial accumulators, merged in file order (no Ray needed here).

`rcdiag report` computes one `Partial` per token file — the scan (checks, tails, strata, per-sequence sums) and
the library accumulators (metrics, IS sweep, rejection options) — and merges them on the caller in file order.
The local path maps files on a thread per core (analysis.threads.ordered_map), `--ray` with Ray tasks (rcdiag.distributed.report); the merge
is the same code in the same order, so both give bit-identical numbers.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from rcdiag.analysis.allocator import reuse_batch_memory
from rcdiag.analysis.chunks import (
    DEFAULT_BATCH_ROWS,
    ChunkFeed,
    batch_key,
    check_columns,
    check_file_start,
    sequence_universe,
)
from rcdiag.analysis.correction import ISAccumulator, ISGroup, get_mode
from rcdiag.analysis.gates import report_gates
from rcdiag.analysis.metrics import MetricsAccumulator
from rcdiag.analysis.rejection import REJECTION_OPTIONS, rejection_bound
from rcdiag.analysis.strata import SequenceInfo
from rcdiag.analysis.threads import ordered_map, prefetch
from rcdiag.errors import InputError
from rcdiag.progress import progress
from rcdiag.report.options import MODES, ReportOptions
from rcdiag.report.scan import SCAN_COLUMNS, SEQUENCE_COLUMNS, Scan, new_scan, relabel, sequence_info, update
from rcdiag.store.files import SEQUENCES_DIR
from rcdiag.store.run import Run

MapFiles = Callable[[Callable[[int], "Partial"], Iterable[int]], Iterable["Partial"]]
"""Like the builtin `map`: applies a per-file function to file indices, yielding results in index order (default:
threads.ordered_map, one thread per core — the kernels release the GIL)."""


class FileView(Run):
    """A complete run restricted to one token file and its own shard's sequences file (shard k of tokens/ and
    sequences/ hold the same sequences; a token file without a same-named sequences file sees them all)."""

    def __init__(self, run: Run, file: Path):
        self.__dict__.update(run.__dict__)
        self._file = file
        own = run.path / SEQUENCES_DIR / file.name
        self._sequences = [own] if own.is_file() else run.sequence_files

    @property
    def token_files(self) -> list[Path]:
        return [self._file]

    @property
    def sequence_files(self) -> list[Path]:
        return self._sequences


@dataclass
class Library:
    """The library accumulators of the report (metrics, the IS sweep grid, verl's rejection options), mergeable
    over disjoint files; `rows` = B, the rows of the sequences table."""

    grid: list[Any]
    metrics: Any
    sweep: Any
    rejections: dict[str, Any]
    rows: int = 0
    gates: Any = None
    """The gate families' sweep (rcdiag.analysis.gates.GateAccumulator), or None."""

    @property
    def consumers(self) -> list[Any]:
        return [self.metrics, self.sweep, ISGroup(list(self.rejections.values())),
                *([self.gates] if self.gates is not None else [])]

    def merge(self, other: Library) -> Library:
        self.metrics.merge(other.metrics)
        self.sweep.merge(other.sweep)
        if self.gates is not None:
            self.gates.merge(other.gates)
        for name, acc in self.rejections.items():
            acc.merge(other.rejections[name])
        self.rows = max(self.rows, other.rows)
        return self


def library_accumulators(options: ReportOptions) -> Library:
    """Fresh accumulators for `options` (fed in ONE pass; the same numbers as compute_metrics / simulate / sweep,
    which each make their own pass)."""
    o = options
    thresholds = tuple(dict.fromkeys((*o.thresholds, o.threshold)))
    grid = [get_mode(m).with_bounds(c, o.lower) for m in MODES for c in thresholds]
    tis = [get_mode("token_truncate").with_bounds(o.threshold, o.lower)]
    rejections = {opt: ISAccumulator(tis, o.convention, rejection=[rejection_bound(opt, o.threshold)])
                  for opt in REJECTION_OPTIONS}
    return Library(grid, MetricsAccumulator(o.convention), ISAccumulator(grid, o.convention), rejections)


@dataclass
class Partial:
    """One token file's accumulators; `library` is the InputError the metrics refused the file with, if any.
    `first`/`last`: the file's first and last (seq_id, pos) key, or None for an empty file."""

    scan: Scan
    library: Any
    first: tuple[int, int] | None
    last: tuple[int, int] | None
    file: str


def passes(run: Run, options: Any, finish_labels: Sequence[str] | None = None, file: str = "") -> Partial:
    """Both passes over `run` (a Run or FileView) from ONE read of each token file: every record batch feeds the
    scan and, cut into DEFAULT_BATCH_ROWS slices, the library accumulators. Returns the Partial: scan, library
    accumulators with `.rows` — or the InputError the metrics refused the data with; the scan still sees every
    row — and the first and last (seq_id, pos) key read (taken from the batches, not a second read of the file).
    `finish_labels`: the whole run's finish-reason labels when `run` holds one shard's sequences, so partial
    strata line up when merged (rcdiag.report.scan.relabel)."""
    reuse_batch_memory()  # here, not only in run_passes: a Ray task runs this alone
    table = run.sequence_table(list(SEQUENCE_COLUMNS))
    info = SequenceInfo.from_table(table)
    if finish_labels is not None:
        info = relabel(info, finish_labels)
    scan = new_scan(info, options.threshold, options.lower)
    library: Any = library_accumulators(options)
    feed = None
    try:  # a file task reads its own shard only: GRPO groups are formed within it (a bad column costs the gates)
        library.gates = report_gates(run)
    except InputError:
        library.gates = None
    try:
        feed = ChunkFeed(library.consumers, sequence_universe(run, table))
    except InputError as exc:
        library = exc
    offsets: dict[str, int] = {}
    first = last = None
    for source, batch in prefetch(run.iter_batches(SCAN_COLUMNS)):
        update(scan, batch, source, offsets.get(source, 0))
        offsets[source] = offsets.get(source, 0) + batch.num_rows
        if batch.num_rows:
            first = first or batch_key(batch, 0)
            last = batch_key(batch, batch.num_rows - 1)
        if feed is not None:
            try:
                if not offsets[source] - batch.num_rows:
                    check_columns(batch.schema, source)
                for start in range(0, batch.num_rows, DEFAULT_BATCH_ROWS):
                    feed.push(source, batch.slice(start, DEFAULT_BATCH_ROWS))
            except InputError as exc:
                library, feed = exc, None
    if feed is not None:
        try:
            library.rows = feed.finish()
        except InputError as exc:
            library = exc
    return Partial(scan, library, first, last, file)


def file_partial(run_path: str, options: Any, index: int, *, finish_labels: Sequence[str] | None = None) -> Partial:
    """The partial of token file `index` (in sorted order) of the run at `run_path`, reading only its own shard's
    sequences; `finish_labels` are the whole run's (the driver reads them once)."""
    run = Run(run_path, validate=False)  # the driver opened (and validated) the run; tasks only re-open it
    file = run.token_files[index]
    return passes(FileView(run, file), options, finish_labels, file=f"tokens/{file.name}")


def merge_partials(parts: list[Partial]) -> tuple[Scan, Any]:
    """Merge in the given (file) order; the first refused file's InputError wins, as in one sequential pass,
    including keys that do not increase from one file to the next."""
    scan, library = parts[0].scan, parts[0].library
    previous = parts[0].last
    for part in parts[1:]:
        scan = scan.merge(part.scan)
        if not isinstance(library, InputError) and part.first is not None:
            try:
                check_file_start(part.first, previous, part.file)
            except InputError as exc:
                library = exc
        if not isinstance(library, InputError):
            library = part.library if isinstance(part.library, InputError) else library.merge(part.library)
        previous = part.last if part.last is not None else previous
    return scan, library


def run_passes(run: Run, options: Any, map_files: MapFiles | None = None) -> tuple[Scan, Any]:
    """Both report passes over `run`: per-file partials (`map_files`, default a thread per core, in file order) merged in file
    order. A run without token files is scanned as a whole (empty accumulators)."""
    count = len(run.token_files)
    if count == 0:
        part = passes(run, options)
        return part.scan, part.library
    mapper = map_files or ordered_map
    info = sequence_info(run)  # the whole run's, once: each file's task reads only its own shard
    task = partial(file_partial, str(run.path), options, finish_labels=tuple(info.finish_labels))
    hide = options.silent or count < 2
    parts = []
    with progress(total=count, desc=f"report {run.name}", unit="file", silent=hide) as bar:
        for part in mapper(task, range(count)):
            parts.append(part)
            bar.update(1)
    scan, library = merge_partials(parts)
    scan.info = info
    try:  # B and the duplicate check span the whole sequences table, as one pass over the run does
        rows = sequence_universe(None, pa.table({"seq_id": info.seq_id})).size
    except InputError as exc:
        return scan, exc
    if not isinstance(library, InputError):
        library.rows = rows
    return scan, library
