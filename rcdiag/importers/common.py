"""What every importer shares: per-sequence records, length checks with pattern diagnosis, atomic run writing."""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.errors import InputError
from rcdiag.importers.context import ImportContext
from rcdiag.importers.values import as_text, number, token_id_list, whole_number
from rcdiag.store.manifest import abs_path
from rcdiag.store.outdir import exclusive, resolve_target, swap_in, write_mode
from rcdiag.store.safefile import json_lines


@dataclass
class ImportOptions:
    """Options of `rcdiag import` (each default lives here; the CLI reads them from this class)."""

    allow_pickle: bool = False
    tokenizer: str | None = None
    train_path: str | None = None
    response_ids_field: str | None = None
    rollout_logprobs_field: str | None = None
    train_logprobs_field: str | None = None
    mask_field: str | None = None
    prompt_ids_field: str | None = None
    step_field: str | None = None
    ids_only: bool = False
    overwrite: bool = False
    quiet: bool = False
    context: ImportContext = field(default_factory=ImportContext)
    """What the dump cannot say (--engine-dtype, --quantization, --temperature, --trainer-setting, …)."""


@dataclass
class Record:
    """One imported sequence. Arrays are 1-D and per response token; None = the source lacks the field.

    `where` locates the sequence in the source (file, row) for error messages.
    """

    response_ids: Any
    rollout_logprobs: Any = None
    train_logprobs: Any = None
    mask: Any = None
    where: tuple[str, int | None] = ("<source>", None)
    prompt_ids: Any = None
    prompt_text: str | None = None
    response_text: str | None = None
    prompt_id: str | None = None
    sample_index: int | None = None
    finish_reason: str | None = None
    train_entropy: Any = None
    reward: float | None = None
    step: int | None = None
    policy_version: int | None = None
    policy_version_min: int | None = None
    trainer_version: int | None = None
    advantage: float | None = None
    token_versions: Any = None
    token_advantages: Any = None


SEQUENCE_EXTRAS = {"policy_version": pa.int64(), "policy_version_min": pa.int64(), "trainer_version": pa.int64(),
                   "advantage": pa.float64()}
"""Record attributes stored as the sequences' optional columns (rcdiag.store.schema.SEQUENCE_OPTIONAL), written
only when some record has one."""
TOKEN_EXTRAS = {"token_versions": ("policy_version", pa.int64()), "token_advantages": ("advantage", pa.float32())}
"""Per-token Record attributes → the token rows' optional column (rcdiag.store.schema.TOKEN_OPTIONAL)."""


def settle_versions(record: Record) -> None:
    """Per-sequence versions and advantage from the per-token ones where only those are known: the newest and oldest
    version over the response's versioned tokens (a negative version — AReaL's -1 on tokens no policy generated —
    is none), the advantage when it is the same on every valid token; then every token version must be ≤ the
    trainer's (InputError naming the sample)."""
    if record.token_versions is not None:
        versions = np.asarray(record.token_versions, dtype=np.float64)
        versions = np.where(versions < 0, np.nan, versions)
        record.token_versions = versions
        known = versions[np.isfinite(versions)]
        if known.size and record.policy_version is None:
            record.policy_version, record.policy_version_min = int(known.max()), int(known.min())
        if record.trainer_version is not None and known.size and known.max() > record.trainer_version:
            raise InputError(f"a token's policy version {int(known.max())} is newer than the trainer's version "
                             f"{record.trainer_version}", file=record.where[0], row=record.where[1],
                             field="versions")
    if record.token_advantages is not None and record.advantage is None:
        values = np.asarray(record.token_advantages, dtype=np.float64)
        valid = np.ones(values.size, bool) if record.mask is None else np.asarray(record.mask) != 0
        seen = np.unique(values[valid & np.isfinite(values)])
        if seen.size == 1:
            record.advantage = float(seen[0])


@dataclass
class Imported:
    """An importer's result: the records plus what the manifest says about the source."""

    fmt: str
    path: Path
    records: list[Record]
    conventions: dict[str, Any] = field(default_factory=dict)
    lacks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    retokenized: bool = False
    sections: dict[str, Any] = field(default_factory=dict)
    mask_counts: dict[str, int] = field(default_factory=dict)
    token_columns: dict[str, pa.Array] = field(default_factory=dict)
    """Optional token columns beyond the records' (name → Arrow array in token-row order): MoE routes."""
    sequence_columns: dict[str, pa.Array] = field(default_factory=dict)
    """Optional sequence columns in record order (the engine's prompt routes)."""


def jsonl_objects(file: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number from 1, object) for each non-blank line of a JSON-lines file (or a pipe); InputError naming the
    bad line — invalid JSON, a 5,000-digit integer, 100,000-deep nesting, a lone surrogate (with its field), bytes
    that are not UTF-8 — or the file when it is a directory or device (rcdiag.store.safefile)."""
    for i, row in json_lines(file):
        if not isinstance(row, dict):
            raise InputError(f"expected a JSON object per line, got {type(row).__name__}", file=str(file), row=i)
        yield i, row


# --------------------------------------------------------------------------------------------- length checks
def length_pattern(n_tokens: int, n_values: int, prompt_len: int | None = None) -> str:
    """Name the usual cause of a count mismatch between response tokens (n) and per-token values (m)."""
    if n_values == n_tokens + 1:
        return "+1 pattern: one value too many (a logprob for the last prompt token, or for an appended EOS)"
    if n_values == n_tokens - 1:
        return "-1 pattern: one value too few (the first or the final EOS token has no logprob: a shift by one)"
    if n_values == 2 * n_tokens + 1:
        return "2n+1 pattern: the values are duplicated plus one (logprobs gathered twice, as in ms-swift#6890)"
    if prompt_len and n_values in (prompt_len + n_tokens, prompt_len + n_tokens - 1):
        return "the values cover prompt+response tokens: keep only the response part"
    return "no known pattern"


def _check_one(record: Record, name: str, values: Any, n: int) -> str | None:
    if values is None:
        return None
    m = len(values)
    if m == n:
        return None
    plen = None if record.prompt_ids is None else len(record.prompt_ids)
    return f"{name} has {m} values for {n} response tokens ({length_pattern(n, m, plen)})"


def check_lengths(records: Sequence[Record], fields: dict[str, str]) -> None:
    """Every per-token array must have one value per response token.

    `fields` maps Record attributes to the source field names shown in errors. Raises InputError at the first
    offending sample, with the ±1 / 2n+1 pattern and how many samples share the mismatch.
    """
    for attr, source_name in fields.items():
        first, count = None, 0
        for record in records:
            problem = _check_one(record, source_name, getattr(record, attr), len(record.response_ids))
            if problem:
                count += 1
                first = first or (record, problem)
        if first is not None:
            record, problem = first
            raise InputError(f"{problem}; {count} of {len(records)} sample(s) have mismatched lengths",
                             file=record.where[0], row=record.where[1], field=source_name,
                             hint="fix the dump, or pass the field that holds response-token values")


def check_token_ids(records: Sequence[Record]) -> None:
    """Response token ids must be integers in [0, 2³¹): a negative id is a pad/ignore marker (-100, -1) that
    leaked into the response, and larger ones do not fit the run's int32 column."""
    for record in records:
        ids = np.asarray(record.response_ids)
        if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
            bad = int(np.flatnonzero((ids < 0) | (ids > np.iinfo(np.int32).max))[0])
            raise InputError(f"token id {int(ids[bad])} at response position {bad} is not a vocabulary id",
                             file=record.where[0], row=record.where[1], field="token ids",
                             hint="a negative id is usually padding or an ignore index left in the response")


def check_presence(records: Sequence[Record], fields: dict[str, str]) -> None:
    """A per-token field must be present in every sample or in none (a sample missing it is an error)."""
    for attr, source_name in fields.items():
        have = [getattr(r, attr) is not None for r in records]
        if any(have) and not all(have):
            record = records[have.index(False)]
            raise InputError(f"missing in this sample but present in {sum(have)} other(s)", file=record.where[0],
                             row=record.where[1], field=source_name)


# --------------------------------------------------------------------------------------------- tables
def _concat(records: Sequence[Record], attr: str, dtype: Any, fill: Any) -> np.ndarray:
    parts = []
    for r in records:
        values = getattr(r, attr)
        n = len(r.response_ids)
        parts.append(np.full(n, fill, dtype=dtype) if values is None else np.asarray(values, dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _float_column(records: Sequence[Record], attr: str) -> pa.Array:
    values = _concat(records, attr, np.float64, np.nan)
    if all(getattr(r, attr) is None for r in records):
        return pa.nulls(values.size, pa.float32())
    return pa.array(values.astype(np.float32))


def turn_index(mask: Any, n: int) -> np.ndarray:
    """int32 [n]: the assistant turn each response token belongs to — turn k is the k-th run of mask-1 tokens (what
    the model generated) and the masked tokens after it (the tool / user / environment output that answers it:
    verl's response_mask, slime's loss_mask, NeMo-RL's token_loss_mask, prime-rl's loss_mask, TRL's tool_mask are 0
    there); masked tokens before the first run belong to turn 0. No mask: one turn."""
    if mask is None or n == 0:
        return np.zeros(n, np.int32)
    valid = np.asarray(mask) != 0
    starts = valid & ~np.concatenate([[False], valid[:-1]])
    return np.maximum(np.cumsum(starts) - 1, 0).astype(np.int32)


def token_table(records: Sequence[Record], first_seq_id: int = 0) -> pa.Table:
    """Flat token rows (TOKEN_SCHEMA columns, + the optional ones some record has) from records; seq_id is
    `first_seq_id` + the record's index."""
    lengths = np.array([len(r.response_ids) for r in records], dtype=np.int64)
    seq_id = np.repeat(np.arange(first_seq_id, first_seq_id + len(records), dtype=np.int64), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    pos = (np.arange(int(lengths.sum()), dtype=np.int64) - starts).astype(np.int32)
    ids = _concat(records, "response_ids", np.int64, 0)
    mask = _concat(records, "mask", np.float64, 1.0) != 0
    table = pa.table({
        "seq_id": seq_id, "pos": pos, "token_id": ids.astype(np.int32),
        "rollout_logprob": _float_column(records, "rollout_logprobs"),
        "train_logprob": _float_column(records, "train_logprobs"),
        "train_entropy": _float_column(records, "train_entropy"), "mask": mask,
    })
    for attr, (name, kind) in TOKEN_EXTRAS.items():
        if any(getattr(r, attr) is not None for r in records):
            values = _concat(records, attr, np.float64, np.nan)
            table = table.append_column(name, pa.array(values, mask=np.isnan(values)).cast(kind))
    turns = [turn_index(r.mask, len(r.response_ids)) for r in records]
    if any(t.size and t[-1] > 0 for t in turns):  # written only where some response has several turns
        table = table.append_column("turn", pa.array(np.concatenate(turns), pa.int32()))
    return table


def checked_scalars(record: Record) -> None:
    """A record's per-sequence values as the sequence columns store them, whichever reader filled them in: whole
    numbers within their column's integer type (a step of 1e300 or a 5,000-digit version used to overflow inside
    Arrow with a traceback), numbers for reward and advantage, text for the text columns (a number or an object
    as its JSON). InputError naming the record's file and row."""
    where = record.where
    record.sample_index = whole_number(record.sample_index, where, "sample_index", bits=32)
    for name in ("step", "policy_version", "policy_version_min", "trainer_version"):
        setattr(record, name, whole_number(getattr(record, name), where, name))
    record.reward = number(record.reward, where, "reward")
    record.advantage = number(record.advantage, where, "advantage")
    for name in ("prompt_id", "prompt_text", "response_text", "finish_reason"):
        setattr(record, name, as_text(getattr(record, name)))


def sequence_table(records: Sequence[Record], first_seq_id: int = 0) -> pa.Table:
    """One row per record (SEQUENCE_SCHEMA columns); prompt_len from prompt ids when known."""
    def col(attr: str) -> list[Any]:
        return [getattr(r, attr) for r in records]

    for record in records:
        checked_scalars(record)
    prompt_ids = [None if r.prompt_ids is None else token_id_list(r.prompt_ids, r.where, "prompt_ids").tolist()
                  for r in records]
    return pa.table({
        "seq_id": pa.array(np.arange(first_seq_id, first_seq_id + len(records), dtype=np.int64)),
        "prompt_id": pa.array(col("prompt_id"), pa.string()),
        "sample_index": pa.array(col("sample_index"), pa.int32()),
        "prompt_text": pa.array(col("prompt_text"), pa.string()),
        "response_text": pa.array(col("response_text"), pa.string()),
        "prompt_len": pa.array([None if p is None else len(p) for p in prompt_ids], pa.int32()),
        "response_len": pa.array([len(r.response_ids) for r in records], pa.int32()),
        "finish_reason": pa.array(col("finish_reason"), pa.string()),
        "reward": pa.array(col("reward"), pa.float64()),
        "step": pa.array(col("step"), pa.int64()),
        "prompt_token_ids": pa.array(prompt_ids, pa.list_(pa.int32())),
        **{name: pa.array(col(name), kind) for name, kind in SEQUENCE_EXTRAS.items()
           if any(getattr(r, name) is not None for r in records)},
    })


def mask_summary(records: Sequence[Record]) -> tuple[dict[str, int], list[str]]:
    """Counts of masked tokens and of exact 0.0 rollout logprobs (the usual placeholder), plus warnings.

    A 0.0 on a masked position is the framework's placeholder (kept as stored; the mask excludes it). A 0.0 on a
    valid position claims probability 1 — legitimate for a certain token, but often a placeholder the mask misses.
    """
    masked = zero_masked = zero_valid = 0
    for record in records:
        valid = np.ones(len(record.response_ids), bool) if record.mask is None else np.asarray(record.mask) != 0
        masked += int((~valid).sum())
        if record.rollout_logprobs is not None:
            zero = np.asarray(record.rollout_logprobs, dtype=np.float64) == 0.0
            zero_masked += int((zero & ~valid).sum())
            zero_valid += int((zero & valid).sum())
    warnings = []
    if zero_valid:
        warnings.append(f"{zero_valid} valid token(s) have a rollout logprob of exactly 0.0 (probability 1): "
                        "a placeholder the mask does not cover? (0.0 is what frameworks write for tool/padded "
                        "positions)")
    return {"masked_tokens": masked, "placeholder_zeros_masked": zero_masked,
            "zero_rollout_logprobs_valid": zero_valid}, warnings


def nonfinite_warning(records: Sequence[Record]) -> list[str]:
    """Warnings for NaN/±inf logprobs on valid (mask True) positions: kept as stored, surfaced, never masked."""
    out = []
    for attr in ("rollout_logprobs", "train_logprobs"):
        for record in records:
            values = getattr(record, attr)
            if values is None or not len(values):
                continue
            values = np.asarray(values, dtype=np.float64)
            valid = np.ones(len(values), bool) if record.mask is None else np.asarray(record.mask) != 0
            bad = np.flatnonzero(valid & ~np.isfinite(values))
            if bad.size:
                out.append(f"{record.where[0]} row {record.where[1]}: {attr} is {values[bad[0]]} at response "
                           f"position {int(bad[0])} on a valid token (kept; metrics will refuse it)")
                break
    return out


# --------------------------------------------------------------------------------------------- writing
def source_section(imported: Imported) -> dict[str, Any]:
    return {
        "kind": f"imported:{imported.fmt}", "format": imported.fmt, "path": abs_path(imported.path),
        "retokenized": imported.retokenized, "conventions": imported.conventions,
        "lacks": imported.lacks, "warnings": imported.warnings, "mask_counts": imported.mask_counts,
    }


def write_imported(imported: Imported, out: str | os.PathLike, *, overwrite: bool = False) -> Any:
    """Write records as a run directory at `out`, atomically: a temp sibling directory renamed at the end.

    A failed import leaves nothing at `out` (and an existing run there untouched unless the import succeeds).
    """
    from rcdiag.store.writer import write_run

    out = resolve_target(out)
    if not imported.records:
        raise InputError("the dump holds no samples", file=str(imported.path))
    with exclusive(out):
        write_mode(out, overwrite=overwrite)  # new, or replace a run of rcdiag's own with --overwrite
        tmp = out.with_name(f".{out.name}.importing-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            manifest = {"source": source_section(imported), **imported.sections}
            tokens, sequences = token_table(imported.records), sequence_table(imported.records)
            for name, values in imported.token_columns.items():
                tokens = tokens.append_column(name, values)
            for name, values in imported.sequence_columns.items():
                sequences = sequences.append_column(name, values)
            write_run(tmp, tokens, sequences, manifest)
            swap_in(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    from rcdiag.store.run import open_run

    return open_run(out)


def summary_lines(imported: Imported, run: Any) -> list[str]:
    """What `rcdiag import` prints: counts, conventions, what the source lacks, warnings."""
    counts = run.info.counts
    lines = [f"Imported {counts.get('sequences')} sequences, {counts.get('tokens')} tokens from "
             f"{imported.fmt} dump {imported.path} → {run.path}"]
    lines += [f"  convention  {k}: {v}" for k, v in imported.conventions.items()]
    steps = sorted({r.step for r in imported.records if r.step is not None})
    if steps:
        lines.append(f"  steps       {len(steps)} ({steps[0]} … {steps[-1]})")
    tokenizer = imported.sections.get("tokenizer")
    if isinstance(tokenizer, dict):
        lines.append(f"  tokenizer   {tokenizer.get('path')} ({tokenizer.get('vocab_size')} ids)")
    counts_ = imported.mask_counts
    if counts_.get("masked_tokens"):
        lines.append(f"  masked      {counts_['masked_tokens']} token(s) imported with mask False, "
                     f"{counts_['placeholder_zeros_masked']} of them holding the 0.0 placeholder (kept as stored)")
    lines += [f"  lacks       {item}" for item in imported.lacks]
    lines += [f"  warning     {item}" for item in imported.warnings]
    return lines
