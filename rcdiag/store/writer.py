"""Writing run directories: the resumable shard writer (RunWriter) and `write_run` for tables built by hand.

Shard k of `tokens/` and of `sequences/` hold the same sequences; a sequence never spans shards. Every file is
written under a temporary name and renamed, and the sequences file of a shard is written after its tokens file,
so a shard counts as complete exactly when its sequences file exists; the manifest is written last.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rcdiag.errors import InputError, RunDirError
from rcdiag.store.files import (
    DEFAULT_SHARD_TOKENS,
    MANIFEST_NAME,
    PENDING_NAME,
    PROBES_DIR,
    REPORT_DIR,
    SEQUENCES_DIR,
    TOKENS_DIR,
    now,
    shard_name,
    write_json_atomic,
    write_parquet_atomic,
)
from rcdiag.store.manifest import SCHEMA_VERSION, new_manifest, write_manifest
from rcdiag.store.outdir import replaceable_run, write_mode
from rcdiag.store.run import Run
from rcdiag.store.schema import SEQUENCE_SCHEMA, TOKEN_SCHEMA, as_table, check_keys, conform


class RunWriter:
    """Writes a run directory shard by shard, resumably.

    `spec` is the dict of settings that determine the run's content (model, prompts, sampling…). The directory
    must be new, empty, or an rcdiag run holding only rcdiag's files — any other directory is refused, `overwrite`
    or not. Opening a run written with a different spec raises RunDirError unless `overwrite=True`, which deletes
    the old run's files first (the rules: rcdiag.store.outdir.write_mode). With the same spec, complete shards are
    kept (`complete_shards()`) so the caller can skip them; leftover temporary files are removed.
    """

    def __init__(self, path: str | os.PathLike, spec: dict[str, Any] | None = None, *, overwrite: bool = False):
        self.path = Path(path)
        self.spec = spec or {}
        self.mode = write_mode(self.path, overwrite=overwrite, spec=self.spec)
        """"new", "resume" or "replace" (rcdiag.store.outdir.write_mode: the rules, in one place)."""
        if self.mode == "replace":
            self._clear()
        for sub in (TOKENS_DIR, SEQUENCES_DIR):
            (self.path / sub).mkdir(parents=True, exist_ok=True)
        for tmp in self.path.glob("*/.*.tmp"):
            tmp.unlink()
        if not (self.path / MANIFEST_NAME).exists():
            write_json_atomic(self.path / PENDING_NAME, {"spec": self.spec, "started": now()})

    def _clear(self) -> None:
        for name in (MANIFEST_NAME, PENDING_NAME):
            (self.path / name).unlink(missing_ok=True)
        for sub in (TOKENS_DIR, SEQUENCES_DIR, REPORT_DIR, PROBES_DIR):  # the old run's report and probes too
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
        manifest = write_manifest(self.path, manifest)
        (self.path / PENDING_NAME).unlink(missing_ok=True)
        return manifest


def shard_marker(file: Path, key: bytes) -> Any:
    """The settings a stage marked the token shard `file` with (its Parquet key-value metadata under `key`, JSON),
    None when unmarked. A rewriting stage's resume rule: a shard marked with the same settings is done (rescoring's
    `rcdiag.rescored`, the replay's `rcdiag.replayed`), so a rerun after an interruption skips it."""
    raw = (pq.read_schema(file).metadata or {}).get(key)
    return None if raw is None else json.loads(raw)


def write_marked(table: pa.Table, file: Path, key: bytes, settings: dict[str, Any]) -> None:
    """Write a stage's rewritten shard atomically, marked with the settings it was computed with (shard_marker)."""
    metadata = {**(table.schema.metadata or {}), key: json.dumps(settings, sort_keys=True).encode()}
    write_parquet_atomic(table.replace_schema_metadata(metadata), file)


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
        hint = "pass overwrite=True to replace it" if replaceable_run(path) is None else "choose another path"
        raise RunDirError(f"{path}: exists and is not empty; {hint}")
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

