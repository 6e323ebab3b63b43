"""The door check of a run directory: every Parquet file against its column schema, once, when the run is opened.

Every reader downstream (the checks, the report's passes, the dashboard) trusts what this lets through, so a
damaged run stops here with the file, row and field to fix — not later as a numpy or Arrow traceback (a `mask`
stored as strings, a `reward` of strings, a duplicated sequence row, an extra sequences shard, token rows whose
seq_id has no sequence row, a null key). What it reads: every file's footer (column types, null counts), the
`seq_id` columns of both tables (a token file's only when its footer's min / max leave room for an unknown id).
Optional columns may be absent (the readers fill them with nulls).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rcdiag.errors import InputError, RunDirError
from rcdiag.store.files import check_regular
from rcdiag.store.schema import FULL_SEQUENCE_SCHEMA, FULL_TOKEN_SCHEMA, KEY_COLUMNS, type_problem

FIX = "the run is damaged: re-create it (re-run the import or `rcdiag score`)"
REQUIRED = {"tokens": KEY_COLUMNS, "sequences": ("seq_id",)}
SCHEMAS = {"tokens": FULL_TOKEN_SCHEMA, "sequences": FULL_SEQUENCE_SCHEMA}  # the optional columns typed too


def validate_run(path: Path, token_files: list[Path], sequence_files: list[Path]) -> None:
    """Raise InputError (file/row/field, rows counted from 1) or RunDirError at the first structural defect."""
    for file in (*token_files, *sequence_files):  # a FIFO named part-00000.parquet would block the reader forever
        check_regular(file, "shard")
    _same_shards(path, token_files, sequence_files)
    known = _sequence_ids(path, sequence_files)
    for file in token_files:
        parquet = _checked(path, file, "tokens")
        if ids_all_known(parquet, known):
            continue
        ids = _ids(parquet)
        heads = np.concatenate((ids[:1], ids[1:][ids[1:] != ids[:-1]]))  # one id per run of equal ids
        orphans = np.unique(heads[~is_member(known, heads)])
        if orphans.size:
            row = int(np.flatnonzero(np.isin(ids, orphans))[0])
            raise InputError(f"seq_id {int(orphans[0])} has token rows but no row in sequences/ "
                             f"({orphans.size} such seq_id(s) in this file)", file=_rel(path, file), row=row + 1,
                             field="seq_id", hint=FIX)


def is_member(known: np.ndarray, values: np.ndarray) -> np.ndarray:
    """bool [len(values)]: which values are in `known` (sorted, unique). A token file's ~1M seq_ids are first
    reduced to one per run of equal ids (sorted files: one per sequence); np.setdiff1d hashed all of them, 0.5 s
    of a 50 M-token run's opening (issue #15)."""
    if known.size == 0:
        return np.zeros(values.size, dtype=bool)
    where = np.minimum(np.searchsorted(known, values), known.size - 1)
    return known[where] == values


def _rel(path: Path, file: Path) -> str:
    return f"{path}/{file.parent.name}/{file.name}"


def _same_shards(path: Path, token_files: list[Path], sequence_files: list[Path]) -> None:
    tokens, sequences = {f.name for f in token_files}, {f.name for f in sequence_files}
    for name in sorted(tokens ^ sequences):
        have, lack = ("sequences", "tokens") if name in sequences else ("tokens", "sequences")
        raise RunDirError(f"{path}/{have}/{name} has no matching {lack}/{name}: shards come in pairs (an extra or "
                          f"a missing shard file) — remove the stray file or {FIX}")


def _parquet(path: Path, file: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(file)
    except (pa.ArrowInvalid, OSError) as exc:
        raise RunDirError(f"{_rel(path, file)}: unreadable Parquet file ({exc}); {FIX}") from None


def _check_types(path: Path, file: Path, parquet: pq.ParquetFile, table: str) -> None:
    schema = parquet.schema_arrow  # a property that converts the Parquet schema on every access
    names = schema.names
    for name in REQUIRED[table]:
        if name not in names:
            raise InputError(f"missing required column '{name}' (have: {', '.join(names)})", file=_rel(path, file),
                             field=name, hint=FIX)
    for field in SCHEMAS[table]:
        if field.name in names:
            problem = type_problem(schema.field(field.name).type, field)
            if problem:
                raise InputError(problem, file=_rel(path, file), field=field.name, hint=FIX)


def _checked(path: Path, file: Path, table: str) -> pq.ParquetFile:
    """The file opened, its column types checked and no null in its key columns (from the footer's null counts;
    the column is read only where a row group has none or some)."""
    parquet = _parquet(path, file)
    _check_types(path, file, parquet, table)
    for name in REQUIRED[table]:
        column = None
        for g in range(parquet.num_row_groups):
            stats = _leaf_statistics(parquet, g, name)
            if stats is None or not stats.has_null_count or stats.null_count:
                column = parquet.read(columns=[name]).column(0)
                break
        if column is not None and column.null_count:
            row = int(np.flatnonzero(np.asarray(pc.is_null(column)))[0])
            raise InputError("is null; every row needs one", file=_rel(path, file), row=row + 1, field=name, hint=FIX)
    return parquet


def _ids(parquet: pq.ParquetFile) -> np.ndarray:
    """The file's seq_id column as int64 numpy (nulls already refused by _checked)."""
    return np.asarray(parquet.read(columns=["seq_id"]).column(0), dtype=np.int64)


def _leaf_statistics(parquet: pq.ParquetFile, group: int, name: str) -> pq.Statistics | None:
    """Row group `group`'s footer statistics of the top-level column `name`, None when absent — or when the Parquet
    leaf at Arrow's field index is another column's (a struct column before it has several leaves), so that a
    caller never reads a neighbour's null count or min / max as this column's."""
    column = parquet.metadata.row_group(group).column(parquet.schema_arrow.get_field_index(name))
    return column.statistics if column.path_in_schema == name else None


def ids_all_known(parquet: pq.ParquetFile, known: np.ndarray) -> bool:
    """True when the footer proves every seq_id of the file is in `known` (sorted, unique): the row groups'
    min / max span [lo, hi] and `known` holds all hi − lo + 1 integers of it. A token file of contiguous ids — what
    every importer and `rcdiag score` write — then needs no read of its ~1 M ids (~2 ms a file, ~8 % of `analyze` on
    a 10 M-token run). Statistics missing anywhere, or a gap in the range: False (the caller reads the column)."""
    if parquet.metadata.num_rows == 0:
        return True
    groups = [_leaf_statistics(parquet, g, "seq_id") for g in range(parquet.num_row_groups)]
    if not all(s is not None and s.has_min_max and isinstance(s.min, int) and isinstance(s.max, int) for s in groups):
        return False
    lo, hi = min(s.min for s in groups), max(s.max for s in groups)
    if lo < np.iinfo(np.int64).min or hi > np.iinfo(np.int64).max:  # a uint64 id beyond int64: read the column
        return False
    inside = int(np.searchsorted(known, hi, side="right") - np.searchsorted(known, lo, side="left"))
    return inside == hi - lo + 1


def _sequence_ids(path: Path, files: list[Path]) -> np.ndarray:
    """All seq_ids of sequences/, refusing a seq_id that appears twice (in one file or across two)."""
    parts = [_ids(_checked(path, file, "sequences")) for file in files]
    ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    unique, first, counts = np.unique(ids, return_index=True, return_counts=True)
    if np.any(counts > 1):
        dup = int(unique[np.flatnonzero(counts > 1)[0]])
        where = [(file, int(r) + 1) for file, part in zip(files, parts, strict=True)
                 for r in np.flatnonzero(part == dup)]
        (file, row), (file2, row2) = where[0], where[1]
        raise InputError(f"seq_id {dup} appears twice (again at {_rel(path, file2)} row {row2}); "
                         f"{int((counts > 1).sum())} duplicated seq_id(s) in sequences/", file=_rel(path, file),
                         row=row, field="seq_id", hint="remove the duplicated rows or the extra shard, or " + FIX)
    return unique
