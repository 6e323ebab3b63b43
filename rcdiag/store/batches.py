"""The one streaming loop over a run's token files, shared by the report's scan (rcdiag.report.scan), the checks
(rcdiag.checks.evidence.accumulate) and the dashboard's filtered distributions (app.aggregates).

Each record batch is handed to `feed(batch, file, row0)` with `row0` the batch's first row in its file, counted
before any filtering, so evidence locates rows in the file as written. Memory is bounded by the batch size.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rcdiag.progress import progress
from rcdiag.store.files import DEFAULT_READ_ROWS

Feed = Callable[[pa.RecordBatch, str, int], None]
"""Consumes one record batch: (batch, file name as `tokens/part-NNNNN.parquet`, first row's index in the file)."""


def keep_seq_ids(seq_ids: Any) -> Callable[[pa.RecordBatch], pa.Array]:
    """A keep-filter: rows whose seq_id is in `seq_ids` (any integer array-like)."""
    value_set = pa.array(np.asarray(seq_ids, dtype=np.int64), pa.int64())
    return lambda batch: pc.is_in(batch.column("seq_id"), value_set=value_set)


def feed_batches(run: Any, columns: Sequence[str], feed: Feed, *,
                 keep: Callable[[pa.RecordBatch], pa.Array] | None = None, batch_size: int = DEFAULT_READ_ROWS,
                 desc: str = "scan", silent: bool = True, progress_min_tokens: int = 0) -> None:
    """Stream `run`'s token table (`columns`) through `feed`, file by file in order. `keep` (a boolean mask per
    batch, e.g. `keep_seq_ids(ids)`) drops rows first; batches left empty are skipped. The progress bar
    (tokens/s) shows unless `silent` or the run has fewer than `progress_min_tokens` rows."""
    hide = silent or run.num_tokens < progress_min_tokens
    offsets: dict[str, int] = {}
    with progress(total=None if hide else run.num_tokens, desc=desc, unit="tok", unit_scale=True,
                  silent=hide) as bar:
        for file, batch in run.iter_batches(list(columns), batch_size=batch_size):
            row0 = offsets.get(file, 0)
            offsets[file] = row0 + batch.num_rows
            bar.update(batch.num_rows)
            if keep is not None:
                batch = batch.filter(keep(batch))
                if not batch.num_rows:
                    continue
            feed(batch, file, row0)
