"""Prompt loading (.jsonl, .parquet, saved HF datasets directories) and rendering to token ids."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rcdiag.errors import ConfigError, InputError
from rcdiag.score.prompts import load_prompts, prompts_hash, render_prompts

RECORDS = [
    {"prompt_id": "a", "prompt": "def f(x):", "answer": 3},
    {"id": 7, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]},
    {"prompt": "x = 1\n", "answer": "-4"},
]


def write_jsonl(path: Path, records: list, blank_after: int | None = None) -> Path:
    lines = [json.dumps(r) for r in records]
    if blank_after is not None:
        lines.insert(blank_after, "   ")
    path.write_text("\n".join(lines) + "\n")
    return path


def as_table(records: list) -> pa.Table:
    """All keys in every row (Arrow infers its schema from the first row), answers as text."""
    keys = list(dict.fromkeys(k for r in records for k in r))
    return pa.Table.from_pylist([{k: (str(r[k]) if k == "answer" and k in r else r.get(k)) for k in keys}
                                 for r in records])


def write_dataset_dir(path: Path, records: list, splits: tuple[str, ...] = ()) -> Path:
    """What `datasets.Dataset.save_to_disk` writes: Arrow IPC stream files listed in state.json."""
    def one(directory: Path, rows: list) -> None:
        directory.mkdir(parents=True)
        table = as_table(rows)
        for i, part in enumerate((table.slice(0, 2), table.slice(2))):
            with pa.OSFile(str(directory / f"data-0000{i}-of-00002.arrow"), "wb") as sink, \
                    pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(part)
        (directory / "state.json").write_text(json.dumps({"_data_files": [
            {"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}]}))

    if not splits:
        one(path, records)
        return path
    path.mkdir()
    (path / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
    for split in splits:
        one(path / split, records)
    return path


def check_records(prompts: list) -> None:
    assert [p.index for p in prompts] == [0, 1, 2]
    assert [p.prompt_id for p in prompts] == ["a", "7", "2"]
    assert prompts[0].text == "def f(x):" and prompts[0].messages is None and prompts[0].answer == "3"
    assert prompts[1].text is None and prompts[1].messages[1] == {"role": "user", "content": "2+2?"}
    assert prompts[1].answer is None and prompts[2].answer == "-4"


def test_jsonl_text_and_chat(tmp_path: Path) -> None:
    prompts = load_prompts(write_jsonl(tmp_path / "p.jsonl", RECORDS, blank_after=1))
    check_records(prompts)
    assert [p.row for p in prompts] == [1, 3, 4]  # jsonl rows are 1-based line numbers; the blank line is skipped


def test_parquet(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pq.write_table(as_table(RECORDS), path)
    check_records(load_prompts(path))


def test_dataset_directory(tmp_path: Path) -> None:
    check_records(load_prompts(write_dataset_dir(tmp_path / "ds", RECORDS)))
    check_records(load_prompts(write_dataset_dir(tmp_path / "dd", RECORDS, splits=("train",))))
    with pytest.raises(InputError, match=r"splits \['train', 'test'\].*dd2/train"):
        load_prompts(write_dataset_dir(tmp_path / "dd2", RECORDS, splits=("train", "test")))


def test_limit_and_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": f"q{i}", "prompt": "other"} for i in range(5)])
    prompts = load_prompts(path, prompt_field="question", limit=2)
    assert [p.text for p in prompts] == ["q0", "q1"]
    assert [p.text for p in load_prompts(path)] == ["other"] * 5
    with pytest.raises(ConfigError, match="--limit must be ≥ 1"):
        load_prompts(path, limit=0)


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "ok"', r"p\.jsonl row 3: not valid JSON"),
    ('["prompt"]', r"p\.jsonl row 3: expected a JSON object, got list"),
    ('{"text": "x"}', r"p\.jsonl row 3 field 'messages/prompt': no prompt field \(or it is null\) — the record has \['text'\]"),
    ('{"prompt": ""}', r"row 3 field 'prompt': empty prompt text"),
    ('{"prompt": 5}', r"row 3 field 'prompt': expected text or a list of chat messages, got int"),
    ('{"messages": []}', r"row 3 field 'messages': empty message list"),
    ('{"messages": [{"role": "user"}]}', r"row 3 field 'messages': message 0 is not an object"),
    ('{"prompt_id": "a", "prompt": "y"}', r"row 3 field 'id': prompt id 'a' already used at row 1"),
])
def test_malformed_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    """A bad record must be located by file and line (1-based, as editors count), never a bare traceback."""
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt_id": "a", "prompt": "x"}) + "\n\n" + line + "\n")
    with pytest.raises(InputError, match=message):
        load_prompts(path)


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_prompts(tmp_path / "missing.jsonl")
    (tmp_path / "p.csv").write_text("prompt\nx\n")
    with pytest.raises(InputError, match="unknown prompt file type '.csv'"):
        load_prompts(tmp_path / "p.csv")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(InputError, match="no prompts"):
        load_prompts(tmp_path / "empty.jsonl")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="unreadable Parquet"):
        load_prompts(tmp_path / "bad.parquet")
    (tmp_path / "nodata").mkdir()
    with pytest.raises(InputError, match="no .arrow data files"):
        load_prompts(tmp_path / "nodata")


@pytest.fixture(scope="module")
def tokenizer(sample_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(sample_model))


def test_render_text_and_chat(tmp_path: Path, tokenizer) -> None:
    """Text gets the tokenizer's special tokens (as vLLM adds them to text prompts); chats get the chat template
    with the generation prompt, and no second BOS."""
    prompts = load_prompts(write_jsonl(tmp_path / "p.jsonl", RECORDS))
    rendered = render_prompts(prompts, tokenizer)
    assert rendered[0].prompt_text == "def f(x):"
    assert list(rendered[0].token_ids) == tokenizer("def f(x):")["input_ids"]
    chat = tokenizer.apply_chat_template(list(prompts[1].messages), tokenize=False, add_generation_prompt=True)
    assert rendered[1].prompt_text == chat and chat != prompts[1].messages[1]["content"]
    assert list(rendered[1].token_ids) == tokenizer(chat, add_special_tokens=False)["input_ids"]
    if tokenizer.bos_token_id is not None:
        assert list(rendered[1].token_ids).count(tokenizer.bos_token_id) == chat.count(tokenizer.bos_token)
    assert prompts_hash(rendered) == prompts_hash(render_prompts(prompts, tokenizer))
    assert prompts_hash(rendered) != prompts_hash(rendered[:2])


def test_render_refusals(tmp_path: Path, tokenizer) -> None:
    prompts = load_prompts(write_jsonl(tmp_path / "p.jsonl", RECORDS))
    with pytest.raises(InputError, match=r"row 1: prompt has \d+ tokens; the model's context is 3"):
        render_prompts(prompts, tokenizer, source=str(tmp_path / "p.jsonl"), max_len=3)

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    with pytest.raises(InputError, match="row 2: chat messages given but the tokenizer has no chat template"):
        render_prompts(prompts[1:2], plain)
