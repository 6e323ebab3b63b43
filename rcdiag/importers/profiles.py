"""The trainers' own batch key names, one profile per framework, for the generic JSONL/Parquet importer.

A user who dumps a trainer's batch one row per sample gets that trainer's key names: TRL's `completion_ids` /
`sampling_per_token_logps`, verl's `responses` / `rollout_log_probs`, OpenRLHF's `sequences` / `action_mask`,
ms-swift's `completion_mask` over the tail of `input_ids`, AReaL's trajectory dicts. A profile says which field
holds what, and how the per-token arrays line up with the ids:

- layout `response`: the ids are the response alone and every per-token array has one value per id (padded on
  the right in a batch: the padding is trimmed by the mask or a length field);
- layout `sequence`: the ids are prompt + response and the per-token arrays cover the last len(array) ids
  (OpenRLHF's action arrays are one shorter than `sequences`; ms-swift's cover the `logits_to_keep` tail); the
  response starts at the first masked-in position.

The first profile whose `signature` keys all appear in the first row is used; flags (`--rollout-logprobs-field` …)
override any field. Each profile names the source file and commit its keys were read from.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """Where one framework's batch keeps each part of a sample (field names tried in order)."""

    name: str
    source: str
    signature: tuple[str, ...]
    layout: str  # "response" | "sequence"
    ids: tuple[str, ...]
    rollout: tuple[str, ...] = ()
    train: tuple[str, ...] = ()
    mask: tuple[str, ...] = ()
    mask_extra: tuple[str, ...] = ()  # multiplied into the mask when present (TRL's tool_mask)
    prompt_ids: tuple[str, ...] = ()
    prompt_mask: tuple[str, ...] = ()  # 0 on left padding of the prompt ids
    attention_mask: tuple[str, ...] = ()  # prompt + response validity (verl, OpenRLHF): the true lengths
    step: tuple[str, ...] = ("step",)
    padded: bool = False  # a batch row: trailing positions with mask 0 are padding
    version: tuple[str, ...] = ("policy_version", "model_version", "weight_version")
    version_min: tuple[str, ...] = ("policy_version_min",)
    trainer_version: tuple[str, ...] = ("trainer_version",)
    trainer_from_step: int | None = None  # trainer_version = step + this, where the framework defines it so
    token_versions: tuple[str, ...] = ("token_versions",)
    advantage: tuple[str, ...] = ("advantage", "advantages")  # a number per sample, or a list per token


PROFILES: tuple[Profile, ...] = (
    Profile(
        name="trl", layout="response", padded=True,
        source="TRL GRPOTrainer batch: the dict returned by `_generate_and_score_completions` "
               "(trl/trainer/grpo_trainer.py @ f2cd577, lines 2815-2852; trl 1.16.0 unchanged)",
        signature=("completion_ids", "completion_mask"), ids=("completion_ids",),
        rollout=("sampling_per_token_logps",), train=("old_per_token_logps",), mask=("completion_mask",),
        mask_extra=("tool_mask",), prompt_ids=("prompt_ids",), prompt_mask=("prompt_mask",),
        step=("global_step", "step")),
    Profile(
        name="ms-swift", layout="sequence", padded=True,
        source="ms-swift GRPOBatch (swift/rl_core/data.py @ 3602360): completion_mask, old_per_token_logps and "
               "rollout_per_token_logps cover the logits_to_keep tail of input_ids "
               "(swift/rlhf_trainers/utils.py, completion-region frame)",
        signature=("input_ids", "completion_mask", "old_per_token_logps"), ids=("input_ids",),
        rollout=("rollout_per_token_logps",), train=("old_per_token_logps",), mask=("completion_mask",),
        attention_mask=("attention_mask",), step=("global_step", "step")),
    Profile(
        name="trl-async", layout="sequence",
        source="TRL AsyncGRPO RolloutSample (trl/experimental/async_grpo/async_rollout_worker.py @ f2cd577, "
               "lines 188-197): old_log_probs are the generator's (vLLM) log-probs over input_ids, 0.0 where "
               "completion_mask is 0",
        signature=("input_ids", "completion_mask", "old_log_probs"), ids=("input_ids",),
        rollout=("old_log_probs",), mask=("completion_mask",), step=("global_step", "step"),
        version=("model_version",), trainer_version=("trainer_version", "current_model_version")),
    Profile(
        name="openrlhf", layout="sequence", padded=True,
        source="OpenRLHF Experience (openrlhf/trainer/ppo_utils/experience.py @ 3c3be62): action arrays cover "
               "the last len(action_mask) tokens of sequences (openrlhf/models/actor.py line 294)",
        signature=("sequences", "action_mask"), ids=("sequences",), rollout=("rollout_log_probs",),
        train=("action_log_probs",), mask=("action_mask",), attention_mask=("attention_mask",)),
    Profile(
        name="verl", layout="response", padded=True,
        source="verl DataProto batch (responses, response_mask, rollout_log_probs, old_log_probs, prompts, "
               "attention_mask; verl/trainer/ppo/ray_trainer.py @ 1dda039)",
        signature=("responses",), ids=("responses",), rollout=("rollout_log_probs",),
        train=("old_log_probs",), mask=("response_mask",), prompt_ids=("prompts",),
        attention_mask=("attention_mask",), step=("global_steps", "global_step", "step"),
        # the agent loop's min/max_global_steps: the weights a trajectory was generated across; the trainer at
        # global step g trains version g - 1 (verl/trainer/ppo/v1/trainer_base.py @ 1dda039, lines 1856-1870:
        # trajectory_staleness = (global_steps - 1) - max_global_steps)
        version=("max_global_steps",), version_min=("min_global_steps",), trainer_from_step=-1),
    Profile(
        name="areal", layout="sequence",
        source="AReaL trajectory dict (areal/workflow/rlvr.py @ cbff54d, lines 165-178): logprobs are the "
               "inference engine's over input_ids, 0.0 on the prompt",
        signature=("input_ids", "loss_mask", "logprobs"), ids=("input_ids",), rollout=("logprobs",),
        mask=("loss_mask",), attention_mask=("attention_mask",), token_versions=("versions",)),
    Profile(
        name="rcdiag", layout="response",
        source="common names (response_ids/completion_ids/output_ids…, rollout_logprobs/logprobs…)",
        signature=(), ids=("response_ids", "completion_ids", "output_ids", "output_token_ids", "token_ids",
                           "responses"),
        rollout=("rollout_logprobs", "rollout_log_probs", "sampling_logprobs", "logprobs"),
        train=("train_logprobs", "train_log_probs", "old_log_probs", "old_logprobs", "log_probs"),
        mask=("mask", "loss_mask", "response_mask", "completion_mask", "action_mask"),
        prompt_ids=("prompt_ids", "prompt_token_ids", "input_ids")),
)
"""Tried in this order; the last (no signature) matches every row."""


def detect(row: dict[str, object]) -> Profile:
    """The profile of a row: the first whose signature keys are all present."""
    return next(p for p in PROFILES if all(key in row for key in p.signature))
