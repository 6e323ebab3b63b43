"""Record verl's training batch (a `DataProto`) after the trainer's recompute: both sides per token, versions, and
what verl's config says about them.

Where: `RayPPOTrainer.fit` (verl/trainer/ppo/ray_trainer.py @ 1dda039, line 1610) has, after the old-log-prob
recompute, `batch = batch.union(old_log_prob)`: the DataProto then holds, in `batch.batch` (a TensorDict), the
`prompts` [B, P] (left padded), `responses` [B, R] (right padded), `attention_mask` [B, P+R], `response_mask`
[B, R] (0 on padding and tool tokens), `rollout_log_probs` [B, R] float32 (with
`actor_rollout_ref.rollout.calculate_log_probs=True`) and `old_log_probs` [B, R] float32; in
`batch.non_tensor_batch` (numpy object arrays) `uid` and, from the agent loop, `min_global_steps` /
`max_global_steps` — the weights a trajectory was generated across, the trainer at global step g training version
g − 1 (verl/trainer/ppo/v1/trainer_base.py @ 1dda039, lines 1856-1870). The agent loop fills both with None for an
output that carries no version (verl/experimental/agent_loop/agent_loop.py @ 1dda039: `extra_fields.get(key)` over
a fixed key set): such a sample is recorded without versions.

    record_verl_batch(recorder, batch, step=self.global_steps, config=self.config)

`config` (the trainer's OmegaConf config, or a plain dict of the same shape) adds the run's context to the
manifest (`verl_context`): the rollout engine and its sampling settings, dtypes, quantization, the model's
architecture and verl's own `algorithm.rollout_correction` as `trainer.correction`. A record that fails is one
warning and a skipped step (rcdiag.record.hooks), never an exception in `fit`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from rcdiag.record.hooks import guard_of, merge_sections
from rcdiag.record.recorder import Recorder
from rcdiag.store.context import FRAMEWORKS, correction_section, dtype_name, model_info

SOURCE = "verl config (rcdiag.record.verl.record_verl_batch)"
CONTEXT_KEY = "verl_context_read"
"""The guard's notice key that marks a recorder whose config context is in its sections already."""


@runtime_checkable
class DataProtoLike(Protocol):
    """What rcdiag reads of a verl DataProto (verl/protocol.py): its tensors and its non-tensor arrays."""

    batch: Any
    non_tensor_batch: dict[str, Any]


def record_verl_batch(recorder: Recorder, batch: DataProtoLike, step: int, config: Any = None) -> bool:
    """Record verl's batch at global step `step` (True when written; False when not due or when the record failed,
    with one warning). Needs responses, attention_mask and old_log_probs and/or rollout_log_probs; versions where
    the agent loop put them. `config`: verl's trainer config, read once per recorder for the manifest's context."""
    guard = guard_of(recorder, "record_verl_batch")
    if config is not None and not guard.done(CONTEXT_KEY):
        sections = guard.run(step, verl_context, config)
        if sections:
            recorder.options.sections = merge_sections(sections, recorder.options.sections)
    return bool(guard.run(step, _record, recorder, batch, step))


def _record(recorder: Recorder, batch: DataProtoLike, step: int) -> bool:
    if not recorder.due(step):
        return False
    tensors, extra = batch.batch, batch.non_tensor_batch or {}
    responses = tensors["responses"]
    width = responses.shape[-1]
    attention = tensors["attention_mask"]
    prompts = tensors["prompts"] if "prompts" in tensors.keys() else None
    newest, oldest = _versions(extra.get("max_global_steps")), _versions(extra.get("min_global_steps"))
    return recorder.add(
        step, prompts, responses, _get(tensors, "rollout_log_probs"), _get(tensors, "old_log_probs"),
        _get(tensors, "response_mask"), lengths=attention[:, -width:].sum(-1),
        prompt_mask=None if prompts is None else attention[:, :prompts.shape[-1]],
        version=newest, version_min=oldest,
        trainer_version=None if newest is None else [None if v is None else step - 1 for v in newest],
        prompt_id=extra.get("uid"))


def _versions(column: Any) -> list[int | None] | None:
    """A non-tensor version column as one value per sample (None where the agent loop put None); None when the
    batch has no such column or no sample has a version."""
    if column is None:
        return None
    values = [None if v is None else int(v.item() if hasattr(v, "item") else v) for v in list(column)]
    return None if all(v is None for v in values) else values


def _get(tensors: Any, name: str) -> Any:
    return tensors[name] if name in tensors.keys() else None


# --------------------------------------------------------------------------------------------- context
def _select(config: Any, path: str) -> Any:
    """`config.a.b.c` of an OmegaConf DictConfig, a dataclass config or a dict; None where any part is missing."""
    node = config
    for part in path.split("."):
        if node is None:
            return None
        if isinstance(node, Mapping) or hasattr(node, "keys") and hasattr(node, "get"):
            try:
                node = node.get(part)
            except Exception:  # noqa: BLE001 — an interpolation that does not resolve reads as absent
                return None
        else:
            node = getattr(node, part, None)
    return node


def verl_context(config: Any) -> dict[str, Any]:
    """The manifest sections verl's config says (verl @ 1dda039, _generated_ppo_trainer.yaml): `engine` from
    actor_rollout_ref.rollout (name, dtype, temperature, top_p, top_k (-1: off), logprobs_mode, quantization, the
    vLLM kv_cache_dtype in engine_kwargs), `trainer` from the actor's strategy (fsdp_config.dtype — the dtype the
    old-log-prob forward computes in — or megatron's), `trainer.correction` from algorithm.rollout_correction, and
    `model` from actor_rollout_ref.model.path's config.json where that path is local."""
    rollout = "actor_rollout_ref.rollout"
    get = lambda path: _select(config, path)  # noqa: E731
    path = get("actor_rollout_ref.model.path")
    kv = get(f"{rollout}.engine_kwargs.vllm.kv_cache_dtype") or get(f"{rollout}.engine_kwargs.sglang.kv_cache_dtype")
    engine = {"name": get(f"{rollout}.name"), "model": str(path) if path else None,
              "engine_dtype": dtype_name(get(f"{rollout}.dtype")), "temperature": _float(get(f"{rollout}.temperature")),
              "top_p": _float(get(f"{rollout}.top_p")), "top_k": _int(get(f"{rollout}.top_k")),
              "logprobs_mode": get(f"{rollout}.logprobs_mode"), "quantization": get(f"{rollout}.quantization"),
              "kv_cache_dtype": kv, "calculate_log_probs": get(f"{rollout}.calculate_log_probs")}
    strategy = get("actor_rollout_ref.actor.strategy")
    dtype = get("actor_rollout_ref.actor.megatron.dtype") if strategy == "megatron" else \
        get("actor_rollout_ref.actor.fsdp_config.dtype")
    settings = {name: _plain(get(f"algorithm.rollout_correction.{name}")) for name in FRAMEWORKS["verl"].settings
                if get(f"algorithm.rollout_correction.{name}") is not None}
    trainer = {"framework": "verl", "strategy": strategy, "dtype": dtype_name(dtype),
               "param_dtype": dtype_name(get("actor_rollout_ref.actor.fsdp_config.model_dtype")),
               "correction": correction_section("verl", settings, SOURCE)}
    info = model_info(path, name=str(path)) if isinstance(path, str) and path else None
    out: dict[str, Any] = {"engine": {k: _plain(v) for k, v in engine.items() if v is not None},
                           "trainer": {k: v for k, v in trainer.items() if v is not None},
                           "provenance": {"engine": SOURCE, "trainer": SOURCE, "trainer.correction": SOURCE}}
    if info:
        out["model"] = info
        out["provenance"]["model"] = f"{info.get('config', path)} (actor_rollout_ref.model.path)"
    return out


def _plain(value: Any) -> Any:
    """An OmegaConf leaf as a plain JSON value (its str for anything not a number, bool or string)."""
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)


def _float(value: Any) -> float | None:
    return None if value is None or isinstance(value, bool) else float(value)


def _int(value: Any) -> int | None:
    return None if value is None or isinstance(value, bool) else int(value)
