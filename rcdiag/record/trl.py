"""Record a TRL `GRPOTrainer` while it trains: both sides' per-token log-probs of every K-th step.

Why a wrapper and not a `TrainerCallback`: a callback sees `args, state, control, model, processing_class,
optimizer, lr_scheduler, train_dataloader, eval_dataloader` (transformers `CallbackHandler.call_event`), never the
batch. The per-token log-probs exist only in the dict `GRPOTrainer._generate_and_score_completions` returns
(trl/trainer/grpo_trainer.py @ f2cd577, lines 2815-2852; trl 1.16.0 the same): `prompt_ids`/`prompt_mask` (left
padded), `completion_ids`/`completion_mask` (right padded), `tool_mask`, `sampling_per_token_logps` (vLLM's, with
`vllm_importance_sampling_correction` or a `rollout_func` returning logprobs), `old_per_token_logps` (the trainer's
π_old recompute), `advantages` [B]. `record_grpo` wraps that one method on the trainer instance (no subclass, no
change to TRL's class): it calls the original, records the output at `state.global_step`, and returns it untouched.

    recorder = record_grpo(trainer, "runs/live", every=10)
    trainer.train()
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rcdiag.record.recorder import Recorder


def record_trl_batch(recorder: Recorder, step: int, output: dict[str, Any]) -> bool:
    """Record one `_generate_and_score_completions` output dict at `step` (True when written)."""
    if not recorder.due(step):
        return False
    completion_mask = output["completion_mask"]
    tool_mask = output.get("tool_mask")
    return recorder.add(
        step, output.get("prompt_ids"), output["completion_ids"], output.get("sampling_per_token_logps"),
        output.get("old_per_token_logps"), completion_mask if tool_mask is None else completion_mask * tool_mask,
        lengths=completion_mask.sum(-1), prompt_mask=output.get("prompt_mask"), advantage=output.get("advantages"))


def record_grpo(trainer: Any, path: str | os.PathLike | Recorder, every: int = 1, **options: Any) -> Recorder:
    """Make `trainer` (a TRL GRPOTrainer) record every `every`-th step into `path` (a run directory; with several
    processes one per process, `path/rank_<i>`). `options`: Recorder's (max_samples, tokenizer, sections …).
    Returns the Recorder."""
    recorder = path if isinstance(path, Recorder) else Recorder(_rank_path(trainer, Path(path)), every, **options)
    original = trainer._generate_and_score_completions

    def generate_and_record(*args: Any, **kwargs: Any) -> Any:
        output = original(*args, **kwargs)
        record_trl_batch(recorder, int(trainer.state.global_step), output)
        return output

    trainer._generate_and_score_completions = generate_and_record
    return recorder


def _rank_path(trainer: Any, path: Path) -> Path:
    """One run directory per process (each writes its own shards): `path/rank_<i>` when there are several."""
    accelerator = trainer.accelerator
    return path / f"rank_{accelerator.process_index}" if accelerator.num_processes > 1 else path
