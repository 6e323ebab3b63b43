"""The report's one streaming pass over a run: checks, tails, strata and per-sequence sums from each batch.

Memory is bounded by the batch size plus O(#sequences) per-sequence rows; it never holds the token table.
Tokens with NaN/±inf log-probs are counted by the checks and left out of the statistics gathered here (the
metrics refuse them; the report then says so instead of crashing).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.analysis.bootstrap import SequenceSums
from rcdiag.analysis.defaults import DEFAULT_THRESHOLD
from rcdiag.analysis.rows import BatchRows
from rcdiag.analysis.scan_kernels import scan_update
from rcdiag.analysis.strata import SequenceInfo, StrataAccumulator
from rcdiag.analysis.tails import TailAccumulator
from rcdiag.checks.evidence import CheckAccumulator
from rcdiag.store.batches import feed_batches
from rcdiag.store.files import DEFAULT_READ_ROWS

SCAN_COLUMNS = ("seq_id", "pos", "token_id", "rollout_logprob", "train_logprob", "train_entropy", "mask")
SEQUENCE_COLUMNS = ("seq_id", "response_len", "finish_reason", "reward", "prompt_id")
PROGRESS_MIN_TOKENS = 2_000_000
"""Runs with at least this many token rows show a progress bar (unless silent)."""


@dataclass
class Scan:
    """Everything gathered in one pass; each part is a mergeable accumulator."""

    checks: CheckAccumulator
    tails: TailAccumulator
    strata: StrataAccumulator
    sums: SequenceSums
    info: SequenceInfo

    def merge(self, other: Scan) -> Scan:
        self.checks.merge(other.checks)
        self.tails.merge(other.tails)
        self.strata.merge(other.strata)
        self.sums.merge(other.sums)
        return self


def new_scan(info: SequenceInfo, threshold: float, lower: float | None) -> Scan:
    return Scan(CheckAccumulator(), TailAccumulator(), StrataAccumulator(info), SequenceSums(threshold, lower), info)


def update(scan: Scan, batch: pa.RecordBatch, file: str, row0: int) -> None:
    """Feed one record batch (SCAN_COLUMNS) into every accumulator; the columns are decoded once for all of them
    (rcdiag.analysis.rows.BatchRows)."""
    rows = BatchRows(batch)
    scan.checks.update(batch, file, row0, rows)
    scan_update(scan.tails, scan.strata, scan.sums, rows)


def scan_run(run: Any, *, threshold: float = DEFAULT_THRESHOLD, lower: float | None = None, silent: bool = True,
             batch_size: int = DEFAULT_READ_ROWS, keep: Callable[[pa.RecordBatch], pa.Array] | None = None,
             finish_labels: Sequence[str] | None = None) -> Scan:
    """One pass over `run` (a Run); `keep` (rcdiag.store.batches.keep_seq_ids) restricts it to some sequences.
    `finish_labels`: the whole run's finish-reason labels (sequence_info(...).finish_labels) when `run` holds
    only part of the sequences (one shard), so partial strata line up when merged. The progress bar (tokens/s)
    shows on runs ≥ PROGRESS_MIN_TOKENS."""
    info = sequence_info(run)
    if finish_labels is not None:
        info = relabel(info, finish_labels)
    scan = new_scan(info, threshold, lower)
    feed_batches(run, SCAN_COLUMNS, partial(update, scan), keep=keep, batch_size=batch_size,
                 desc=f"scan {run.name}", silent=silent, progress_min_tokens=PROGRESS_MIN_TOKENS)
    return scan


def sequence_info(run: Any) -> SequenceInfo:
    """The per-sequence attributes the scan buckets by, from `run`'s sequences files (O(#sequences))."""
    return SequenceInfo.from_table(run.sequence_table(list(SEQUENCE_COLUMNS)))


def relabel(info: SequenceInfo, labels: Sequence[str]) -> SequenceInfo:
    """`info` with its finish codes re-pointed into `labels` (sorted, a superset of info's own labels)."""
    own = np.asarray(info.finish_labels, dtype=str)
    codes = np.searchsorted(np.asarray(labels, dtype=str), own)[info.finish] if own.size else info.finish
    return replace(info, finish=np.asarray(codes, dtype=np.int64), finish_labels=list(labels))
