"""Import NeMo-RL's per-step training dumps, `{log_dir}/train_data_step{N}.jsonl` (both sides per token, by default).

What NeMo-RL writes (snapshot 7ea279a): `nemo_rl/algorithms/grpo.py` lines 3633-3653 (sync GRPO; async GRPO the same
at 5259-5281) builds `log_data` from the training batch — `content` (each message's text), `rewards`,
`input_lengths`, `token_ids` (prompt + response, right-padded with the pad id), `token_loss_mask` (1 on generated
assistant tokens), `sample_loss_mask` (0: the sample is out of the loss), `advantages`, `generation_logprobs` (the
engine's, 0 on non-generated tokens: `add_grpo_token_loss_masks_and_generation_logprobs`), `prev_logprobs` (the
trainer's recompute, π_old) — and `nemo_rl/utils/logger.py` `log_batched_dict_as_jsonl` writes one line per sample
through `make_microbatch_iterator(1)`: every value is the batch's slice of one, so each field is a one-element list
(`"token_ids": [[…]]`, `"rewards": [r]`), plus `"idx"`. The step is N from the file name (total_steps + 1).

Positions: value t is the log-prob of token_ids[t] (`ClippedPGLossFn` slices every array `[:, 1:]` against the
model's next-token log-probs), so no shift. The response runs from the first `token_loss_mask` 1 to
`input_lengths`; tool/user turns inside it keep mask 0. The rcdiag mask is token_loss_mask × sample_loss_mask, the
mask NeMo-RL's loss and its `token_mult_prob_error` use.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.errors import InputError
from rcdiag.importers.common import Imported, ImportOptions, Record, check_lengths, jsonl_objects
from rcdiag.importers.spans import response_span
from rcdiag.importers.values import as_list, number, number_list, token_id_list, whole_number
from rcdiag.progress import iterate

FILE = re.compile(r"train_data_step(\d+)\.jsonl$")
REQUIRED = ("token_ids", "token_loss_mask", "generation_logprobs", "input_lengths")
CONVENTIONS = {
    "engine": "NeMo-RL generation backend (vLLM/SGLang/megatron); logprobs as the backend returned them",
    "layout": "token_ids = prompt + response, right-padded; every per-token array aligned with token_ids",
    "response": "from the first token_loss_mask 1 to input_lengths; user/tool turns inside keep mask 0",
    "mask_field": "token_loss_mask × sample_loss_mask (NeMo-RL's loss mask)",
    "rollout_logprobs": "generation_logprobs",
    "train_logprobs": "prev_logprobs (the trainer's recompute before the update: π_old)",
    "step": "N of train_data_step{N}.jsonl (NeMo-RL's total_steps + 1)",
    "text": "content: the last message is the response text, the ones before it the prompt",
}


def _files(path: Path) -> list[tuple[Path, int]]:
    """(file, step) for a train_data_step{N}.jsonl file or every one below a log directory, by step."""
    if path.is_file():
        match = FILE.search(path.name)
        if match is None:
            raise InputError("expected a NeMo-RL train_data_step{N}.jsonl file", file=str(path))
        return [(path, int(match.group(1)))]
    if not path.is_dir():
        raise InputError("no such file or directory", file=str(path))
    found = [(f, int(m.group(1))) for f in path.rglob("train_data_step*.jsonl") if (m := FILE.search(f.name))]
    if not found:
        raise InputError("no train_data_step{N}.jsonl below this directory (NeMo-RL writes them into the log "
                         "dir unless env.should_log_nemo_gym_responses is set)", file=str(path))
    return sorted(found, key=lambda item: (item[1], str(item[0])))


def _one(row: dict[str, Any], name: str, where: tuple[str, int]) -> Any:
    """The value of a field written as the batch's slice of one: `[value]` → value."""
    value = row.get(name)
    if value is None:
        return None
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    raise InputError(f"expected a one-element list (NeMo-RL writes every field as the batch's slice of one), got "
                     f"{type(value).__name__} of length {len(value) if isinstance(value, list) else '-'}",
                     file=where[0], row=where[1], field=name)


def _texts(content: Any) -> tuple[str | None, str | None]:
    if not isinstance(content, list) or not content or not all(isinstance(c, str) for c in content):
        return None, None
    return "".join(content[:-1]), content[-1]


def _record(row: dict[str, Any], where: tuple[str, int], step: int) -> Record:
    for name in REQUIRED:
        if row.get(name) is None:
            raise InputError("missing field", file=where[0], row=where[1], field=name)
    ids = token_id_list(_one(row, "token_ids", where), where, "token_ids")
    arrays = {name: None if row.get(name) is None else number_list(as_list(_one(row, name, where), where, name),
                                                                     where, name)
              for name in ("token_loss_mask", "generation_logprobs", "prev_logprobs", "advantages")}
    for name, values in arrays.items():
        if values is not None and values.size != ids.size:
            raise InputError(f"has {values.size} values for {ids.size} token_ids", file=where[0], row=where[1],
                             field=name)
    length = whole_number(_one(row, "input_lengths", where), where, "input_lengths")
    if not 0 <= length <= ids.size:
        raise InputError(f"input_lengths {length} does not fit {ids.size} token_ids", file=where[0], row=where[1],
                         field="input_lengths")
    valid = np.arange(ids.size) < length
    token_mask = arrays["token_loss_mask"]
    span = response_span(ids.size, token_mask * valid, layout="sequence", padded=False, valid=valid)
    sample_mask = number(_one(row, "sample_loss_mask", where), where, "sample_loss_mask")
    mask = token_mask if sample_mask is None else token_mask * sample_mask
    prompt_text, response_text = _texts(_one(row, "content", where))
    return Record(
        where=where, response_ids=ids[span.start:span.end], prompt_ids=ids[span.prompt_start:span.start],
        rollout_logprobs=span.cut(arrays["generation_logprobs"]), train_logprobs=span.cut(arrays["prev_logprobs"]),
        mask=span.cut(mask), token_advantages=span.cut(arrays["advantages"]), step=step,
        reward=number(_one(row, "rewards", where), where, "rewards"), prompt_text=prompt_text,
        response_text=response_text, sample_index=whole_number(row.get("idx"), where, "idx"))


def read(path: Path, opts: ImportOptions, fmt: str = "nemo-rl") -> Imported:
    """Read NeMo-RL train_data_step{N}.jsonl dumps into records (see the module docstring)."""
    records: list[Record] = []
    for file, step in iterate(_files(path), desc="nemo-rl steps", silent=opts.quiet):
        records += [_record(row, (str(file), i), step) for i, row in jsonl_objects(file)]
    check_lengths(records, {"rollout_logprobs": "generation_logprobs", "train_logprobs": "prev_logprobs"})
    out_of_loss = sum(1 for r in records if r.mask is not None and len(r.mask) and not np.any(r.mask))
    warnings = [f"{out_of_loss} sample(s) with sample_loss_mask 0 or no loss token: imported with every token "
                "masked (NeMo-RL's loss and token_mult_prob_error leave them out too)"] if out_of_loss else []
    lacks = ["sampling settings (temperature, top-p/top-k): in NeMo-RL's config, not in the dump", "train_entropy"]
    if records and records[0].train_logprobs is None:
        lacks.insert(0, "prev_logprobs (trainer side)")
    return Imported(fmt=fmt, path=path, records=records, conventions=dict(CONVENTIONS), lacks=lacks,
                    warnings=warnings)
