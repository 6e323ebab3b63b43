"""Reading a run directory: `Run` (pandas, Arrow and streaming readers) and `open_run`.

Layout (docs/design.md)::

    <run>/manifest.json            written last; its presence marks the run complete
    <run>/sequences/part-NNNNN.parquet
    <run>/tokens/part-NNNNN.parquet

The Jupyter conveniences (run.metrics(), run.plot, the HTML card) live in rcdiag.notebook, whose `Run` subclasses
this one; `rcdiag.open_run` returns that subclass.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rcdiag.errors import RunDirError, did_you_mean
from rcdiag.store.files import (
    DEFAULT_READ_ROWS,
    MANIFEST_NAME,
    SEQUENCES_DIR,
    TOKENS_DIR,
)
from rcdiag.store.manifest import Manifest, load_manifest
from rcdiag.store.schema import SEQUENCE_SCHEMA, TOKEN_SCHEMA, conform, optional_columns
from rcdiag.store.validate import validate_run


def missing_run(path: str | os.PathLike) -> RunDirError:
    """The error for a run directory that does not exist, naming the close matches beside it (a typo such as
    runs/smaple → "did you mean runs/sample?"; directories holding a manifest first), or for a path that is not a
    directory (a dump given where a run is read: how to import it)."""
    path = Path(path)
    if path.exists():  # a trainer's dump given to a command that reads runs: say what to do with it
        return RunDirError(f"{path}: not a run directory (a run is a directory with {MANIFEST_NAME}, "
                           f"{TOKENS_DIR}/ and {SEQUENCES_DIR}/); a trainer's dump becomes one with "
                           f"`rcdiag import FORMAT {path} --out RUN`")
    parent = path.parent
    try:
        entries = [e for e in parent.iterdir() if e.is_dir()] if parent.is_dir() else []
    except OSError:
        entries = []
    runs = {e.name for e in entries if (e / MANIFEST_NAME).is_file()}
    hint = did_you_mean(path.name, sorted(e.name for e in entries), show=lambda c: str(parent / c), prefer=runs)
    return RunDirError(f"{path}: no such run directory{hint}")


class Run:
    """A complete run directory, read lazily.

    `tokens()` / `sequences()` load pandas DataFrames; `iter_batches()` streams Arrow record batches of the token
    table (memory bounded by the batch size); `shards()` yields (tokens, sequences) Arrow tables per shard.
    """

    def __init__(self, path: str | os.PathLike, *, validate: bool = True, shard: int | None = None):
        """`validate`: check the run's structure at the door (rcdiag.store.validate: reads every file's seq_id
        column). A caller re-opening a run that was already opened and validated in this job — a report's per-file
        task — passes False instead of paying that read once per file. `shard`: see `Run.shard`."""
        self.path = Path(path)
        self.shard_index = shard
        """None for the whole run; k for the run restricted to its shard k (`Run.shard`)."""
        if not self.path.is_dir():
            raise missing_run(self.path)
        self.info: Manifest = load_manifest(self.path)
        """The typed manifest (rcdiag.store.manifest.Manifest)."""
        self.manifest: dict[str, Any] = self.info.to_dict()
        """The same manifest as a plain (normalised) dict, for JSON-minded code."""
        self._tokens, self._sequences = committed_shards(self.path, self.info.counts.get("shards"))
        if shard is not None and not 0 <= shard < len(self._tokens):
            raise IndexError(f"{self.path}: no token file {shard}")
        self.generation: dict[Path, tuple[int, ...]] = stamps(list(dict.fromkeys([*self.token_files,
                                                                                   *self.sequence_files])))
        """The identity (inode, size, mtime) of every shard file this Run reads, taken when it was opened:
        `check_unchanged` holds the files against it after a pass, so a run rewritten meanwhile is never read as a
        mix of two runs. A shard's Run (one per file task of every pass) stamps only its own files: stamping the
        whole run in each task cost N² stats (500 shards: 13.7 s of stat calls per pass)."""
        if validate:
            validate_run(self.path, self.token_files, self.sequence_files)

    def __repr__(self) -> str:
        counts = self.manifest.get("counts", {})
        return (f"Run({str(self.path)!r}, sequences={counts.get('sequences')}, tokens={counts.get('tokens')}, "
                f"source={self.manifest.get('source', {}).get('kind')!r})")

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def token_files(self) -> list[Path]:
        """The token shards as listed when the Run was opened (a shard a writer adds later is not seen)."""
        files = self._tokens
        return list(files) if self.shard_index is None else [files[self.shard_index]]

    @property
    def sequence_files(self) -> list[Path]:
        files = self._sequences
        if self.shard_index is None:
            return list(files)
        own = self.path / SEQUENCES_DIR / self.token_files[0].name
        return [own] if own in files else list(files)

    def changed(self) -> str | None:
        """What happened to the files this Run read since it was opened — a shard replaced, rewritten or removed
        (`import --overwrite` swapping a new run in, `score --overwrite` rewriting it in place) — in words, or
        None. Shards a writer appended since (the Recorder's next step) are not a change: the Run reads the run as
        it was when opened."""
        now = stamps(list(self.generation))
        for file, stamp in self.generation.items():
            if now.get(file) != stamp:
                what = "removed" if file not in now else "replaced" if now[file][0] != stamp[0] else "rewritten"
                return f"{file.parent.name}/{file.name} was {what}"
        return None

    def check_unchanged(self) -> None:
        """RunDirError when the run's files changed while they were read (`changed`): the numbers would mix two
        runs. Every pass over a run ends with it, and the report checks it again before writing anything."""
        what = self.changed()
        if what is not None:
            raise RunDirError(f"{self.path}: the run changed while rcdiag read it ({what}: another process rewrote "
                              "it); nothing was written — run the command again once the writer has finished")

    def reopen(self) -> Run:
        """This run read again after a stage of this job rewrote it in place — `rcdiag score --rescore-both`'s
        replay writes the rollout column and the engine section, then rescoring reads them: the manifest and the
        files' identities are taken anew, the door check (`validate`, a read of every file's seq_id column) is not
        repeated, since a stage rewrites columns, never which sequences a shard holds."""
        return type(self)(self.path, validate=False, shard=self.shard_index)

    def shard(self, index: int) -> Run:
        """The run restricted to its token file `index` (sorted order) and that file's own sequences file — shard k
        of tokens/ and sequences/ hold the same sequences; a token file without a same-named sequences file sees
        them all. What one file's task of a pass reads (rcdiag.analysis.passes.engine); not validated again."""
        return type(self)(self.path, validate=False, shard=index)

    @property
    def num_tokens(self) -> int:
        return sum(_parquet(f).metadata.num_rows for f in self.token_files)

    @property
    def num_sequences(self) -> int:
        return sum(_parquet(f).metadata.num_rows for f in self.sequence_files)

    def tokens(self, columns: Sequence[str] | None = None) -> Any:
        """All token rows as a pandas DataFrame (sorted by seq_id, pos)."""
        return self.token_table(columns).to_pandas()

    def sequences(self, columns: Sequence[str] | None = None) -> Any:
        """All sequence rows as a pandas DataFrame (sorted by seq_id)."""
        return _read_tables(self.sequence_files, columns, SEQUENCE_SCHEMA).to_pandas()

    def token_table(self, columns: Sequence[str] | None = None, *, seq_ids: Any = None) -> pa.Table:
        """The token table (Arrow); `seq_ids` (integer array-like): only those sequences' rows, read with a
        Parquet filter (row groups whose seq_id statistics exclude them are skipped)."""
        return _read_tables(self.token_files, columns, TOKEN_SCHEMA, seq_ids)

    def sequence_table(self, columns: Sequence[str] | None = None, *, seq_ids: Any = None) -> pa.Table:
        """The sequences table (Arrow); `seq_ids`: only those rows, as for `token_table`."""
        return _read_tables(self.sequence_files, columns, SEQUENCE_SCHEMA, seq_ids)

    def iter_batches(self, columns: Sequence[str] | None = None,
                     batch_size: int = DEFAULT_READ_ROWS) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Stream the token table as (file name, record batch) pairs; a batch never mixes files."""
        for file in self.token_files:
            parquet = _parquet(file)
            for batch in parquet.iter_batches(batch_size=batch_size, columns=_existing(parquet, file, columns)):
                yield f"{TOKENS_DIR}/{file.name}", batch

    def shards(self, token_columns: Sequence[str] | None = None) -> Iterator[tuple[int, pa.Table, pa.Table]]:
        """Yield (shard index, tokens table, sequences table) for each complete shard."""
        for seq_file in self.sequence_files:
            index = int(seq_file.stem.split("-")[1])
            tok_file = self.path / TOKENS_DIR / seq_file.name
            yield index, _read_tables([tok_file], token_columns, TOKEN_SCHEMA), _read_tables([seq_file], None,
                                                                                            SEQUENCE_SCHEMA)


def committed_shards(path: Path, recorded: int | None = None) -> tuple[list[Path], list[Path]]:
    """(token files, sequence files) of the run at `path`, sorted, without a shard still being written: a writer
    renames a shard's tokens file first and its sequences file last (the commit), so a tokens file past the last
    sequences file is a shard in progress (the Recorder between its two renames) — unless the manifest, written
    after a shard is complete, already counts it (`recorded`): then its sequences file went missing, and the door
    check says so."""
    tokens = sorted((path / TOKENS_DIR).glob("part-*.parquet"))
    sequences = sorted((path / SEQUENCES_DIR).glob("part-*.parquet"))
    last = sequences[-1].name if sequences else ""
    pending = [f for f in tokens if f.name > last]
    if pending and (recorded is None or recorded <= len(sequences)):
        tokens = tokens[:len(tokens) - len(pending)]
    return tokens, sequences


def stamps(files: Sequence[Path]) -> dict[Path, tuple[int, ...]]:
    """(inode, size, mtime_ns) of each file that exists: a file replaced by rename has a new inode, one rewritten
    in place a new size or mtime (ctime is left out: a chmod, a read-only mount's preparation, is no change)."""
    out = {}
    for file in files:
        try:
            info = os.stat(file)
        except OSError:
            continue
        out[file] = (info.st_ino, info.st_size, info.st_mtime_ns)
    return out


def _parquet(file: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(file)
    except (pa.ArrowInvalid, OSError) as exc:
        raise unreadable(file, exc) from None


def _existing(parquet: pq.ParquetFile, file: Path, columns: Sequence[str] | None) -> list[str] | None:
    if columns is None:
        return None
    names = parquet.schema_arrow.names
    missing = [c for c in columns if c not in names]
    if missing:
        raise RunDirError(f"{file}: missing column(s) {missing}")
    return list(columns)


def _read_tables(files: list[Path], columns: Sequence[str] | None, schema: pa.Schema,
                 seq_ids: Any = None) -> pa.Table:
    if not files:
        names = list(columns) if columns is not None else schema.names
        return pa.Table.from_arrays([pa.array([], schema.field(n).type) for n in names], names=names)
    where = None if seq_ids is None else pc.field("seq_id").isin(pa.array(np.asarray(seq_ids, np.int64)))
    # promote: a shard without an optional column (policy_version …) reads it as nulls beside one that has it
    return pa.concat_tables([read_columns(file, columns, schema, filters=where) for file in files],
                            promote_options="default")


def read_columns(file: Path, columns: Sequence[str] | None, schema: pa.Schema = SEQUENCE_SCHEMA,
                 filters: Any = None) -> pa.Table:
    """One Parquet file of a run read as `schema` (all its columns, or `columns`); an optional column the file
    lacks reads as nulls instead of failing (columns outside `schema` are read as stored). All columns = the
    schema's, plus the optional ones (rcdiag.store.schema.optional_columns) the file holds."""
    optional = list(optional_columns(schema) or [])
    full = pa.schema(list(schema) + optional)
    try:
        have = pq.read_schema(file).names
        names = schema.names + [f.name for f in optional if f.name in have] if columns is None else list(columns)
        conformable = set(names) <= set(full.names)
        present = [c for c in names if c in have] if conformable else names
        table = pq.read_table(file, columns=present, filters=filters)
    except (pa.ArrowInvalid, OSError) as exc:
        raise unreadable(file, exc) from None
    return conform(table, pa.schema([full.field(c) for c in names]), source=str(file)) if conformable else table


def unreadable(file: Path, exc: BaseException) -> RunDirError:
    """The error for a shard that cannot be read: gone since the run was opened (another process rewrote the run),
    or corrupt."""
    if not os.path.lexists(file):
        return RunDirError(f"{file}: was removed while rcdiag read the run (another process rewrote it); run the "
                           "command again once the writer has finished")
    return RunDirError(f"{file}: unreadable Parquet file ({exc}); the run is corrupt — re-create it")


def open_run(path: str | os.PathLike) -> Run:
    """Open a complete run directory (raises RunDirError if it is not one)."""
    return Run(path)
