"""Cached loaders of the dashboard: every number comes from the rcdiag library, cached on (run path, file stamp).

Each loader takes `(path, stamp)` first: `path` is the resolved run directory, `stamp` a hash of the size, inode
and mtime of every file of the run (manifest, token and sequence shards; `file_stamp`), so re-writing or replacing
any shard invalidates every cached value of that run — one stat per file per page, never a read.
Loaders return plain dicts and DataFrames (picklable, as `st.cache_data` requires) and raise rcdiag errors, which
the pages show as messages.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import streamlit as st

from app import runcheck
from rcdiag.analysis.conventions import DEFAULT_CONVENTION
from rcdiag.errors import RunDirError
from rcdiag.store.files import MANIFEST_NAME, SEQUENCES_DIR, TOKENS_DIR
from rcdiag.tokenizers import fast_tokenizer, manifest_tokenizer_dir

INDEX_COLUMNS = ("seq_id", "prompt_id", "sample_index", "response_len", "finish_reason", "reward", "step")
"""Sequence metadata kept in the (cached, paged) sequence index; the texts are read per selected sequence."""


@dataclass(frozen=True)
class RunRef:
    """A validated run: resolved path, file stamp (the cache key, `file_stamp`) and the manifest."""

    path: str
    stamp: str
    manifest: dict[str, Any]

    @property
    def key(self) -> tuple[str, str]:
        return self.path, self.stamp

    @property
    def name(self) -> str:
        return Path(self.path).name


def open_ref(path: str | Path) -> RunRef:
    """Resolve and validate a run directory (runcheck.checked_run: once per file stamp, shared by every loader);
    raises RunDirError with the fix when it is not a usable run."""
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_dir():
        raise RunDirError(f"{path}: no such directory")
    manifest_file = resolved / MANIFEST_NAME
    if not manifest_file.is_file():
        raise RunDirError(f"{path}: not a run directory (no {MANIFEST_NAME}); choose a directory written by "
                          "`rcdiag score` or `rcdiag import` (an interrupted score resumes when re-run)")
    stamp = file_stamp(resolved)
    return RunRef(str(resolved), stamp, runcheck.validate(str(resolved), stamp))


def file_stamp(path: Path) -> str:
    """Hash of (name, size, inode, mtime_ns) of the manifest and every token and sequence shard: changes whenever
    a file of the run is rewritten, added or removed (stat calls only; rcdiag.report.cache's key also hashes the
    files' footers, once per pass)."""
    entries = []
    for folder in (path, path / TOKENS_DIR, path / SEQUENCES_DIR):
        try:
            with os.scandir(folder) as items:
                for item in items:
                    if item.is_file() and (item.name == MANIFEST_NAME or item.name.endswith(".parquet")):
                        info = item.stat()
                        entries.append((str(Path(item.path).relative_to(path)), info.st_size, info.st_ino,
                                        info.st_mtime_ns))
        except OSError:
            continue
    return hashlib.sha256(json.dumps(sorted(entries)).encode()).hexdigest()[:32]


# --------------------------------------------------------------------------------------------------- simulator
UNCORRECTED = 1e300
"""A threshold no ratio reaches: the "no correction" row of `sweep_grid` (weights as the raw ratios)."""


def threshold_grid() -> tuple[float, ...]:
    """The simulator's thresholds: C − 1 log-spaced from 0.01 to 19 (finer near 1, where the metrics move most),
    plus the report's sweep thresholds, rounded to 3 significant digits, ascending."""
    from rcdiag.analysis.defaults import DEFAULT_THRESHOLDS

    dense = 1.0 + np.logspace(-2.0, np.log10(19.0), 57)
    return tuple(sorted({float(f"{c:.3g}") for c in (*dense, *DEFAULT_THRESHOLDS)}))


@st.cache_data(show_spinner="Sweeping thresholds…", max_entries=64)
def sweep_grid(path: str, stamp: str, modes: tuple[str, ...], lower: float | None,
               convention: str = DEFAULT_CONVENTION) -> pd.DataFrame:
    """`rcdiag.sweep` of `modes` over `threshold_grid()` plus the uncorrected row (threshold UNCORRECTED), in one
    pass: one row per mode × threshold, columns mode, threshold, IS metrics."""
    from rcdiag.analysis.correction.modes import sweep as sweep_

    return sweep_(runcheck.checked_run(path, stamp), modes=modes, thresholds=(*threshold_grid(), UNCORRECTED), lower=lower,
                  convention=convention)


@st.cache_data(show_spinner="Measuring every step…", max_entries=16)
def trend_frame(path: str, stamp: str, convention: str, threshold: float) -> pd.DataFrame:
    """rcdiag.trend of the run (token_truncate at `threshold`, 200 bootstrap replicates per step)."""
    from rcdiag.analysis.training.trend import trend

    return trend(runcheck.checked_run(path, stamp), convention, "token_truncate", threshold, replicates=200)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


# --------------------------------------------------------------------------------------------------- sequences
SORT_KEYS = {"max |ℓ|": "max_abs_log_ratio", "mean |ℓ|": "mean_abs_log_ratio", "sequence ratio": "seq_ratio",
             "log-PPL diff": "log_ppl_diff", "seq_id": "seq_id"}
"""The Sequences page's sort choices: label → sequence_stats column (absent columns are not offered); the first,
descending, is the page's default order (app.warm reads the first sequence of it ahead of the page)."""
@st.cache_data(show_spinner="Indexing sequences…", max_entries=32)
def sequence_index(path: str, stamp: str) -> pd.DataFrame:
    """One row per sequence (RangeIndex, sorted by seq_id): `rcdiag.analysis.metrics.compute.sequence_stats`'s columns —
    from the report's cached per-sequence sums (app.judged), else from the library's own pass — joined with the
    sequence metadata (INDEX_COLUMNS, no texts). Sequences without valid tokens have n_valid 0 and NaN stats."""
    from app import judged
    from rcdiag.analysis.metrics.compute import sequence_stats

    run = runcheck.checked_run(path, stamp)
    meta = run.sequences(list(INDEX_COLUMNS))
    stats = judged.sequence_stats(path, stamp)
    if stats is None:
        stats = sequence_stats(run)
    extra = [c for c in stats.columns if c == "seq_id" or c not in meta.columns]
    return meta.merge(stats[extra], on="seq_id", how="left").reset_index(drop=True)


@st.cache_data(max_entries=32, show_spinner=False)  # a sort of the cached index: no spinner timer thread
def sequence_order(path: str, stamp: str, column: str, descending: bool) -> np.ndarray:
    """Row positions of `sequence_index` sorted by `column` (NaN last, ties by seq_id): int64 [#sequences]."""
    index = sequence_index(path, stamp)
    order = index.sort_values([column, "seq_id"], ascending=[not descending, True], na_position="last",
                              kind="stable")
    return order.index.to_numpy(dtype=np.int64)


@st.cache_data(max_entries=256, show_spinner=False)  # a point read: no spinner timer thread per sequence
def sequence_detail(path: str, stamp: str, seq_id: int) -> tuple[dict[str, Any], pd.DataFrame]:
    """(sequence row with texts, its token rows sorted by pos) read with a seq_id filter (row-group pruning)."""
    run = runcheck.checked_run(path, stamp)
    meta = _filtered(run.sequence_files, seq_id, None)
    if meta.num_rows == 0:
        raise RunDirError(f"{path}: no sequence with seq_id {seq_id}")
    row = meta.slice(0, 1).to_pylist()[0]
    tokens = _filtered(run.token_files, seq_id, ["seq_id", "pos", "token_id", "rollout_logprob", "train_logprob",
                                                   "train_entropy", "mask"])
    return row, tokens.to_pandas().sort_values("pos", ignore_index=True)


def _filtered(files: list[Path], seq_id: int, columns: list[str] | None) -> pa.Table:
    tables = []
    for file in files:
        try:
            table = pq.read_table(file, columns=columns, filters=[("seq_id", "=", int(seq_id))])
        except (pa.ArrowException, OSError) as exc:
            raise RunDirError(f"{file}: unreadable Parquet file ({exc}); the run is corrupt — re-create it") from None
        if table.num_rows:
            tables.append(table)
    if not tables:
        return pa.table({"seq_id": pa.array([], pa.int64())}) if columns is None else _empty(files, columns)
    return pa.concat_tables(tables)


def _empty(files: list[Path], columns: list[str]) -> pa.Table:
    schema = runcheck.footer(files[0]).schema_arrow if files else pa.schema([])
    return pa.Table.from_pylist([], schema=pa.schema([schema.field(c) for c in columns]))


def decode_tokens(manifest: dict[str, Any], token_ids: tuple[int, ...]) -> list[str] | None:
    """Each token's text with the run's tokenizer (rcdiag.tokenizers.fast_tokenizer: tokenizer.json of the local
    tokenizer or engine model directory the manifest names), or None when there is none."""
    tokenizer = _tokenizer(manifest_tokenizer_dir(manifest))
    if tokenizer is None:
        return None
    return [tokenizer.decode([int(t)], skip_special_tokens=False) for t in token_ids]


@st.cache_resource(max_entries=4)
def _tokenizer(directory: str | None) -> Any:
    """The loaded tokenizer of `directory`, once per server (None: no tokenizer)."""
    return None if directory is None else fast_tokenizer({"tokenizer": {"path": directory}})


def seq_ids_where(index: pd.DataFrame, finish: tuple[str, ...] | None, reward: tuple[float, float] | None,
                  length: tuple[int, int] | None) -> np.ndarray:
    """seq_ids of the index rows passing the filters (None = no filter on that field); int64, sorted."""
    keep = np.ones(len(index), dtype=bool)
    if finish is not None:
        keep &= index["finish_reason"].fillna("(none)").isin(finish).to_numpy()
    if reward is not None:
        values = index["reward"].to_numpy(dtype=float, na_value=np.nan)
        keep &= (values >= reward[0]) & (values <= reward[1])
    if length is not None:
        values = index["response_len"].to_numpy(dtype=float, na_value=np.nan)
        keep &= (values >= length[0]) & (values <= length[1])
    return np.sort(index["seq_id"].to_numpy(dtype=np.int64)[keep])
