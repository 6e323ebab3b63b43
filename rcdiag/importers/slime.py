"""Import slime / miles debug dumps (torch.save of Sample dicts; train dumps add the trainer's log_probs).

Layouts accepted as PATH:
- a rollout dump `{"rollout_id", "samples": [Sample.to_dict(), …]}` (`--save-debug-rollout-data`), with an
  optional train dump given by `--train-data FILE`;
- a `--dump-details DIR`: `DIR/rollout_data/{id}.pt` with `DIR/train_data/{id}.pt` or `{id}_{rank}.pt`;
- a directory of rollout dumps (`*.pt`).
Train dumps are `{"rollout_id", "rank", "rollout_data": {column: [per sample]}}` (`sample_indices`, `log_probs`,
…) or `{"samples": [{"index"|"sample_index", "log_probs", …}]}`; log_probs are matched by sample index. MoE
samples' `rollout_routed_experts` become the engine's routes (rcdiag.importers.routes).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.errors import InputError
from rcdiag.importers.common import Imported, ImportOptions, Record, check_lengths, check_presence
from rcdiag.importers.routes import RouteCollector, route_tensor
from rcdiag.importers.safeload import PlainContainer, load_pickle_file, require_consent
from rcdiag.importers.steps import step_from_name
from rcdiag.importers.values import whole_number
from rcdiag.progress import iterate

FIELDS = {"rollout_logprobs": "rollout_log_probs", "train_logprobs": "log_probs", "mask": "loss_mask"}
CONVENTIONS = {
    "engine": "SGLang via slime/miles (logprobs as SGLang returns them: after temperature/top-p, per sglang#2664)",
    "tokens": "`tokens` = prompt + response ids; the response is the last `response_length` ids",
    "mask_field": "loss_mask (0 on tool/observation tokens: imported with mask False)",
    "padding": "none (one list per sample)",
    "placeholder": "values on loss_mask 0 positions kept as stored (often 0.0)",
    "rollout_logprobs": "rollout_log_probs (response tokens only)",
}


def as_array(value: Any) -> np.ndarray | None:
    """A tensor, numpy array or list as a 1-D numpy array (None stays None)."""
    if value is None:
        return None
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        value = value.numpy()
    return np.asarray(value).reshape(-1)


def _load(path: Path, opts: ImportOptions, what: str) -> dict[str, Any]:
    data = load_pickle_file(path)
    if not isinstance(data, dict):
        raise InputError(f"expected a {what} dict saved with torch.save, got {type(data).__name__}", file=str(path))
    return data


def _rollout_files(path: Path) -> tuple[list[tuple[Path, list[Path]]], list[Path]]:
    """((rollout dump, its train dumps) pairs, skipped eval dumps) for a file, a --dump-details directory or a
    directory of dumps. slime's eval pass writes `eval_{id}.pt` beside the training `{id}.pt`
    (RolloutManager._save_debug_rollout_data, evaluation=True: samples of every eval dataset, no train dump);
    they are a different population, so a directory import skips them (unless there is nothing else) and each
    imports as its own run when given as the PATH."""
    if path.is_file():
        return [(path, [])], []
    if not path.is_dir():
        raise InputError("no such file or directory", file=str(path))
    rollout_dir = path / "rollout_data"
    if rollout_dir.is_dir():
        train, evals = _split_eval(sorted(rollout_dir.glob("*.pt"), key=_natural))
        pairs = []
        for file in train:
            train_dir = path / "train_data"
            trains = [train_dir / file.name] if (train_dir / file.name).exists() else sorted(
                train_dir.glob(f"{file.stem}_*.pt"), key=_natural)
            pairs.append((file, trains))
        if pairs:
            return pairs, evals
    train, evals = _split_eval(sorted(path.glob("*.pt"), key=_natural))
    if not train and not evals:
        raise InputError("no *.pt dumps here (expected rollout_data/{id}.pt or {id}.pt files)", file=str(path))
    return ([(file, []) for file in train], evals) if train else ([(file, []) for file in evals], [])


def _split_eval(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(training dumps, eval dumps `eval_{id}.pt`)."""
    evals = [f for f in files if f.name.startswith("eval_")]
    return [f for f in files if not f.name.startswith("eval_")], evals


def _skipped_line(evals: list[Path]) -> list[str]:
    """The warning naming skipped eval dumps and how to import one."""
    if not evals:
        return []
    names = ", ".join(f.name for f in evals[:4]) + (f" … ({len(evals)} in all)" if len(evals) > 4 else "")
    return [f"skipped {len(evals)} eval dump(s) ({names}): evaluation samples are not training rollouts; import "
            f"one as its own run with `rcdiag import slime {evals[0]} -o RUN`"]


def _natural(path: Path) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.name)]


def _train_columns(data: dict[str, Any], file: Path) -> list[dict[str, Any]]:
    """Per-sample dicts from a train dump, either form."""
    if isinstance(data.get("samples"), list):
        return data["samples"]
    columns = data.get("rollout_data")
    if not isinstance(columns, dict):
        raise InputError("a train dump needs 'rollout_data' (columns) or 'samples'", file=str(file),
                         field="rollout_data")
    if "log_probs" not in columns:
        raise InputError(f"no 'log_probs' column (have: {', '.join(sorted(columns))})", file=str(file),
                         field="log_probs", hint="the trainer recompute is missing from this train dump")
    n = len(columns["log_probs"])
    ragged = [k for k, v in columns.items() if isinstance(v, list | tuple) and len(v) != n]
    if ragged:
        raise InputError(f"column '{ragged[0]}' has {len(columns[ragged[0]])} entries but log_probs has {n}",
                         file=str(file), field=ragged[0])
    return [{k: v[i] for k, v in columns.items() if isinstance(v, list | tuple)} for i in range(n)]


def _train_logprobs(files: list[Path], opts: ImportOptions) -> dict[int, tuple[np.ndarray, Any, str, int]]:
    """sample index → (log_probs, tokens or None, file, row) over all train dump files (ranks merged)."""
    out: dict[int, tuple[np.ndarray, Any, str, int]] = {}
    for file in files:
        for row, sample in enumerate(_train_columns(_load(file, opts, "train dump"), file), 1):
            index = sample.get("sample_indices", sample.get("sample_index", sample.get("index")))
            if index is None:
                raise InputError("train sample has no sample index ('sample_indices', 'sample_index' or 'index'): "
                                 "cannot match it to the rollout", file=str(file), row=row, field="sample_indices")
            if sample.get("log_probs") is None:
                raise InputError("missing log_probs", file=str(file), row=row, field="log_probs")
            out[int(index)] = (as_array(sample["log_probs"]), sample.get("tokens"), str(file), row)
    return out


def _as_dict(sample: Any, file: Path, row: int) -> dict[str, Any]:
    """A sample as a dict: Sample.to_dict() output as is, a pickled Sample object (older dumps) by its fields."""
    if isinstance(sample, dict):
        return sample
    if isinstance(sample, PlainContainer):
        return vars(sample)
    raise InputError(f"expected a sample dict, got {type(sample).__name__}", file=str(file), row=row,
                     field="samples")


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def _reward(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict) and isinstance(value.get("score"), int | float):
        return float(value["score"])
    return None


def _versions(value: Any, where: tuple[str, int]) -> tuple[int | None, int | None]:
    """(newest, oldest) of a sample's `weight_versions` — one entry per generate call, SGLang's meta_info
    `weight_version` (slime/utils/types.py @ 624b824, line 408), a string such as "3" or "000003"; partial
    rollouts continue on newer weights. (None, None) when absent; an entry that is not a whole number is refused."""
    if not value:
        return None, None
    if not isinstance(value, list | tuple):
        raise InputError(f"expected a list of versions, got {type(value).__name__}", file=where[0], row=where[1],
                         field="weight_versions")
    versions = [whole_number(v, where, "weight_versions") for v in value]
    return max(versions), min(versions)


def _record(sample: dict[str, Any], file: Path, row: int, rollout_id: Any) -> Record:
    where = (str(file), row)
    for key in ("tokens", "response_length"):
        if sample.get(key) is None:
            raise InputError("missing field in a rollout sample", file=where[0], row=row, field=key)
    tokens = as_array(sample["tokens"]).astype(np.int64)
    n = int(sample["response_length"])
    if not 0 <= n <= tokens.size:
        raise InputError(f"response_length {n} does not fit in {tokens.size} tokens (prompt + response)",
                         file=where[0], row=row, field="response_length")
    newest, oldest = _versions(sample.get("weight_versions"), where)
    return Record(
        policy_version=newest, policy_version_min=oldest,
        response_ids=tokens[tokens.size - n:], prompt_ids=tokens[:tokens.size - n], where=where,
        rollout_logprobs=as_array(sample.get("rollout_log_probs")), mask=as_array(sample.get("loss_mask")),
        prompt_text=_text(sample.get("prompt")), response_text=_text(sample.get("response")),
        prompt_id=None if sample.get("group_index") is None else str(sample["group_index"]),
        sample_index=sample.get("index"), finish_reason=_text(sample.get("status")),
        reward=_reward(sample.get("reward")), step=None if rollout_id is None else int(rollout_id))


def _attach_train(records: list[Record], train: dict[int, tuple[np.ndarray, Any, str, int]]) -> None:
    for record in records:
        if record.sample_index is None or int(record.sample_index) not in train:
            raise InputError(f"no train log_probs for sample index {record.sample_index}", file=record.where[0],
                             row=record.where[1], field="index", hint="are all ranks' train dumps present?")
        log_probs, tokens, file, row = train[int(record.sample_index)]
        if tokens is not None:
            full = np.concatenate([record.prompt_ids, record.response_ids])
            if not np.array_equal(as_array(tokens).astype(np.int64), full):
                raise InputError(f"train dump tokens differ from the rollout dump's for sample index "
                                 f"{record.sample_index}: the dumps do not belong together", file=file, row=row,
                                 field="tokens")
        record.train_logprobs = log_probs


def read(path: Path, opts: ImportOptions, fmt: str = "slime") -> Imported:
    """Read slime/miles dumps into records (see the module docstring for the layouts)."""
    require_consent(path, fmt, opts.allow_pickle)
    pairs, evals = _rollout_files(path)
    if opts.train_path:
        if len(pairs) != 1:
            raise InputError("--train-data goes with a single rollout dump file", file=str(path))
        pairs = [(pairs[0][0], [Path(opts.train_path)])]
    records: list[Record] = []
    routes = RouteCollector()
    with_train = 0
    for file, train_files in iterate(pairs, desc="slime dumps", silent=opts.quiet):
        data = _load(file, opts, "rollout dump")
        if not isinstance(data.get("samples"), list):
            raise InputError(f"a rollout dump needs a 'samples' list (have: {', '.join(sorted(map(str, data)))})",
                             file=str(file), field="samples")
        rollout_id = step_from_name(file) if data.get("rollout_id") is None else data["rollout_id"]
        # rows count from 1, as in every importer's errors (sample i of the dump is row i + 1)
        dicts = [_as_dict(s, file, i) for i, s in enumerate(data["samples"], 1)]
        batch = [_record(d, file, i, rollout_id) for i, d in enumerate(dicts, 1)]
        for sample, record in zip(dicts, batch, strict=True):
            _routes(sample, record, routes)
        if train_files:
            _attach_train(batch, _train_logprobs(train_files, opts))
            with_train += 1
        records += batch
    check_presence(records, FIELDS)
    check_lengths(records, FIELDS)
    lacks = ["sampling settings (temperature, top-p/top-k, logprobs mode): not in the dump", "train_entropy"]
    if with_train < len(pairs):
        lacks.insert(0, "trainer log_probs for some or all rollouts (no train dump: use a --dump-details "
                        "directory or --train-data FILE)")
    if records and records[0].rollout_logprobs is None:
        lacks.insert(0, "rollout_log_probs (the rollout engine's logprobs were not recorded)")
    conventions = {**CONVENTIONS, "train_logprobs": "log_probs from the train dump, matched by sample index"
                   if with_train else "none"}
    if pairs and all(f.name.startswith("eval_") for f, _ in pairs):
        conventions["population"] = "evaluation samples (slime eval_{id}.pt dumps), not training rollouts"
    imported = Imported(fmt=fmt, path=path, records=records, conventions=conventions, lacks=lacks,
                        warnings=_skipped_line(evals))
    routes.attach(imported, str(path))
    return imported


ROUTES_FIELD = "rollout_routed_experts"


def _routes(sample: dict[str, Any], record: Record, routes: RouteCollector) -> None:
    """A sample's `rollout_routed_experts` — [len(tokens) − 1, num_layers, moe_router_topk] (slime/rollout/
    sglang_rollout.py @ 624b824 reshapes SGLang's buffer so) — into `routes` (null routes without them)."""
    value = sample.get(ROUTES_FIELD)
    if value is None:
        routes.add_none(len(record.response_ids))
        return
    rows = route_tensor(value, record.where, ROUTES_FIELD)
    routes.add(rows, prompt_len=len(record.prompt_ids), response_len=len(record.response_ids), where=record.where,
               field_name=ROUTES_FIELD)
