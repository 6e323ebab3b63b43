"""What a generated run is, as the manifest and the resume check record it: the run spec (settings that determine
its rows), the manifest sections, the reward function. Shared by the local path and the Ray pipeline."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rcdiag.score.config import TRUNCATION_HELP, GenerateConfig
from rcdiag.score.engine import LOGPROBS_MODE, vllm_version
from rcdiag.score.prompts import RenderedPrompt, prompts_hash
from rcdiag.score.sample import reward
from rcdiag.score.tokenizer_check import tokenizer_fingerprint
from rcdiag.store.context import model_info
from rcdiag.store.manifest import abs_path, new_manifest


def reward_function(rendered: Sequence[RenderedPrompt]) -> Callable[[str, str], float] | None:
    """The sample data's reward (rcdiag.score.sample.reward) when the prompts carry answers, else None."""
    if not any(item.prompt.answer is not None for item in rendered):
        return None
    return reward


def run_spec(config: GenerateConfig, model_dir: Path, model_hash: str, rendered: Sequence[RenderedPrompt]
             ) -> dict[str, Any]:
    """The settings that determine a run's rows: a resumed run must match them exactly."""
    settings = asdict(config)
    for name in ("gpu_memory_utilization", "trust_remote_code", "prompt_field", "limit"):
        settings.pop(name)
    for name in ("quantization", "kv_cache_dtype"):  # absent when unset: runs made before them resume as they were
        if settings[name] is None:
            settings.pop(name)
    return {"stage": "generate", "model": str(model_dir), "model_hash": model_hash, "vllm_version": vllm_version(),
            "logprobs_mode": LOGPROBS_MODE, "prompts_hash": prompts_hash(rendered), "prompts": len(rendered),
            **settings}


def generate_manifest(config: GenerateConfig, model_dir: Path, model_hash: str, prompts_path: Path,
              rendered: Sequence[RenderedPrompt], facts: dict[str, Any], tokenizer: dict[str, Any],
              rewards: bool) -> dict[str, Any]:
    """The manifest of a generated run (engine, models, tokenizer, prompts, rewards, warnings sections)."""
    engine = {"name": "vllm", "version": vllm_version(), "model": abs_path(model_dir), "logprobs_mode": LOGPROBS_MODE,
              **{k: v for k, v in asdict(config).items() if k not in ("prompt_field", "limit", "shard_prompts")},
              "seed_scheme": "request (prompt i, sample j) seeded with blake2b(f'{seed}:{i}:{j}') & (2**63-1)",
              "eos_kept": True, **facts}
    chats = sum(item.prompt.messages is not None for item in rendered)
    return new_manifest(
        "generated", engine=engine, models={"engine": {"path": abs_path(model_dir), "hash": model_hash}},
        tokenizer=tokenizer, **({"model": info} if (info := model_info(model_dir)) else {}),
        prompts={"path": abs_path(prompts_path), "count": len(rendered), "chat": chats,
                 "field": config.prompt_field, "limit": config.limit, "hash": prompts_hash(rendered),
                 "shard_prompts": config.shard_prompts},
        rewards={"function": "rcdiag.score.sample.reward" if rewards else None},
        warnings=[f"truncated sampling (top_p={config.top_p}, top_k={config.top_k}) allowed: {TRUNCATION_HELP}"]
        if config.truncated else [])


def tokenizer_section(model_dir: Path) -> dict[str, Any]:
    """The manifest's tokenizer section: its path and vocabulary fingerprint (rcdiag.score.tokenizer_check)."""
    fingerprint = tokenizer_fingerprint(model_dir) or {}
    return {"path": abs_path(model_dir), **{k: v for k, v in fingerprint.items() if not k.startswith("_")}}
