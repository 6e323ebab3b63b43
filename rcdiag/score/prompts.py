"""Load prompt sets (.jsonl, .parquet, saved HF `datasets` directory) and render them to token ids.

A record is plain text (`prompt`) or a chat (`messages`: a list of {role, content}; the tokenizer's chat template
is applied with add_generation_prompt=True). An optional `id`/`prompt_id` names the prompt (default: its index)
and an optional `answer` enables the sample task's reward.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag.errors import ConfigError, InputError

AUTO_FIELDS = ("messages", "prompt")
"""Fields tried in order when --prompt-field is not given."""
ID_FIELDS = ("prompt_id", "id")
ANSWER_FIELD = "answer"


@dataclass(frozen=True)
class Prompt:
    """One prompt: `index` is its position in the set (it fixes seq_ids and seeds); exactly one of `text` and
    `messages` is set; `row` is the record's line (jsonl) or row (parquet/arrow), counted from 1."""

    index: int
    prompt_id: str
    text: str | None
    messages: tuple[dict[str, str], ...] | None
    answer: str | None
    row: int


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt as the engine sees it: `prompt_text` (the chat template applied for chats) and its token ids."""

    prompt: Prompt
    prompt_text: str
    token_ids: tuple[int, ...]


# --------------------------------------------------------------------------------------------------- readers
def _jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open("r", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"not valid JSON ({exc.msg} at column {exc.colno})", file=str(path), row=number,
                                 hint="each line of a .jsonl prompt file must be one JSON object") from None


def _table_records(table: pa.Table) -> Iterator[tuple[int, Any]]:
    row = 1  # rows count from 1, as jsonl lines do
    for batch in table.to_batches(max_chunksize=4096):
        for record in batch.to_pylist():
            yield row, record
            row += 1


def _parquet_records(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"unreadable Parquet file ({exc})", file=str(path)) from None
    yield from _table_records(table)


def _arrow_files(directory: Path) -> list[Path]:
    """The data files of a `Dataset.save_to_disk` directory (state.json lists them in order)."""
    state = directory / "state.json"
    if state.is_file():
        names = [entry["filename"] for entry in json.loads(state.read_text()).get("_data_files", [])]
        return [directory / name for name in names]
    return sorted(directory.glob("*.arrow"))


def _dataset_dir(directory: Path) -> Path:
    """Resolve a DatasetDict directory with a single split to that split's directory."""
    splits_file = directory / "dataset_dict.json"
    if not splits_file.is_file():
        return directory
    splits = json.loads(splits_file.read_text()).get("splits", [])
    if len(splits) == 1:
        return directory / splits[0]
    raise InputError(f"a dataset with splits {splits}; point --prompts at one of them, e.g. "
                     f"{directory / (splits[0] if splits else 'train')}", file=str(directory))


def _read_arrow(file: Path) -> pa.Table:
    try:
        with pa.memory_map(str(file)) as source:
            try:
                return pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                return pa.ipc.open_file(source).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"unreadable Arrow file ({exc})", file=str(file)) from None


def _dataset_records(directory: Path) -> Iterator[tuple[int, Any]]:
    directory = _dataset_dir(directory)
    files = _arrow_files(directory)
    if not files:
        raise InputError("no .arrow data files: not a directory written by `datasets.Dataset.save_to_disk`",
                         file=str(directory))
    tables = [_read_arrow(file) for file in files]
    yield from _table_records(pa.concat_tables(tables, promote_options="default"))


def _records(path: Path) -> Iterator[tuple[int, Any]]:
    if path.is_dir():
        return _dataset_records(path)
    if not path.is_file():
        raise InputError("no such file or directory", file=str(path))
    reader = {".jsonl": _jsonl_records, ".json": _jsonl_records, ".parquet": _parquet_records}.get(path.suffix)
    if reader is None:
        raise InputError(f"unknown prompt file type {path.suffix!r}", file=str(path),
                         hint="use .jsonl, .parquet, or a directory saved by datasets' save_to_disk")
    return reader(path)


# --------------------------------------------------------------------------------------------------- records
def _messages(value: Any, where: dict[str, Any]) -> tuple[dict[str, str], ...]:
    if not value:
        raise InputError("empty message list", **where)
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or \
                not isinstance(message.get("content"), str):
            raise InputError(f"message {i} is not an object with string 'role' and 'content'", **where)
        out.append({"role": message["role"], "content": message["content"]})
    return tuple(out)


def _parse(record: Any, index: int, row: int, file: str, field: str | None) -> Prompt:
    if not isinstance(record, dict):
        raise InputError(f"expected a JSON object, got {type(record).__name__}", file=file, row=row)
    names = [field] if field else [f for f in AUTO_FIELDS if record.get(f) is not None]  # tables hold nulls
    if not names or record.get(names[0]) is None:
        raise InputError("no prompt field (or it is null)", file=file, row=row,
                         field=field or "/".join(AUTO_FIELDS),
                         hint=f"the record has {sorted(record)}; choose one with --prompt-field")
    where = {"file": file, "row": row, "field": names[0]}
    value = record[names[0]]
    text, messages = None, None
    if isinstance(value, str) and names[0] == "messages":  # would be sent as plain text, without the template
        raise InputError("holds a string, but a chat is a list of {role, content} messages", **where,
                         hint="put plain text under 'prompt' (or name its field with --prompt-field)")
    if isinstance(value, str):
        if not value:
            raise InputError("empty prompt text", **where)
        text = value
    elif isinstance(value, list):
        messages = _messages(value, where)
    else:
        raise InputError(f"expected text or a list of chat messages, got {type(value).__name__}", **where)
    prompt_id = next((record[k] for k in ID_FIELDS if record.get(k) is not None), index)
    answer = record.get(ANSWER_FIELD)
    return Prompt(index, str(prompt_id), text, messages, None if answer is None else str(answer), row)


def load_prompts(path: str | Path, *, prompt_field: str | None = None, limit: int | None = None) -> list[Prompt]:
    """Read the first `limit` prompts (all when None) of a .jsonl/.parquet file or saved HF dataset directory.

    Blank jsonl lines are skipped. Raises InputError naming file, line/row and field for malformed records,
    duplicate prompt ids, or an empty set.
    """
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be ≥ 1, got {limit}")
    path = Path(path)
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for row, record in _records(path):
        if limit is not None and len(prompts) >= limit:
            break
        prompt = _parse(record, len(prompts), row, str(path), prompt_field)
        if prompt.prompt_id in seen:
            raise InputError(f"prompt id {prompt.prompt_id!r} already used at row {seen[prompt.prompt_id]}",
                             file=str(path), row=row, field="id", hint="prompt ids must be unique")
        seen[prompt.prompt_id] = row
        prompts.append(prompt)
    if not prompts:
        raise InputError("no prompts", file=str(path))
    return prompts


# --------------------------------------------------------------------------------------------------- render
def render_prompts(prompts: Sequence[Prompt], tokenizer: Any, *, source: str = "prompts",
                   max_len: int | None = None) -> list[RenderedPrompt]:
    """Token ids as the engine will get them: text through `tokenizer(text)` (special tokens added, as vLLM does
    for text prompts); chats through the chat template (add_generation_prompt=True; the template adds its own
    special tokens). Raises InputError for a chat without a chat template or a prompt of ≥ `max_len` tokens."""
    rendered = []
    for prompt in prompts:
        if prompt.messages is not None:
            if not getattr(tokenizer, "chat_template", None):
                raise InputError("chat messages given but the tokenizer has no chat template", file=source,
                                 row=prompt.row, hint="give plain text in a `prompt` field instead")
            text = tokenizer.apply_chat_template(list(prompt.messages), tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            text = prompt.text
            ids = tokenizer(text)["input_ids"]
        if max_len is not None and len(ids) >= max_len:
            raise InputError(f"prompt has {len(ids)} tokens; the model's context is {max_len}", file=source,
                             row=prompt.row, hint="shorten it or drop it from the prompt set")
        rendered.append(RenderedPrompt(prompt, text, tuple(int(i) for i in ids)))
    return rendered


def prompts_hash(rendered: Sequence[RenderedPrompt]) -> str:
    """sha256 over every prompt's id, token ids and answer: two runs with equal hashes saw identical inputs."""
    digest = hashlib.sha256()
    for item in rendered:
        digest.update(json.dumps([item.prompt.prompt_id, item.token_ids, item.prompt.answer]).encode())
    return "sha256:" + digest.hexdigest()
