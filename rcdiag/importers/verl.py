"""Import verl's pickled DataProto batch cache (`gen_batch.dp`), or a dict of its tensors, without verl installed.

PATH is a `gen_batch.dp` file (or any pickle / torch.save of a DataProto or of a dict of tensors) or a directory
searched for `**/gen_batch.dp`. verl's RolloutSkip (`verl/utils/rollout_skip.py`, `RolloutSkip.dump`) writes
`{dump_dir}/{experiment}_{project}/GBS{n}_N{n}_in{p}_out{r}/genstep_{gen_step:06d}/gen_batch.dp` with
`DataProto.save_to_disk` (pickle.dump), next to `new_batch.dp` (the prompts; not read) and `meta.json`
(`global_steps`, the step). verl's `DataProto.__getstate__` (`verl/protocol.py`) pickles the state
(torch.save bytes of the consolidated TensorDict batch, non_tensor_batch, meta_info) — or, with
VERL_DATAPROTO_SERIALIZATION_METHOD=numpy, (batch_size, device, {key: (dtype, shape, uint8 bytes)}) first.
Tensors: `responses` [B, R] right-padded, `response_mask` [B, R] (0 on padding and tool tokens),
`rollout_log_probs` [B, R] float32 right-padded with 0.0, `old_log_probs` [B, R] where present (trainer side),
`prompts` [B, P] left-padded, `attention_mask` [B, P+R] (gives the true prompt and response lengths), and for MoE
runs with R3 `routed_experts` [B, P+R, layers, top_k] (the engine's routes: rcdiag.importers.routes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.errors import InputError
from rcdiag.importers.common import Imported, ImportOptions, Record, check_presence, length_pattern
from rcdiag.importers.routes import RouteCollector, route_tensor
from rcdiag.importers.safeload import PlainContainer, load_pickle_file, require_consent
from rcdiag.importers.tensordicts import TORCH_DTYPES, load_tensordict_bytes
from rcdiag.importers.values import whole_number
from rcdiag.progress import iterate
from rcdiag.store.files import MAX_MANIFEST_BYTES
from rcdiag.store.safefile import read_json

TOKEN_FIELDS = {"rollout_logprobs": "rollout_log_probs", "train_logprobs": "old_log_probs",
                "mask": "response_mask"}
CONVENTIONS = {
    "engine": "verl rollout (vLLM/SGLang); logprobs_mode per actor_rollout_ref.rollout.logprobs_mode "
              "(verl default processed_logprobs) — not recorded in the cache",
    "padding": "prompts left-padded, responses right-padded; the true lengths come from attention_mask",
    "mask_field": "response_mask (0 on padding and on tool/observation tokens: imported with mask False)",
    "placeholder": "rollout_log_probs are 0.0 on padding (dropped) and on masked positions (kept as stored)",
    "rollout_logprobs": "rollout_log_probs",
}


def _unwrap(obj: Any, file: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(tensors, non-tensor arrays, meta_info) from a DataProto, a TensorDict stand-in or a dict."""
    if isinstance(obj, dict) and "batch" not in obj:
        return obj, {}, {}
    state = getattr(obj, "_state", None)
    if isinstance(state, tuple) and len(state) == 3:  # verl's DataProto.__getstate__: (batch, non_tensor, meta)
        blob, non_tensor, meta = state
        return _state_batch(blob, file), dict(non_tensor or {}), dict(meta or {})
    get = obj.get if isinstance(obj, dict) else lambda k, d=None: getattr(obj, k, d)
    batch = get("batch")
    if isinstance(batch, PlainContainer):  # a TensorDict: its tensors live in `_tensordict` (or `_dict`)
        batch = getattr(batch, "_tensordict", None) or getattr(batch, "_dict", None)
    if not isinstance(batch, dict):
        raise InputError(f"cannot find the DataProto's tensor batch (got {type(batch).__name__})", file=str(file),
                         field="batch", hint="export the tensors as a dict with torch.save and import that")
    return batch, dict(get("non_tensor_batch") or {}), dict(get("meta_info") or {})


def _state_batch(blob: Any, file: Path) -> dict[str, Any]:
    """The tensor batch of verl's pickled DataProto state: torch.save bytes of a TensorDict (the default), or
    VERL_DATAPROTO_SERIALIZATION_METHOD=numpy's (batch_size, device, {key: (dtype, shape, uint8 bytes)})."""
    if isinstance(blob, (bytes, bytearray)):
        batch = load_tensordict_bytes(bytes(blob), file)
    elif isinstance(blob, tuple) and len(blob) == 3 and isinstance(blob[2], dict):
        batch = {str(k): _numpy_tensor(k, v, file) for k, v in blob[2].items()}
    else:
        raise InputError(f"the DataProto has no tensor batch (got {type(blob).__name__})", file=str(file),
                         field="batch", hint="dump the batch after generation (RolloutSkip writes gen_batch.dp)")
    if not isinstance(batch, dict):
        raise InputError(f"cannot find the DataProto's tensor batch (got {type(batch).__name__})", file=str(file),
                         field="batch", hint="export the tensors as a dict with torch.save and import that")
    return batch


def _numpy_tensor(key: str, encoded: Any, file: Path) -> np.ndarray:
    """One tensor of verl's numpy serialisation (protocol.serialize_single_tensor): (dtype, shape, uint8 data)."""
    if not (isinstance(encoded, tuple) and len(encoded) == 3):
        raise InputError("nested (ragged) tensors are not supported", file=str(file), field=str(key),
                         hint="pad the field to [batch, length] before dumping")
    dtype, shape, data = encoded
    kind = TORCH_DTYPES.get(str(dtype))
    if kind is None:
        raise InputError(f"unsupported tensor dtype {dtype!r}", file=str(file), field=str(key))
    raw = np.frombuffer(bytes(np.asarray(data, dtype=np.uint8)), dtype=np.uint16 if kind == "bfloat16" else kind)
    if kind == "bfloat16":  # the high half of a float32
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.reshape(tuple(int(x) for x in shape))


def _matrix(batch: dict[str, Any], name: str, file: Path, shape: tuple[int, int] | None) -> np.ndarray | None:
    value = batch.get(name)
    if value is None:
        return None
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        value = (value.float() if str(value.dtype) == "torch.bfloat16" else value).numpy()
    value = np.asarray(value)
    if value.ndim != 2:
        raise InputError(f"expected a [batch, length] tensor, got shape {value.shape}", file=str(file), field=name)
    if shape is not None and value.shape != shape:
        pattern = length_pattern(shape[1], value.shape[1]) if value.shape[0] == shape[0] else "batch sizes differ"
        raise InputError(f"shape {tuple(value.shape)} does not match responses {shape} ({pattern})",
                         file=str(file), field=name)
    return value


def _lengths(batch: dict[str, Any], file: Path, responses: np.ndarray, mask: np.ndarray | None
             ) -> tuple[np.ndarray, np.ndarray | None]:
    """Response lengths [B] and prompt validity [B, P] (None without prompts)."""
    n_resp = responses.shape[1]
    attention = _matrix(batch, "attention_mask", file, None)
    prompts = _matrix(batch, "prompts", file, None)
    if attention is not None:
        lengths = (attention[:, -n_resp:] != 0).sum(axis=1)
        prompt_valid = None if prompts is None else attention[:, :prompts.shape[1]] != 0
        return lengths, prompt_valid
    if mask is None:
        raise InputError("neither attention_mask nor response_mask: cannot tell response tokens from padding",
                         file=str(file), field="attention_mask")
    nonzero = mask != 0
    lengths = np.where(nonzero.any(axis=1), n_resp - np.argmax(nonzero[:, ::-1], axis=1), 0)
    return lengths, None


def _non_tensor(values: dict[str, Any], name: str, i: int) -> Any:
    column = values.get(name)
    return None if column is None or i >= len(column) else column[i]


ROUTES_FIELD = "routed_experts"


def _routed(batch: dict[str, Any], file: Path, shape: tuple[int, int], prompts: np.ndarray | None
            ) -> np.ndarray | None:
    """`routed_experts` [B, P_pad + R_pad, layers, top_k] (R3: verl/experimental/agent_loop/agent_loop.py places the
    engine's rows from the left-padded prompt's first token, zeros elsewhere), None when the batch has none; its
    width must be the prompts' plus the responses'."""
    value = batch.get(ROUTES_FIELD)
    if value is None:
        return None
    routed = route_tensor(value, (str(file), None), ROUTES_FIELD, ndim=4)
    width = shape[1] + (0 if prompts is None else prompts.shape[1])
    if routed.shape[0] != shape[0] or routed.shape[1] != width:
        raise InputError(f"shape {routed.shape[:2]} does not match [batch, prompt + response] = {(shape[0], width)}: "
                         "the route count must equal the token count", file=str(file), field=ROUTES_FIELD)
    return routed


def _records(file: Path, step: int | None, routes: RouteCollector) -> tuple[list[Record], bool, dict[str, Any]]:
    batch, non_tensor, meta = _unwrap(load_pickle_file(file), file)
    responses = _matrix(batch, "responses", file, None)
    if responses is None:
        raise InputError(f"no 'responses' tensor (have: {', '.join(sorted(map(str, batch)))})", file=str(file),
                         field="responses")
    shape = responses.shape
    rollout = _matrix(batch, "rollout_log_probs", file, shape)
    train = _matrix(batch, "old_log_probs", file, shape)
    mask = _matrix(batch, "response_mask", file, shape)
    lengths, prompt_valid = _lengths(batch, file, responses, mask)
    prompts = _matrix(batch, "prompts", file, None)
    routed = _routed(batch, file, shape, prompts)
    records = []
    for i in range(shape[0]):
        n = int(lengths[i])
        records.append(Record(
            response_ids=responses[i, :n].astype(np.int64), where=(str(file), i + 1),  # rows from 1
            rollout_logprobs=None if rollout is None else rollout[i, :n],
            train_logprobs=None if train is None else train[i, :n], mask=None if mask is None else mask[i, :n],
            prompt_ids=None if prompt_valid is None else prompts[i][prompt_valid[i]].astype(np.int64),
            prompt_id=_str(_non_tensor(non_tensor, "uid", i)), sample_index=i, step=step,
            reward=_float(_non_tensor(non_tensor, "score", i)), **_versions(non_tensor, i, step, (str(file), i + 1))))
        if routed is not None:
            record = records[-1]
            if prompt_valid is None:
                raise InputError("routed_experts need the prompts and attention_mask to find each sample's first "
                                 "prompt token", file=str(file), row=i + 1, field=ROUTES_FIELD)
            first = prompts.shape[1] - int(prompt_valid[i].sum())
            routes.add(routed[i, first:], prompt_len=len(record.prompt_ids), response_len=n, where=record.where,
                       field_name=ROUTES_FIELD, padded=True)
    scalars = {str(k): v for k, v in meta.items() if isinstance(v, str | int | float | bool)}
    return records, train is not None, scalars


def _versions(non_tensor: dict[str, Any], i: int, step: int | None, where: tuple[str, int]) -> dict[str, Any]:
    """The weights versions of sample i: the agent loop's non-tensor `max_global_steps` / `min_global_steps` (the
    versions a trajectory was generated across) and the trainer's, global_steps - 1 (verl/trainer/ppo/v1/
    trainer_base.py @ 1dda039, lines 1856-1870: trajectory_staleness = (global_steps - 1) - max_global_steps)."""
    newest = whole_number(_item(_non_tensor(non_tensor, "max_global_steps", i)), where, "max_global_steps")
    oldest = whole_number(_item(_non_tensor(non_tensor, "min_global_steps", i)), where, "min_global_steps")
    trainer = None if newest is None or step is None else int(step) - 1
    return {"policy_version": newest, "policy_version_min": oldest, "trainer_version": trainer}


def _item(value: Any) -> Any:
    """A numpy scalar of a non-tensor column as a Python number (object arrays hold them as they were put)."""
    return value.item() if isinstance(value, np.generic) else value


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _files(path: Path) -> list[tuple[Path, int | None]]:
    """(dump file, step) pairs; the step comes from meta.json next to the file, else the folder name."""
    if path.is_file():
        candidates = [path]
    elif path.is_dir():
        candidates = sorted(path.rglob("gen_batch.dp"))
        if not candidates:
            raise InputError("no gen_batch.dp below this directory", file=str(path))
    else:
        raise InputError("no such file or directory", file=str(path))
    out = []
    for file in candidates:
        step = None
        meta = file.parent / "meta.json"
        if meta.exists():
            step = _meta_step(meta)
        elif file.parent.name.removeprefix("genstep_").isdigit():  # RolloutSkip: genstep_{gen_step:06d}
            step = int(file.parent.name.removeprefix("genstep_"))
        out.append((file, step))
    return sorted(out, key=lambda p: (p[1] is None, p[1] or 0, str(p[0])))


def _meta_step(meta: Path) -> Any:
    """`global_steps` of a meta.json, refusing a file that is not a JSON object (it used to be a traceback)."""
    data = read_json(meta, "meta.json", MAX_MANIFEST_BYTES)  # bounded, never a FIFO; InputError naming it
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object, got {type(data).__name__}", file=str(meta))
    return data.get("global_steps")


def read(path: Path, opts: ImportOptions, fmt: str = "verl") -> Imported:
    """Read verl batch caches into records (see the module docstring)."""
    require_consent(path, fmt, opts.allow_pickle)
    records: list[Record] = []
    routes = RouteCollector()
    have_train = []
    meta: dict[str, Any] = {}
    for file, step in iterate(_files(path), desc="verl batches", silent=opts.quiet):
        batch_records, has_train, scalars = _records(file, step, routes)
        records += batch_records
        have_train.append(has_train)
        meta = meta or scalars
    check_presence(records, {"rollout_logprobs": "rollout_log_probs", "mask": "response_mask"})
    lacks = ["sampling settings (temperature, top-p/top-k, logprobs mode): not in the cache", "train_entropy"]
    if not all(have_train):
        lacks.insert(0, "old_log_probs (the trainer side: verl recomputes it after the gen batch is dumped, so the "
                        "dump never holds it)")
    if records and records[0].rollout_logprobs is None:
        lacks.insert(0, "rollout_log_probs (set actor_rollout_ref.rollout.calculate_log_probs=True)")
    conventions = {**CONVENTIONS, "train_logprobs": "old_log_probs" if any(have_train) else "none"}
    if meta:
        conventions["meta_info"] = meta  # e.g. temperature, when the trainer put it there
    if any(have_train) and not all(have_train):
        raise InputError("old_log_probs present in some batches but not others", file=str(path),
                         field="old_log_probs")
    imported = Imported(fmt=fmt, path=path, records=records, conventions=conventions, lacks=lacks)
    routes.attach(imported, str(path))
    return imported
