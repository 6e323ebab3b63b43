"""Import generic JSONL / Parquet rollouts: one row per sequence, or OpenAI-compatible / SGLang responses.

Row shapes (detected from the first row):
- flat: token ids and per-token lists under field names (flags `--response-ids-field` …; else common names);
- OpenAI-compatible (vLLM/SGLang servers): `choices[i].logprobs.content[j] = {token, logprob, …}` with ids from
  `choices[i].token_ids` or `token_id:N` token strings (one sequence per choice); legacy `tokens`/`token_logprobs`;
  also wrapped in OpenAI batch-output lines (`vllm run_batch`: `response.body`);
- SGLang native: `meta_info.output_token_logprobs = [[logprob, token_id, text], …]`.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.errors import InputError
from rcdiag.importers.common import (
    Imported,
    ImportOptions,
    Record,
    check_lengths,
    check_presence,
    jsonl_objects,
)

CANDIDATES = {
    "response_ids": ("response_ids", "completion_ids", "output_ids", "output_token_ids", "token_ids", "responses"),
    "rollout_logprobs": ("rollout_logprobs", "rollout_log_probs", "sampling_logprobs", "logprobs"),
    "train_logprobs": ("train_logprobs", "train_log_probs", "old_log_probs", "old_logprobs", "log_probs"),
    "mask": ("mask", "loss_mask", "response_mask", "completion_mask", "action_mask"),
    "prompt_ids": ("prompt_ids", "prompt_token_ids", "input_ids"),
}
FLAG = {"response_ids": "response_ids_field", "rollout_logprobs": "rollout_logprobs_field",
        "train_logprobs": "train_logprobs_field", "mask": "mask_field", "prompt_ids": "prompt_ids_field"}
TEXT = {"prompt_text": ("prompt", "prompt_text", "input"), "response_text": ("response", "completion",
        "response_text", "output", "text"), "prompt_id": ("prompt_id", "uid", "group_index"),
        "sample_index": ("sample_index", "index"), "reward": ("reward", "score"), "step": ("step",),
        "finish_reason": ("finish_reason",)}
PER_TOKEN = {"rollout_logprobs": "rollout logprobs", "train_logprobs": "train logprobs", "mask": "mask"}


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


def _pick(row: dict[str, Any], names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in row), None)


def resolve_fields(first: dict[str, Any], opts: ImportOptions) -> dict[str, str | None]:
    """Record attribute → source field: the flag's value (which must exist) or the first common name present."""
    fields: dict[str, str | None] = {}
    for attr, names in CANDIDATES.items():
        given = getattr(opts, FLAG[attr])
        if given is not None and given not in first:
            raise InputError(f"--{FLAG[attr].replace('_', '-')} {given}: no such field (have: "
                             f"{', '.join(k for k in first if k != '__file__')})", file=first["__file__"], row=1,
                             field=given)
        fields[attr] = given or _pick(first, names)
    if fields["response_ids"] is None:
        raise InputError(f"no token-id field found (tried {', '.join(CANDIDATES['response_ids'])})",
                         file=first["__file__"], row=1, hint="name it with --response-ids-field")
    return fields


def _list(row: dict[str, Any], name: str | None, where: tuple[str, int], dtype: Any) -> np.ndarray | None:
    if name is None:
        return None
    if name not in row or row[name] is None:
        raise InputError("missing field", file=where[0], row=where[1], field=name)
    value = row[name]
    if not isinstance(value, list | tuple | np.ndarray):
        raise InputError(f"expected a list, got {type(value).__name__}", file=where[0], row=where[1], field=name)
    try:
        array = np.asarray([np.nan if v is None else v for v in value], dtype=np.float64)
    except (TypeError, ValueError):
        array = None
    if array is None or array.ndim != 1:
        raise InputError(f"not a flat list of numbers (first item {value[0]!r})", file=where[0], row=where[1],
                         field=name)
    return token_ids(array, where, name) if np.issubdtype(dtype, np.integer) else array


def token_ids(values: Any, where: tuple[str, int], name: str) -> np.ndarray:
    """Token ids as int64, refusing a fraction or a missing entry (5.5 used to be truncated to 5: a wrong token)."""
    array = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(array) | (array != np.round(array)))
    if bad.size:
        raise InputError(f"token id {values[int(bad[0])]!r} (item {int(bad[0]) + 1} of the list) is not a whole number "
                         f"({bad.size} such id(s) in this row)", file=where[0], row=where[1], field=name,
                         hint="token ids are vocabulary indices: export them as integers")
    return array.astype(np.int64)


def _extras(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr, names in TEXT.items():
        name = _pick(row, names)
        value = None if name is None else row[name]
        if attr in {"reward"}:
            value = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        elif attr in {"sample_index", "step"}:
            value = int(value) if isinstance(value, int | float | str) and str(value).lstrip("-").isdigit() else None
        elif value is not None and not isinstance(value, str):
            value = json.dumps(value, default=str)
        out[attr] = value
    return out


def flat_record(row: dict[str, Any], i: int, fields: dict[str, str | None]) -> Record:
    where = (row["__file__"], i)
    values = {attr: _list(row, name, where, np.int64 if attr in {"response_ids", "prompt_ids"} else np.float64)
              for attr, name in fields.items()}
    return Record(where=where, **values, **_extras(row))


def _openai_choice(row: dict[str, Any], i: int, choice: dict[str, Any]) -> Record:
    where = (row["__file__"], i)
    logprobs = choice.get("logprobs") or {}
    if "content" in logprobs:
        entries = logprobs["content"] or []
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
        ids = [int(t.split(":", 1)[1]) for t in tokens]
    message = choice.get("message") or {}
    return Record(
        response_ids=token_ids(ids, where, "choices.token_ids"), where=where,
        rollout_logprobs=np.asarray([np.nan if v is None else v for v in values], np.float64),
        prompt_ids=row.get("prompt_token_ids") or choice.get("prompt_token_ids"),
        response_text=choice.get("text", message.get("content")), finish_reason=choice.get("finish_reason"),
        sample_index=choice.get("index"), prompt_id=None if row.get("id") is None else str(row["id"]))


def openai_records(row: dict[str, Any], i: int) -> list[Record]:
    return [_openai_choice(row, i, c) for c in row["choices"]]


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
        response_ids=token_ids(ids, where, "output_ids"), where=where,
        rollout_logprobs=np.asarray([np.nan if e[0] is None else e[0] for e in entries], np.float64),
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


def _imported(fmt: str, path: Path, records: list[Record], shape: str, fields: dict[str, str | None] | None
              ) -> Imported:
    if shape == "flat":
        conventions = {"row_shape": "flat (one row per sequence)",
                       **{f"{attr}_field": name or "absent" for attr, name in (fields or {}).items()}}
    else:
        conventions = {"row_shape": shape, "rollout_logprobs": SHAPES[shape][0]}
    conventions["placeholder"] = "values on mask 0 positions kept as stored"
    lacks = ["sampling settings (temperature, top-p/top-k, logprobs mode): not in the rows", "train_entropy"]
    if records and records[0].train_logprobs is None:
        lacks.insert(0, "trainer logprobs: `rcdiag score --rescore-both RUN` replays the stored tokens")
    if records and records[0].rollout_logprobs is None:
        lacks.insert(0, "rollout logprobs")
    if records and records[0].mask is None:
        lacks.append("a loss mask (every response token counts as valid)")
    return Imported(fmt=fmt, path=path, records=records, conventions=conventions, lacks=lacks)
