"""The run directory: manifest, atomic shard writer, and readers (pandas, Arrow, streaming).

Layout (DESIGN.md)::

    <run>/manifest.json            written last; its presence marks the run complete
    <run>/sequences/part-NNNNN.parquet
    <run>/tokens/part-NNNNN.parquet

Shard k of `tokens/` and of `sequences/` hold the same sequences; a sequence never spans shards. Every file is
written under a temporary name and renamed, and the sequences file of a shard is written after its tokens file,
so a shard counts as complete exactly when its sequences file exists.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rcdiag.errors import InputError, RunDirError
from rcdiag.schema import SEQUENCE_SCHEMA, TOKEN_SCHEMA, as_table, check_keys, conform

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
PENDING_NAME = "pending.json"
TOKENS_DIR = "tokens"
SEQUENCES_DIR = "sequences"
DEFAULT_SHARD_TOKENS = 1_000_000
"""Target token rows per shard (a shard holds whole sequences, so it can exceed this by one sequence)."""


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def rcdiag_version() -> str:
    from rcdiag import __version__

    return __version__


def new_manifest(source: str = "manual", **sections: Any) -> dict[str, Any]:
    """A manifest skeleton: schema/rcdiag versions, creation time, source, then the given sections."""
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "rcdiag_version": rcdiag_version(),
        "created": _now(),
        "source": {"kind": source, "retokenized": False},
    }
    manifest.update(sections)
    return manifest


# --------------------------------------------------------------------------------------------------- atomic I/O
def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to `path` through a temporary file and a rename (never a half-written file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    """Write a Parquet file through a temporary name and a rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    file = Path(path) / MANIFEST_NAME
    try:
        manifest = json.loads(file.read_text())
    except FileNotFoundError:
        raise RunDirError(f"{path}: not a complete run directory (no {MANIFEST_NAME}); an interrupted "
                          "`rcdiag score` resumes when re-run with the same command") from None
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{file}: manifest is not valid JSON ({exc})") from None
    version = manifest.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise RunDirError(f"{file}: schema_version {version!r} is not supported by rcdiag {rcdiag_version()} "
                          f"(supports ≤ {SCHEMA_VERSION}); upgrade rcdiag")
    return manifest


def update_manifest(path: str | os.PathLike, updates: dict[str, Any]) -> dict[str, Any]:
    """Merge `updates` (one level deep for dict sections) into a run's manifest and write it atomically."""
    manifest = read_manifest(path)
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(manifest.get(key), dict):
            manifest[key] = {**manifest[key], **value}
        else:
            manifest[key] = value
    write_json_atomic(Path(path) / MANIFEST_NAME, manifest)
    return manifest


# --------------------------------------------------------------------------------------------------- writer
class RunWriter:
    """Writes a run directory shard by shard, resumably.

    `spec` is the dict of settings that determine the run's content (model, prompts, sampling…). Opening a
    directory that holds shards written with a different spec raises RunDirError unless `overwrite=True`, which
    deletes the old run first. With the same spec, complete shards are kept (`complete_shards()`) so the caller
    can skip them; leftover temporary files are removed.
    """

    def __init__(self, path: str | os.PathLike, spec: dict[str, Any] | None = None, *, overwrite: bool = False):
        self.path = Path(path)
        self.spec = spec or {}
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"{self.path}: exists and is not a directory")
        if overwrite:
            self._clear()
        elif self._has_content():
            previous = self._previous_spec()
            if previous != json.loads(json.dumps(self.spec, default=str)):
                raise RunDirError(
                    f"{self.path}: already holds a run made with different settings "
                    f"({_spec_difference(previous, self.spec)}); pass --overwrite to replace it, or choose "
                    "another --out")
        for sub in (TOKENS_DIR, SEQUENCES_DIR):
            (self.path / sub).mkdir(parents=True, exist_ok=True)
        for tmp in self.path.glob("*/.*.tmp"):
            tmp.unlink()
        if not (self.path / MANIFEST_NAME).exists():
            write_json_atomic(self.path / PENDING_NAME, {"spec": self.spec, "started": _now()})

    def _has_content(self) -> bool:
        return (self.path / MANIFEST_NAME).exists() or (self.path / PENDING_NAME).exists() or any(
            any((self.path / sub).glob("part-*.parquet")) for sub in (TOKENS_DIR, SEQUENCES_DIR))

    def _previous_spec(self) -> Any:
        for name in (PENDING_NAME, MANIFEST_NAME):
            file = self.path / name
            if file.exists():
                try:
                    data = json.loads(file.read_text())
                except json.JSONDecodeError:
                    return None
                return data.get("spec")
        return None

    def _clear(self) -> None:
        for name in (MANIFEST_NAME, PENDING_NAME):
            (self.path / name).unlink(missing_ok=True)
        for sub in (TOKENS_DIR, SEQUENCES_DIR):
            shutil.rmtree(self.path / sub, ignore_errors=True)

    def complete_shards(self) -> list[int]:
        """Indices of shards whose sequences file (written last) exists."""
        return sorted(int(p.stem.split("-")[1]) for p in (self.path / SEQUENCES_DIR).glob("part-*.parquet"))

    def write_shard(self, index: int, tokens: pa.Table, sequences: pa.Table) -> None:
        """Write shard `index`: tokens first, then sequences (the commit marker). Tables must be conformed."""
        write_parquet_atomic(tokens, self.path / TOKENS_DIR / shard_name(index))
        write_parquet_atomic(sequences, self.path / SEQUENCES_DIR / shard_name(index))

    def finish(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Write the manifest (with counts and spec) last, completing the run; returns it."""
        manifest = dict(manifest)
        manifest["spec"] = self.spec
        manifest["counts"] = {**manifest.get("counts", {}), **_count(self.path)}
        write_json_atomic(self.path / MANIFEST_NAME, manifest)
        (self.path / PENDING_NAME).unlink(missing_ok=True)
        return manifest


def _spec_difference(old: Any, new: dict[str, Any]) -> str:
    if not isinstance(old, dict):
        return "unknown previous settings"
    new = json.loads(json.dumps(new, default=str))
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} → {new.get(k)!r}" for k in keys[:4]) or "unknown"


def _count(path: Path) -> dict[str, int]:
    tokens = sum(pq.ParquetFile(f).metadata.num_rows for f in sorted((path / TOKENS_DIR).glob("part-*.parquet")))
    seq_files = sorted((path / SEQUENCES_DIR).glob("part-*.parquet"))
    sequences = sum(pq.ParquetFile(f).metadata.num_rows for f in seq_files)
    return {"sequences": sequences, "tokens": tokens, "shards": len(seq_files)}


# --------------------------------------------------------------------------------------------------- write_run
def prepare_tokens(tokens: object, *, source: str = "tokens") -> pa.Table:
    """Conform a token frame to TOKEN_SCHEMA, sorted by (seq_id, pos); nulls in `mask` become True.

    Requires `seq_id`, `pos`, `rollout_logprob`; raises InputError on negative positions or duplicated keys.
    """
    table = conform(as_table(tokens, source=source), TOKEN_SCHEMA, source=source,
                    required=("seq_id", "pos", "rollout_logprob"))
    for name in ("seq_id", "pos"):
        if table.column(name).null_count:
            row = int(np.flatnonzero(np.asarray(pc.is_null(table.column(name))))[0])
            raise InputError("null key", file=source, row=row, field=name)
    if table.num_rows:
        table = table.sort_by([("seq_id", "ascending"), ("pos", "ascending")])
    check_keys(np.asarray(table.column("seq_id")), np.asarray(table.column("pos")), source=source)
    mask = pc.fill_null(table.column("mask"), True)
    return table.set_column(table.schema.get_field_index("mask"), "mask", mask)


def prepare_sequences(sequences: object | None, tokens: pa.Table, *, source: str = "sequences") -> pa.Table:
    """Conform (or derive from `tokens`) the sequence table; fill `response_len` from token counts when null."""
    seq_ids, counts = np.unique(np.asarray(tokens.column("seq_id")), return_counts=True)
    if sequences is None:
        table = conform(pa.table({"seq_id": seq_ids}), SEQUENCE_SCHEMA, source=source)
    else:
        table = conform(as_table(sequences, source=source), SEQUENCE_SCHEMA, source=source, required=("seq_id",))
        given = np.asarray(table.column("seq_id"))
        if table.column("seq_id").null_count:
            raise InputError("null seq_id", file=source, field="seq_id")
        unique = np.unique(given)
        if unique.size != given.size:
            dup = given[np.flatnonzero(np.diff(np.sort(given)) == 0)[0]]
            raise InputError(f"seq_id {int(dup)} appears more than once", file=source, field="seq_id")
        missing = np.setdiff1d(seq_ids, unique)
        if missing.size:
            raise InputError(f"token rows reference seq_id {int(missing[0])} which is not in the sequences table "
                             f"({missing.size} such ids)", file=source, field="seq_id")
        table = table.sort_by("seq_id")
    lengths = np.zeros(table.num_rows, dtype=np.int32)
    ids = np.asarray(table.column("seq_id"))
    lengths[np.searchsorted(ids, seq_ids)] = counts
    response_len = pc.if_else(pc.is_null(table.column("response_len")), pa.array(lengths),
                              table.column("response_len"))
    return table.set_column(table.schema.get_field_index("response_len"), "response_len", response_len)


def split_into_shards(tokens: pa.Table, sequences: pa.Table, shard_tokens: int) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Split sorted tables into shards of ≈ shard_tokens token rows, never splitting a sequence."""
    seq_ids = np.asarray(sequences.column("seq_id"))
    token_seq = np.asarray(tokens.column("seq_id"))
    if seq_ids.size == 0:
        yield tokens, sequences
        return
    ends = np.searchsorted(token_seq, seq_ids, side="right")  # token row end of each sequence
    start_seq = 0
    start_tok = 0
    while start_seq < seq_ids.size:
        limit = start_tok + max(shard_tokens, 1)
        stop_seq = int(np.searchsorted(ends, limit, side="right"))
        stop_seq = max(stop_seq, start_seq + 1)  # a sequence longer than the target gets a shard of its own
        stop_tok = int(ends[stop_seq - 1])
        yield tokens.slice(start_tok, stop_tok - start_tok), sequences.slice(start_seq, stop_seq - start_seq)
        start_seq, start_tok = stop_seq, stop_tok


def write_run(path: str | os.PathLike, tokens: object, sequences: object | None = None,
              manifest: dict[str, Any] | None = None, *, shard_tokens: int = DEFAULT_SHARD_TOKENS,
              overwrite: bool = False) -> Run:
    """Write a whole run from DataFrames (or Arrow tables) and return it opened.

    `tokens` needs `seq_id`, `pos`, `rollout_logprob`; `token_id`, `train_logprob`, `train_entropy`, `mask` are
    optional (null; `mask` defaults to True). `sequences` may hold only `seq_id` plus whatever is known, and may
    list sequences without token rows (empty responses); when None it is derived from the tokens. `manifest`
    sections are merged over a fresh skeleton (`source` defaults to "manual"). An existing non-empty directory is
    refused unless `overwrite=True`, which replaces it.
    """
    path = Path(path)
    if not overwrite and path.is_dir() and any(path.iterdir()):
        raise RunDirError(f"{path}: exists and is not empty; pass overwrite=True to replace it")
    token_table = prepare_tokens(tokens)
    sequence_table = prepare_sequences(sequences, token_table)
    base = new_manifest((manifest or {}).get("source", {}).get("kind", "manual")
                        if isinstance((manifest or {}).get("source"), dict) else "manual")
    full = {**base, **(manifest or {})}
    full["schema_version"] = SCHEMA_VERSION
    writer = RunWriter(path, spec=full.get("spec"), overwrite=overwrite)
    for index, (tok, seq) in enumerate(split_into_shards(token_table, sequence_table, shard_tokens)):
        writer.write_shard(index, tok, seq)
    writer.finish(full)
    return Run(path)


# --------------------------------------------------------------------------------------------------- reader
class Run:
    """A complete run directory, read lazily.

    `tokens()` / `sequences()` load pandas DataFrames; `iter_batches()` streams Arrow record batches of the token
    table (memory bounded by the batch size); `shards()` yields (tokens, sequences) Arrow tables per shard.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_dir():
            raise RunDirError(f"{self.path}: no such run directory")
        self.manifest: dict[str, Any] = read_manifest(self.path)

    def __repr__(self) -> str:
        counts = self.manifest.get("counts", {})
        return (f"Run({str(self.path)!r}, sequences={counts.get('sequences')}, tokens={counts.get('tokens')}, "
                f"source={self.manifest.get('source', {}).get('kind')!r})")

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def token_files(self) -> list[Path]:
        return sorted((self.path / TOKENS_DIR).glob("part-*.parquet"))

    @property
    def sequence_files(self) -> list[Path]:
        return sorted((self.path / SEQUENCES_DIR).glob("part-*.parquet"))

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

    def token_table(self, columns: Sequence[str] | None = None) -> pa.Table:
        return _read_tables(self.token_files, columns, TOKEN_SCHEMA)

    def sequence_table(self, columns: Sequence[str] | None = None) -> pa.Table:
        return _read_tables(self.sequence_files, columns, SEQUENCE_SCHEMA)

    def iter_batches(self, columns: Sequence[str] | None = None,
                     batch_size: int = 1 << 20) -> Iterator[tuple[str, pa.RecordBatch]]:
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
            yield index, _read_tables([tok_file], token_columns, TOKEN_SCHEMA), pq.read_table(seq_file)


    # Notebook conveniences: thin delegations into rcdiag.notebook, imported on first use (runstore stays light).
    def metrics(self, convention: str | None = None, **kwargs: Any) -> Any:
        """Every METRICS.md diagnostic (rcdiag.metrics.compute_metrics) as a dict that renders in Jupyter."""
        return _notebook().metrics(self, convention, **kwargs)

    def simulate(self, mode: str, threshold: float | None = None, **kwargs: Any) -> Any:
        """One IS correction (rcdiag.correction.simulate) as a dict that renders in Jupyter."""
        return _notebook().simulate(self, mode, threshold, **kwargs)

    def sweep(self, **kwargs: Any) -> Any:
        """IS metrics per mode × threshold (rcdiag.correction.sweep): a DataFrame."""
        return _notebook().sweep(self, **kwargs)

    def worst_sequences(self, k: int = 10, by: str = "mean", tokenizer: Any = None) -> Any:
        """The k sequences with the largest |mean ℓ| ("mean"), |Σℓ| ("sum") or max |ℓ| ("max"), with text."""
        return _notebook().worst_sequences(self, k, by, tokenizer)

    def sequence(self, seq_id: int, tokenizer: Any = None) -> Any:
        """One sequence token by token (`.frame`; renders coloured by ℓ in Jupyter)."""
        return _notebook().SequenceView(self, seq_id, tokenizer)

    @property
    def plot(self) -> Any:
        """Figures: run.plot.histogram(), .density(), .strata(name), .sweep(), .sequence(seq_id)."""
        return _notebook().PlotAccessor(self)

    def _repr_html_(self) -> str:
        return _notebook().run_html(self)


def _notebook() -> Any:
    import rcdiag.notebook

    return rcdiag.notebook


def _parquet(file: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(file)
    except (pa.ArrowInvalid, OSError) as exc:
        raise RunDirError(f"{file}: unreadable Parquet file ({exc}); the run is corrupt — re-create it") from None


def _existing(parquet: pq.ParquetFile, file: Path, columns: Sequence[str] | None) -> list[str] | None:
    if columns is None:
        return None
    names = parquet.schema_arrow.names
    missing = [c for c in columns if c not in names]
    if missing:
        raise RunDirError(f"{file}: missing column(s) {missing}")
    return list(columns)


def _read_tables(files: list[Path], columns: Sequence[str] | None, schema: pa.Schema) -> pa.Table:
    if not files:
        names = list(columns) if columns is not None else schema.names
        return pa.Table.from_arrays([pa.array([], schema.field(n).type) for n in names], names=names)
    tables = []
    for file in files:
        try:
            tables.append(pq.read_table(file, columns=list(columns) if columns is not None else None))
        except (pa.ArrowInvalid, OSError) as exc:
            raise RunDirError(f"{file}: unreadable Parquet file ({exc}); the run is corrupt — re-create it") from None
    return pa.concat_tables(tables)


def open_run(path: str | os.PathLike) -> Run:
    """Open a complete run directory (raises RunDirError if it is not one)."""
    return Run(path)
