"""Record verl's training batch (a `DataProto`) after the trainer's recompute: both sides per token, versions.

Where: `RayPPOTrainer.fit` (verl/trainer/ppo/ray_trainer.py @ 1dda039, line 1610) has, after the old-log-prob
recompute, `batch = batch.union(old_log_prob)`: the DataProto then holds, in `batch.batch` (a TensorDict), the
`prompts` [B, P] (left padded), `responses` [B, R] (right padded), `attention_mask` [B, P+R], `response_mask`
[B, R] (0 on padding and tool tokens), `rollout_log_probs` [B, R] float32 (with
`actor_rollout_ref.rollout.calculate_log_probs=True`) and `old_log_probs` [B, R] float32; in
`batch.non_tensor_batch` (numpy object arrays) `uid` and, from the agent loop, `min_global_steps` /
`max_global_steps` — the weights a trajectory was generated across, the trainer at global step g training version
g − 1 (verl/trainer/ppo/v1/trainer_base.py @ 1dda039, lines 1856-1870).

    record_verl_batch(recorder, batch, step=self.global_steps)
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from rcdiag.record.recorder import Recorder


@runtime_checkable
class DataProtoLike(Protocol):
    """What rcdiag reads of a verl DataProto (verl/protocol.py): its tensors and its non-tensor arrays."""

    batch: Any
    non_tensor_batch: dict[str, Any]


def record_verl_batch(recorder: Recorder, batch: DataProtoLike, step: int) -> bool:
    """Record verl's batch at global step `step` (True when written). Needs responses, attention_mask and
    old_log_probs and/or rollout_log_probs; versions where the agent loop put them."""
    if not recorder.due(step):
        return False
    tensors, extra = batch.batch, batch.non_tensor_batch or {}
    responses = tensors["responses"]
    width = responses.shape[-1]
    attention = tensors["attention_mask"]
    prompts = tensors["prompts"] if "prompts" in tensors.keys() else None
    newest, oldest = extra.get("max_global_steps"), extra.get("min_global_steps")
    return recorder.add(
        step, prompts, responses, _get(tensors, "rollout_log_probs"), _get(tensors, "old_log_probs"),
        _get(tensors, "response_mask"), lengths=attention[:, -width:].sum(-1),
        prompt_mask=None if prompts is None else attention[:, :prompts.shape[-1]],
        version=None if newest is None else np.asarray(newest, dtype=np.int64),
        version_min=None if oldest is None else np.asarray(oldest, dtype=np.int64),
        trainer_version=None if newest is None else step - 1, prompt_id=extra.get("uid"))


def _get(tensors: Any, name: str) -> Any:
    return tensors[name] if name in tensors.keys() else None
