"""The report's one streaming pass over a run: checks, tails, strata and per-sequence sums from each batch.

Memory is bounded by the batch size plus O(#sequences) per-sequence rows; it never holds the token table.
Tokens with NaN/±inf log-probs are counted by the checks and left out of the statistics gathered here (the
metrics refuse them; the report then says so instead of crashing).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.analysis.bootstrap import SequenceSums
from rcdiag.analysis.defaults import DEFAULT_THRESHOLD
from rcdiag.analysis.scan_kernels import scan_update
from rcdiag.analysis.strata import SequenceInfo, StrataAccumulator
from rcdiag.analysis.tails import TailAccumulator
from rcdiag.checks.evidence import CheckAccumulator
from rcdiag.progress import progress
from rcdiag.store.files import DEFAULT_READ_ROWS
from rcdiag.store.schema import column_as_float64, mask_as_bool

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
    """Feed one record batch (SCAN_COLUMNS) into every accumulator."""
    scan.checks.update(batch, file, row0)
    a = column_as_float64(batch, "train_logprob")
    b = column_as_float64(batch, "rollout_logprob")
    keep = mask_as_bool(batch) & np.isfinite(a) & np.isfinite(b)
    rows = {"seq_id": np.asarray(batch.column("seq_id"), dtype=np.int64),
            "pos": np.asarray(batch.column("pos"), dtype=np.int64),
            "token_id": np.asarray(batch.column("token_id").fill_null(-1), dtype=np.int64),
            "train_logprob": a, "rollout_logprob": b, "train_entropy": column_as_float64(batch, "train_entropy")}
    scan_update(scan.tails, scan.strata, scan.sums, rows, keep)


def scan_run(run: Any, *, threshold: float = DEFAULT_THRESHOLD, lower: float | None = None, silent: bool = True,
             batch_size: int = DEFAULT_READ_ROWS) -> Scan:
    """One pass over `run` (a Run). The progress bar (tokens/s) shows on runs ≥ PROGRESS_MIN_TOKENS."""
    info = SequenceInfo.from_table(run.sequence_table(list(SEQUENCE_COLUMNS)))
    scan = new_scan(info, threshold, lower)
    total = run.num_tokens
    offsets: dict[str, int] = {}
    hide = silent or total < PROGRESS_MIN_TOKENS
    with progress(total=total, desc=f"scan {run.name}", unit="tok", unit_scale=True, silent=hide) as bar:
        for file, batch in run.iter_batches(SCAN_COLUMNS, batch_size=batch_size):
            update(scan, batch, file, offsets.get(file, 0))
            offsets[file] = offsets.get(file, 0) + batch.num_rows
            bar.update(batch.num_rows)
    return scan
