"""Import text-only completion logs by retokenizing: TRL `completions_*.parquet`, ms-swift `completions.jsonl`,
verl `trainer.rollout_data_dir` `{step}.jsonl`.

These logs hold prompt and completion text but no token ids and no logprobs. rcdiag tokenizes the text with the
given tokenizer (offline, `AutoTokenizer`), marks the run `retokenized` (lossy: special tokens were stripped when
the text was decoded, and text → ids need not give back the sampled ids), and leaves both logprob columns null:
`rcdiag score --rescore-both RUN` computes both sides on the fixed tokens.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.errors import ConfigError, InputError
from rcdiag.importers.common import Imported, ImportOptions, Record, jsonl_objects
from rcdiag.importers.steps import step_from_name
from rcdiag.importers.values import whole_number
from rcdiag.importers.vocab import tokenizer_section
from rcdiag.progress import iterate
from rcdiag.tokenizers import load_tokenizer

NON_REWARD = {"step", "gen_step", "prompt", "completion", "advantage", "advantages", "entropy", "solution",
              "num_turns", "extra", "prompt_id"}
LACKS = ["token ids (text only: retokenized, lossy — special tokens were stripped when the text was decoded)",
         "rollout logprobs and trainer logprobs (text only)",
         "sampling settings (temperature, top-p/top-k)", "loss mask (every response token counts as valid)"]


TEXT_ONLY = {
    "trl": " — TRL's completions log cannot hold token ids or log-probs; for the sampled ids and both sides' "
           "log-probs per token, record the trainer with rcdiag.record.trl.record_grpo (README: Recording from "
           "inside training)",
    "verl-text": " — rollout_data_dir holds decoded text; the gen-batch dump (skip.rollout.enable=True, `rcdiag "
                 "import verl`) or rcdiag.record.verl.record_verl_batch keeps the sampled ids",
}
"""Per format: where the sampled token ids can be had instead of retokenized text."""


def _trl_rows(path: Path) -> list[tuple[str, int, dict[str, Any]]]:
    import pyarrow.parquet as pq

    files = sorted(path.glob("**/completions_*.parquet")) if path.is_dir() else [path]
    if not files or not files[0].exists():
        raise InputError("no completions_*.parquet here", file=str(path))
    return [(str(f), i, row) for f in files for i, row in enumerate(pq.read_table(f).to_pylist(), 1)]


def _swift_rows(path: Path) -> list[tuple[str, int, dict[str, Any]]]:
    """Expand columnar lines (a dict of equal-length lists per logging step) into one dict per sample."""
    file = path / "completions.jsonl" if path.is_dir() else path
    if not file.exists():
        raise InputError("no such file", file=str(file))
    out = []
    for line_no, table in jsonl_objects(file):
        lists = {k: v for k, v in table.items() if isinstance(v, list)}
        n = len(lists.get("completion", []))
        ragged = next((k for k, v in lists.items() if len(v) != n), None)
        if "completion" not in lists or "prompt" not in lists or ragged:
            field = ragged or ("completion" if "completion" not in lists else "prompt")
            raise InputError("expected columnar lines: equal-length lists 'prompt', 'completion', …",
                             file=str(file), row=line_no, field=field)
        out += [(str(file), line_no, {k: v[j] for k, v in lists.items()}) for j in range(n)]
    return out


def _verl_rows(path: Path) -> list[tuple[str, int, dict[str, Any]]]:
    """verl `_write_generations` lines {input, output, gts, score, step, [uid|request_id], reward extras} in the
    trl/swift shape (reward = score alone: the extras are components or diagnostics, not rewards to add)."""
    files = sorted(path.glob("*.jsonl"), key=lambda f: (not f.stem.isdigit(), int(f.stem) if f.stem.isdigit()
                                                        else 0, f.name)) if path.is_dir() else [path]
    if not files or not files[0].exists():
        raise InputError("no {step}.jsonl files here", file=str(path))
    out = []
    for file in files:
        for i, row in jsonl_objects(file):
            uid = row.get("uid", row.get("request_id"))
            out.append((str(file), i, {"prompt": row.get("input"), "completion": row.get("output"),
                                       "score": row.get("score"), "step": row.get("step", step_from_name(file)),
                                       "prompt_id": None if uid is None else str(uid)}))
    return out


def _as_text(value: Any, tokenizer: Any, *, prompt: bool) -> str:
    """Text of a prompt/completion: a string as is; a chat message list through the chat template."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        if prompt:
            return tokenizer.apply_chat_template(value, tokenize=False, add_generation_prompt=True)
        return "".join(str(m.get("content", "")) for m in value)
    raise InputError(f"expected text or a list of chat messages, got {type(value).__name__}")


def _reward(row: dict[str, Any]) -> float | None:
    values = [v for k, v in row.items() if k not in NON_REWARD and isinstance(v, int | float)
              and not isinstance(v, bool) and v == v]
    return float(sum(values)) if values else None


def _step(row: dict[str, Any], where: tuple[str, int]) -> int | None:
    """The row's step (`step`, else `gen_step`): a whole number, else InputError (5.5 used to become 5)."""
    name = "step" if row.get("step") is not None else "gen_step"
    return whole_number(row.get(name), where, name)


def _record(file: str, row_no: int, row: dict[str, Any], tokenizer: Any) -> Record:
    for key in ("prompt", "completion"):
        if row.get(key) is None:
            raise InputError("missing field", file=file, row=row_no, field=key)
    try:
        prompt = _as_text(row["prompt"], tokenizer, prompt=True)
        completion = _as_text(row["completion"], tokenizer, prompt=False)
    except InputError as exc:
        raise InputError(str(exc), file=file, row=row_no, field="prompt/completion") from None
    return Record(
        response_ids=np.asarray(tokenizer(completion, add_special_tokens=False)["input_ids"], np.int64),
        prompt_ids=np.asarray(tokenizer(prompt, add_special_tokens=False)["input_ids"], np.int64),
        where=(file, row_no), prompt_text=prompt, response_text=completion, reward=_reward(row),
        step=_step(row, (file, row_no)),
        prompt_id=row.get("prompt_id"))


READERS = {"trl": _trl_rows, "swift": _swift_rows, "verl-text": _verl_rows}
EXTRA_LACKS = {"verl-text": ["the prompt's special tokens and chat-template markers (verl decodes `input` with "
                             "skip_special_tokens=True): retokenized prompts differ from what the model saw"]}


def read(path: Path, opts: ImportOptions, fmt: str = "trl") -> Imported:
    """Retokenize a TRL / ms-swift / verl text log into records with null logprobs."""
    if not opts.tokenizer:
        raise ConfigError("text-only dumps need --tokenizer PATH (the policy model's tokenizer directory) to "
                          "turn text back into token ids")
    tokenizer = load_tokenizer(opts.tokenizer, what="--tokenizer")
    rows = READERS[fmt](path)
    records = [_record(f, i, row, tokenizer) for f, i, row in iterate(rows, desc="tokenizing", silent=opts.quiet)]
    conventions = {"tokens": "retokenized from text with add_special_tokens=False (chat messages through the "
                             "tokenizer's chat template)", "tokenizer": str(opts.tokenizer),
                   "step_field": "gen_step" if rows and "gen_step" in rows[0][2] else "step"}
    return Imported(fmt=fmt, path=path, records=records, conventions=conventions,
                    lacks=EXTRA_LACKS.get(fmt, []) + LACKS,
                    retokenized=True, warnings=["retokenized from text: token ids may differ from those sampled"
                                                + TEXT_ONLY.get(fmt, "")],
                    sections={"tokenizer": tokenizer_section(opts.tokenizer, tokenizer)})
