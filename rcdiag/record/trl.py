"""Record a TRL `GRPOTrainer` while it trains: both sides' per-token log-probs of every K-th step, and what the
trainer's config says about them.

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

The manifest gets the run's context from `trainer.args` (a GRPOConfig) and the loaded model (`grpo_context`): the
engine (vLLM, its mode, dtype, quantization and KV-cache dtype where the colocated engine says them, temperature,
top-p/top-k, logprobs mode), the trainer (TRL's version, the dtype its forward computes in, its temperature), the
model's architecture, and TRL's own correction (`vllm_importance_sampling_*`) as `trainer.correction`, which the
report, `rcdiag export` and the simulator then default to. A record that fails is one warning and a skipped step
(rcdiag.record.hooks), never an exception in the training step.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from rcdiag.record.hooks import HookGuard, merge_sections
from rcdiag.record.recorder import Recorder
from rcdiag.store.context import FRAMEWORKS, correction_section, dtype_name, model_info

SOURCE = "trl.GRPOConfig (rcdiag.record.trl.record_grpo)"
"""The provenance of every fact record_grpo writes."""
NO_OLD = ("TRL computed no π_old this step (no old_per_token_logps: with vllm_importance_sampling_correction=False "
          "and generation aligned with the optimizer steps TRL never recomputes the old log-probs), so rcdiag "
          "records the rollout side only; set vllm_importance_sampling_correction=True in GRPOConfig (its mode and "
          "clip bounds then decide what TRL does with the ratio), or rescore the recorded tokens later with "
          "`rcdiag score --rescore-only RUN --train-model MODEL`")
NO_SAMPLING = ("TRL kept no sampling log-probs this step (sampling_per_token_logps is None: without use_vllm=True, "
               "or a rollout_func that returns logprobs, TRL has none), so rcdiag records the trainer side only; "
               "use vLLM (use_vllm=True) to record both sides")


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
    processes one per process, `path/rank_<i>`). `options`: Recorder's (max_samples, tokenizer, sections …); the
    manifest sections read from the trainer (`grpo_context`) come first, `sections` given here override them.
    Returns the Recorder. A step whose record fails is skipped with one warning (the wrapped method's
    `rcdiag_guard` counts them); a step TRL gives one side only is recorded with one warning saying why."""
    guard = HookGuard("record_grpo")
    sections = guard.run(-1, grpo_context, trainer) or {}
    if isinstance(path, Recorder):
        recorder = path
        recorder.options.sections = merge_sections(sections, recorder.options.sections)
    else:
        options["sections"] = merge_sections(sections, options.get("sections") or {})
        recorder = Recorder(_rank_path(trainer, Path(path)), every, **options)
    original = trainer._generate_and_score_completions

    def generate_and_record(*args: Any, **kwargs: Any) -> Any:
        output = original(*args, **kwargs)
        step = guard.run(-1, lambda: int(trainer.state.global_step))
        if step is not None and isinstance(output, dict):
            _say_missing(guard, output)
            guard.run(step, record_trl_batch, recorder, step, output)
        return output

    generate_and_record.rcdiag_guard = guard  # type: ignore[attr-defined]
    trainer._generate_and_score_completions = generate_and_record
    return recorder


def _say_missing(guard: HookGuard, output: dict[str, Any]) -> None:
    """One warning (the first time) for a step with one side only: what TRL did not compute and what to set."""
    if output.get("old_per_token_logps") is None:
        guard.say_once("no_old", NO_OLD)
    if output.get("sampling_per_token_logps") is None:
        guard.say_once("no_sampling", NO_SAMPLING)


# --------------------------------------------------------------------------------------------- context
def grpo_context(trainer: Any) -> dict[str, Any]:
    """The manifest sections a GRPOTrainer's config and model say: `engine`, `trainer` (with `correction`),
    `model`, `provenance`. Reads only attributes (no TRL import); what the trainer does not say stays absent."""
    args = trainer.args
    model = getattr(trainer, "model", None)
    name = getattr(model, "name_or_path", None) or None
    use_vllm = bool(getattr(args, "use_vllm", False))
    top_k = getattr(args, "top_k", None)
    rollout_func = getattr(trainer, "rollout_func", None)
    engine = {"name": None if rollout_func is not None else "vllm" if use_vllm else "transformers", "model": name,
              "rollout_func": None if rollout_func is None else getattr(rollout_func, "__qualname__", "given"),
              "temperature": getattr(args, "temperature", None), "top_p": getattr(args, "top_p", None),
              "top_k": top_k, "min_p": getattr(args, "min_p", None)}
    if use_vllm and rollout_func is None:
        engine.update(_vllm_facts(trainer, args))
    settings = {n: getattr(args, n) for n in FRAMEWORKS["trl"].settings if hasattr(args, n)}
    correction = correction_section("trl", settings, SOURCE)
    if not use_vllm:  # TRL applies vllm_importance_sampling_* only with vLLM (grpo_trainer.py: use_vllm and …)
        correction["enabled"] = False
    trainer_section = {"framework": "trl", "framework_version": _version("trl"), "model": name,
                       "dtype": _compute_dtype(args, model), "temperature": getattr(args, "temperature", None),
                       "correction": correction,
                       "param_dtype": dtype_name(getattr(next(iter(model.parameters()), None), "dtype", None))
                       if model is not None and hasattr(model, "parameters") else None}
    config = getattr(model, "config", None)
    info = model_info(config.to_dict() if hasattr(config, "to_dict") else None, name=name,
                      where="the trainer's model.config (record_grpo)")
    out: dict[str, Any] = {"engine": _set(engine), "trainer": _set(trainer_section),
                           "provenance": {"engine": SOURCE, "trainer": SOURCE, "trainer.correction": SOURCE}}
    if info:
        out["model"] = info
        out["provenance"]["model"] = "the trainer's model.config (record_grpo)"
    return out


def _vllm_facts(trainer: Any, args: Any) -> dict[str, Any]:
    """What the engine section says about vLLM: its version and mode; colocated, the built engine's own dtype,
    quantization and KV-cache dtype, and TRL's logprobs_mode (trl 1.16 vllm_generation.py builds the colocated LLM
    with logprobs_mode="processed_logprobs"; a server's is its own --logprobs-mode, unknown here)."""
    mode = getattr(args, "vllm_mode", None)
    facts: dict[str, Any] = {"vllm_mode": mode, "version": _version("vllm")}
    if mode != "colocate":
        return facts
    facts["logprobs_mode"] = "processed_logprobs"
    llm = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    engine = getattr(llm, "llm_engine", None)
    model_config = getattr(engine, "model_config", None)
    cache_config = getattr(engine, "cache_config", None) or getattr(getattr(engine, "vllm_config", None),
                                                                    "cache_config", None)
    facts.update({"engine_dtype": "auto", "dtype_resolved": dtype_name(getattr(model_config, "dtype", None)),
                  "quantization": getattr(model_config, "quantization", None),
                  "kv_cache_dtype": getattr(cache_config, "cache_dtype", None)})
    return facts


def _compute_dtype(args: Any, model: Any) -> str | None:
    """The dtype the trainer's forward computes log-probs in: bf16 / fp16 mixed precision where GRPOConfig turns it
    on (accelerate autocasts the forward), else the parameters' dtype."""
    if getattr(args, "bf16", False):
        return "bfloat16"
    if getattr(args, "fp16", False):
        return "float16"
    params = getattr(model, "parameters", None)
    first = next(iter(params()), None) if callable(params) else None
    return dtype_name(getattr(first, "dtype", None))


def _version(package: str) -> str | None:
    module = sys.modules.get(package)
    version = getattr(module, "__version__", None)
    return str(version) if version is not None else None


def _set(section: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in section.items() if v is not None}


def _rank_path(trainer: Any, path: Path) -> Path:
    """One run directory per process (each writes its own shards): `path/rank_<i>` when there are several."""
    accelerator = trainer.accelerator
    return path / f"rank_{accelerator.process_index}" if accelerator.num_processes > 1 else path
