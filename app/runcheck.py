"""The dashboard's door check of a run, once per file stamp: the validated Run every loader reads from.

Opening a Run validates its structure (rcdiag.store.validate: every file's footer and the seq_id columns of both
tables, ~0.03–0.1 s on a few million tokens and growing with them); each loader opening the run itself paid that
again (the Overview's door check and its judged pass twice, the warming thread's sequence index, sweep and trend
once each). `checked_run` opens and checks it once per (path, stamp) and keeps the Run in memory
(st.cache_resource: the Run holds paths, the manifest and the files' identity stamps, never their data), so every
loader of that stamp shares it. Below app.data and app.judged in the import order (both read it; it reads
neither), so the two can keep importing each other's layer without a cycle.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import streamlit as st

from rcdiag.errors import RunDirError
from rcdiag.store.run import Run, open_run

REQUIRED_TOKEN_COLUMNS = ("seq_id", "pos", "rollout_logprob", "train_logprob", "mask")
"""The token columns a run needs for the dashboard: both sides' log-probs and the keys."""


@st.cache_resource(show_spinner="Checking the run…", max_entries=32)
def checked_run(path: str, stamp: str) -> Run:
    """The run at `path` opened (structure validated) and door-checked — every token file opens and holds training
    log-probs, every sequence file opens — once per file stamp (app.data.file_stamp); raises RunDirError with the
    fix otherwise. Callers only read it (it is shared by every page, section and the warming thread)."""
    run = open_run(path)
    files = run.token_files
    if not files:
        raise RunDirError(f"{path}: the run has no token files (tokens/part-*.parquet)")
    for file in files:
        check_token_file(file)
    for file in run.sequence_files:
        footer(file)
    return run


def validate(path: str, stamp: str) -> dict[str, Any]:
    """The checked run's manifest as plain JSON values (a fresh copy: a page may keep or change it)."""
    return json.loads(json.dumps(checked_run(path, stamp).manifest, default=str))


def footer(file: Path) -> pq.ParquetFile:
    """The file's Parquet footer; RunDirError when it cannot be read (a corrupt or truncated file)."""
    try:
        return pq.ParquetFile(file)
    except (pa.ArrowException, OSError) as exc:
        raise RunDirError(f"{file}: unreadable Parquet file ({exc}); the run is corrupt — re-create it") from None


def check_token_file(file: Path) -> None:
    """RunDirError when a token file lacks REQUIRED_TOKEN_COLUMNS or holds no training log-prob at all (a rollout
    dump that was never rescored): the dashboard has nothing to compare in it."""
    parquet = footer(file)
    names = parquet.schema_arrow.names
    missing = [c for c in REQUIRED_TOKEN_COLUMNS if c not in names]
    if missing:
        raise RunDirError(f"{file}: missing column(s) {missing}; a run needs both sides' log-probs — rescore "
                          "the rollouts with `rcdiag score` (or import a dump that has train log-probs)")
    rows = parquet.metadata.num_rows
    if rows and _null_count(parquet, file) == rows:
        raise RunDirError(f"{file}: train_logprob is empty (rollout log-probs only); rescore the run with "
                          "`rcdiag score` before diagnosing it")


def _null_count(parquet: pq.ParquetFile, file: Path) -> int:
    """Nulls in train_logprob, from row-group statistics when present, else by reading the column."""
    column = parquet.schema_arrow.get_field_index("train_logprob")
    total = 0
    for index in range(parquet.metadata.num_row_groups):
        stats = parquet.metadata.row_group(index).column(column).statistics
        if stats is None or not stats.has_null_count:
            try:
                return pq.read_table(file, columns=["train_logprob"]).column(0).null_count
            except (pa.ArrowException, OSError) as exc:
                raise RunDirError(f"{file}: unreadable Parquet file ({exc}); the run is corrupt") from None
        total += stats.null_count
    return total
