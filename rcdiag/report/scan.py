"""The report's one streaming pass over a run: checks, tails, strata and per-sequence sums from each batch.

Memory is bounded by the batch size plus O(#sequences) per-sequence rows; it never holds the token table.
Tokens with NaN/±inf log-probs are counted by the checks and left out of the statistics gathered here (the
metrics refuse them; the report then says so instead of crashing).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from rcdiag.analysis.defaults import DEFAULT_THRESHOLD
from rcdiag.analysis.distributions.scan_kernels import scan_update
from rcdiag.analysis.distributions.strata import SequenceInfo, StrataAccumulator
from rcdiag.analysis.distributions.tails import TailAccumulator
from rcdiag.analysis.metrics.bootstrap import SequenceSums
from rcdiag.analysis.passes.accum import BatchConsumer, ChunkConsumer, Totals
from rcdiag.analysis.passes.chunks import Chunker, TokenChunk
from rcdiag.analysis.passes.engine import MapFiles, run_pass
from rcdiag.analysis.passes.kernels import C_T
from rcdiag.analysis.passes.rows import BatchRows
from rcdiag.checks.evidence import CheckAccumulator
from rcdiag.store.files import DEFAULT_READ_ROWS
from rcdiag.store.run import Run

SCAN_COLUMNS = ("seq_id", "pos", "token_id", "rollout_logprob", "train_logprob", "train_entropy", "mask")
SEQUENCE_COLUMNS = ("seq_id", "response_len", "finish_reason", "reward", "prompt_id")
PROGRESS_MIN_TOKENS = 2_000_000
"""Runs with at least this many token rows show a progress bar (unless silent)."""


@dataclass
class Scan(BatchConsumer, ChunkConsumer):
    """Everything the report gathers from every row (refused rows included: the checks exist to find them): the
    checks' evidence from each batch as read, the tails, strata and per-sequence table from each chunk (whole
    sequences; after a refused row, cut but not validated, its non-finite rows left out). Each part is a mergeable
    accumulator; the chunk's row terms and per-sequence table are the library's own (one computation)."""

    checks: CheckAccumulator
    tails: TailAccumulator
    strata: StrataAccumulator
    sums: SequenceSums
    info: SequenceInfo
    columns: ClassVar[tuple[str, ...]] = SCAN_COLUMNS
    strict: ClassVar[bool] = False
    chunk_columns: ClassVar[tuple[str, ...]] = ("entropy", "token_id")

    def update_batch(self, rows: BatchRows, file: str, row0: int) -> None:
        """The checks' evidence of one record batch (decoded once for every consumer)."""
        self.checks.update(rows.batch, file, row0, rows)

    def update_chunk(self, chunk: TokenChunk) -> None:
        """Tails, strata and the per-sequence table of one chunk."""
        table = chunk.table(self.sums.threshold, self.sums.lower)
        scan_update(self.tails, self.strata, chunk, table)
        scored = table[C_T] > 0  # the sequences with a kept row (table() adds the others' zero rows)
        self.sums.add(chunk.seq_ids, table) if scored.all() else self.sums.add(chunk.seq_ids[scored],
                                                                               table[:, scored])

    def fresh(self) -> Scan:
        return new_scan(self.info, self.sums.threshold, self.sums.lower)

    def merge(self, other: Scan) -> Scan:
        self.checks.merge(other.checks)
        self.tails.merge(other.tails)
        self.strata.merge(other.strata)
        self.sums.merge(other.sums)
        return self

    def finish(self, totals: Totals) -> dict[str, Any]:
        """{"tails": TAIL_NAMES statistics, "strata": per-bucket rows}; the checks are judged from `checks`
        (rcdiag.checks.verdicts), the intervals from `sums`."""
        return {"tails": self.tails.finish(), "strata": self.strata.finish()}


def new_scan(info: SequenceInfo, threshold: float, lower: float | None) -> Scan:
    return Scan(CheckAccumulator(), TailAccumulator(), StrataAccumulator(info), SequenceSums(threshold, lower), info)


def update(scan: Scan, batch: pa.RecordBatch, file: str, row0: int) -> None:
    """Feed one record batch (SCAN_COLUMNS) holding whole sequences, as one stream: its batch and its chunks (cut,
    not validated: the scan reports on refused rows too)."""
    rows = BatchRows(batch)
    scan.update_batch(rows, file, row0)
    chunker = Chunker(Scan.chunk_columns)
    for chunk in [*chunker.push(file, rows, validate=False), chunker.flush()]:
        if chunk is not None:
            scan.update_chunk(chunk)


def scan_parts(shard: Run, threshold: float, lower: float | None, finish_labels: Sequence[str] | None) -> Scan:
    """A file's fresh scan: its shard's sequence attributes, finish codes relabelled to `finish_labels` (the whole
    run's) so that partial strata line up when merged."""
    info = sequence_info(shard)
    return new_scan(info if finish_labels is None else relabel(info, finish_labels), threshold, lower)


@dataclass(frozen=True)
class ScanParts:
    """The engine's `make` of a scan-only pass (picklable)."""

    threshold: float
    lower: float | None
    finish_labels: tuple[str, ...] | None

    def __call__(self, shard: Run | None) -> list[Scan]:
        return [scan_parts(shard, self.threshold, self.lower, self.finish_labels)]


def scan_run(run: Any, *, threshold: float = DEFAULT_THRESHOLD, lower: float | None = None, silent: bool = True,
             batch_size: int = DEFAULT_READ_ROWS, keep: Callable[[pa.RecordBatch], pa.Array] | None = None,
             finish_labels: Sequence[str] | None = None, map_files: MapFiles | None = None) -> Scan:
    """One pass over `run` (a Run, a file at a time on a thread per core); `keep`
    (rcdiag.store.batches.keep_seq_ids) restricts it to some sequences. `finish_labels`: the finish-reason labels
    to line the strata up on (default the run's own). The progress bar (tokens/s) shows on runs ≥
    PROGRESS_MIN_TOKENS."""
    info = sequence_info(run)
    labels = tuple(info.finish_labels if finish_labels is None else finish_labels)
    merged = run_pass(run, ScanParts(threshold, lower, labels), map_files=map_files, batch_rows=batch_size,
                      keep=keep, silent=silent or run.num_tokens < PROGRESS_MIN_TOKENS, desc=f"scan {run.name}")
    scan = merged.consumers[0]
    scan.info = info if finish_labels is None else relabel(info, labels)
    return scan


def sequence_info(run: Any) -> SequenceInfo:
    """The per-sequence attributes the scan buckets by, from `run`'s sequences files (O(#sequences))."""
    return SequenceInfo.from_table(run.sequence_table(list(SEQUENCE_COLUMNS)))


def relabel(info: SequenceInfo, labels: Sequence[str]) -> SequenceInfo:
    """`info` with its finish codes re-pointed into `labels` (sorted, a superset of info's own labels)."""
    own = np.asarray(info.finish_labels, dtype=str)
    codes = np.searchsorted(np.asarray(labels, dtype=str), own)[info.finish] if own.size else info.finish
    return replace(info, finish=np.asarray(codes, dtype=np.int64), finish_labels=list(labels))
