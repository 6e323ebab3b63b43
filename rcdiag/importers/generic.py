"""Import generic JSONL / Parquet rollouts: one row per sequence, or OpenAI-compatible / SGLang responses.

Row shapes (detected from the first row):
- flat: token ids and per-token lists under field names (flags `--response-ids-field` …; else the trainers' own
  batch key names — TRL, ms-swift, TRL async, OpenRLHF, verl, AReaL — or common names: rcdiag.importers.flat);
- OpenAI-compatible (vLLM/SGLang servers): `choices[i].logprobs.content[j] = {token, logprob, …}` with ids from
  `choices[i].token_ids` or `token_id:N` token strings (one sequence per choice); legacy `tokens`/`token_logprobs`;
  also wrapped in OpenAI batch-output lines (`vllm run_batch`: `response.body`);
- SGLang native: `meta_info.output_token_logprobs = [[logprob, token_id, text], …]`.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rcdiag.errors import InputError
from rcdiag.importers.common import (
    Imported,
    ImportOptions,
    Record,
    check_lengths,
    check_presence,
    jsonl_objects,
)
from rcdiag.importers.flat import PER_TOKEN, Fields, conventions, flat_record, resolve_fields
from rcdiag.importers.values import as_list, number_list, token_id_list


def rows(path: Path, fmt: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number, dict) for each row of a JSONL or Parquet file (`fmt`), or of each such file in a directory."""
    suffix = ".parquet" if fmt == "parquet" else ".jsonl"
    files = sorted(path.glob(f"*{suffix}")) if path.is_dir() else [path]
    if not files or not files[0].exists():
        raise InputError(f"no such file (or no *{suffix} files in the directory)", file=str(path))
    for file in files:
        yield from (_parquet_rows if fmt == "parquet" else _jsonl_rows)(file)


def _parquet_rows(file: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(file)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"not a readable Parquet file ({exc})", file=str(file)) from None
    for i, row in enumerate(table.to_pylist(), 1):
        yield i, row | {"__file__": str(file)}


def _jsonl_rows(file: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, row in jsonl_objects(file):
        yield i, row | {"__file__": str(file)}


def _object(value: Any, where: tuple[str, int], field: str) -> dict[str, Any]:
    """A part of an OpenAI response that must be a JSON object (a choice, its logprobs, a content entry)."""
    if not isinstance(value, dict):
        raise InputError(f"expected a JSON object, got {type(value).__name__} {str(value)[:40]!r}", file=where[0],
                         row=where[1], field=field)
    return value


def _openai_choice(row: dict[str, Any], i: int, choice: Any) -> Record:
    where = (row["__file__"], i)
    choice = _object(choice, where, "choices[]")
    logprobs = _object(choice.get("logprobs") or {}, where, "choices.logprobs")
    if "content" in logprobs:
        entries = [_object(e, where, "choices.logprobs.content[]") for e in as_list(logprobs["content"] or [],
                                                                                      where, "choices.logprobs.content")]
        tokens = [e.get("token") for e in entries]
        values = [e.get("logprob") for e in entries]
    elif "token_logprobs" in logprobs:
        tokens, values = logprobs.get("tokens") or [], logprobs["token_logprobs"]
    else:
        raise InputError("choice has no logprobs (ask the server for logprobs=true)", file=where[0], row=i,
                         field="choices.logprobs")
    ids = choice.get("token_ids")
    if ids is None:
        if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            raise InputError("no token ids: the response has token text only, and retokenizing it is lossy",
                             file=where[0], row=i, field="choices.token_ids",
                             hint="ask vLLM for ids (return_token_ids=true, or --return-tokens-as-token-ids)")
        ids = [t.split(":", 1)[1] for t in tokens]
        ids = [int(t) if t.lstrip("-").isdigit() and len(t) < 20 else t for t in ids]  # else token_id_list refuses
    message = choice.get("message") or {}
    return Record(
        response_ids=token_id_list(ids, where, "choices.token_ids"), where=where,
        rollout_logprobs=number_list(values, where, "choices.logprobs"),
        prompt_ids=row.get("prompt_token_ids") or choice.get("prompt_token_ids"),
        response_text=choice.get("text", message.get("content")), finish_reason=choice.get("finish_reason"),
        sample_index=choice.get("index"), prompt_id=None if row.get("id") is None else str(row["id"]))


def openai_records(row: dict[str, Any], i: int) -> list[Record]:
    return [_openai_choice(row, i, c) for c in as_list(row["choices"], (row["__file__"], i), "choices")]


def sglang_record(row: dict[str, Any], i: int) -> Record:
    where = (row["__file__"], i)
    meta = row["meta_info"]
    entries = meta.get("output_token_logprobs") or []
    bad = next((e for e in entries if not isinstance(e, list | tuple) or len(e) < 2), None)
    if bad is not None:
        raise InputError(f"expected [logprob, token_id, text] entries, got {bad!r}", file=where[0], row=i,
                         field="meta_info.output_token_logprobs")
    ids = row.get("output_ids") or [e[1] for e in entries]
    finish = meta.get("finish_reason")
    return Record(
        response_ids=token_id_list(ids, where, "output_ids"), where=where,
        rollout_logprobs=number_list([e[0] for e in entries], where, "meta_info.output_token_logprobs"),
        response_text=row.get("text"), finish_reason=finish.get("type") if isinstance(finish, dict) else finish,
        prompt_id=None if meta.get("id") is None else str(meta["id"]))


SHAPES = {
    "openai": ("OpenAI-compatible choices[i].logprobs (engine logprobs_mode applies: vLLM's default is "
               "raw_logprobs, i.e. before temperature)", "choices"),
    "sglang": ("SGLang meta_info.output_token_logprobs (after temperature/top-p, sglang#2664)", "meta_info"),
}


def unwrap_batch(row: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI batch-output line (`vllm run_batch`: {custom_id, response: {body: {choices…}}}) as its body,
    keeping custom_id as the id; other rows unchanged."""
    body = (row.get("response") or {}).get("body") if isinstance(row.get("response"), dict) else None
    if isinstance(body, dict) and "choices" in body:
        return {**body, "id": row.get("custom_id", body.get("id")), "__file__": row["__file__"]}
    return row


def read(path: Path, opts: ImportOptions, fmt: str = "jsonl") -> Imported:
    """Read a generic JSONL/Parquet file into records (see the module docstring)."""
    records: list[Record] = []
    shape, fields = None, None
    for i, row in rows(path, fmt):
        row = unwrap_batch(row)
        if shape is None:
            shape = "openai" if "choices" in row else "sglang" if isinstance(row.get("meta_info"), dict) else "flat"
            fields = resolve_fields(row, opts) if shape == "flat" else None
        if shape == "flat":
            records.append(flat_record(row, i, fields))
        elif shape == "openai":
            records += openai_records(row, i)
        else:
            records.append(sglang_record(row, i))
    check_presence(records, PER_TOKEN)
    check_lengths(records, PER_TOKEN)
    return _imported(fmt, path, records, shape or "flat", fields)


def _imported(fmt: str, path: Path, records: list[Record], shape: str, fields: Fields | None) -> Imported:
    if shape == "flat":
        said = conventions(fields) if fields is not None else {"row_shape": "flat (one row per sequence)"}
    else:
        said = {"row_shape": shape, "rollout_logprobs": SHAPES[shape][0]}
    said["placeholder"] = "values on mask 0 positions kept as stored"
    lacks = ["sampling settings (temperature, top-p/top-k, logprobs mode): not in the rows", "train_entropy"]
    if records and records[0].train_logprobs is None:
        lacks.insert(0, "trainer logprobs: not in the rows")
    if records and records[0].rollout_logprobs is None:
        lacks.insert(0, "rollout logprobs")
    if records and records[0].mask is None:
        lacks.append("a loss mask (every response token counts as valid)")
    return Imported(fmt=fmt, path=path, records=records, conventions=said, lacks=lacks)
