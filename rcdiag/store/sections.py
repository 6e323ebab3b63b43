"""The typed sections of a run's manifest (rcdiag.store.manifest.Manifest reads and writes them): one dataclass per
section, each known field with its type, every other key kept in `extra`. None = not recorded, everywhere: a
reader that needs a value says what it assumed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Source:
    """Where the rows came from: `generated`, `imported:<format>`, `manual`, … (+ importer conventions in extra)."""
    kind: str | None = "manual"
    retokenized: bool = False
    path: str | None = None
    lacks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Engine:
    """The rollout engine and its sampling settings (flat; see the module docstring). None = not recorded: a
    reader that needs a value falls back to the default of the setting itself (rcdiag.score.config.EngineSettings),
    which is defined there once."""
    name: str | None = None
    version: str | None = None
    model: str | None = None
    logprobs_mode: str | None = None
    dtype: str | None = None
    engine_dtype: str | None = None
    """The dtype asked of the engine (`--engine-dtype`; `auto` lets vLLM choose)."""
    dtype_resolved: str | None = None
    """The dtype the built engine resolved it to (rcdiag.score.engine.engine_facts)."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    allow_truncated_sampling: bool | None = None
    seed: int | None = None
    enable_prefix_caching: bool | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    replayed: bool | None = None
    """True once `rcdiag score --rescore-both` replaced the rollout side by a prefill replay (Measured)."""
    quantization: str | None = None
    """The engine's weight quantization as vLLM names it (`fp8`, `awq`, …); None = not recorded (an unquantized
    engine records nothing either: read None as "not known to be quantized")."""
    kv_cache_dtype: str | None = None
    """The engine's KV-cache dtype as vLLM names it (`auto` = the model dtype, `fp8`, `fp8_e4m3`, …)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def requested_dtype(self) -> str | None:
        """The dtype asked of the engine: `engine_dtype`, else the first release's `dtype`."""
        return self.engine_dtype or self.dtype


@dataclass
class Correction:
    """The trainer's own mismatch correction (`trainer.correction`), in rcdiag's vocabulary and as the framework
    named it — what the report, export and simulator default to (rcdiag.analysis.correction.trainer_defaults). Written by the
    TRL / verl hooks from the trainer's config and by `rcdiag import --trainer-setting` (rcdiag.store.context)."""
    framework: str | None = None
    """trl | verl | swift | slime: whose setting names `settings` holds."""
    enabled: bool | None = None
    """Whether the trainer applied a correction (TRL vllm_importance_sampling_correction, verl rollout_is or
    rollout_rs set, ms-swift rollout_importance_sampling_mode set, slime --use-tis); None = not known."""
    mode: str | None = None
    """The IS mode as rcdiag names it (token_truncate, token_mask, sequence_truncate, sequence_mask); None = none
    (or one rcdiag has no name for: `settings` says what)."""
    threshold: float | None = None
    """The upper bound C (None with `mode` set: no upper bound, TRL's clip_max=None)."""
    lower: float | None = None
    """The lower bound L, where the trainer sets one."""
    rejection: list[str] = field(default_factory=list)
    """verl rejection options as rcdiag reads them ("token_k1:0.5_2.0", …), applied before the IS weights."""
    batch_normalize: bool | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    """The framework's own setting names and values, as read (what the report quotes)."""
    source: str | None = None
    """Where they were read: "trl.GRPOConfig (record_grpo)", "verl config (record_verl_batch)", "rcdiag import
    --trainer-setting", …"""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trainer:
    """The trainer side's settings (`rcdiag score`'s rescore stage, a recorder, or what an importer learned)."""
    model: str | None = None
    model_hash: str | None = None
    dtype: str | None = None
    """The dtype the trainer computed its log-probs in (bfloat16, float16, float32)."""
    temperature: float | None = None
    attn_implementation: str | None = None
    framework: str | None = None
    """The RL framework that trained (trl, verl, …), where a recorder or importer knows it."""
    framework_version: str | None = None
    correction: Correction | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelRef:
    """One model named by the run (`models.engine`, …): its local path and content hash."""
    path: str | None = None
    hash: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


ROLLOUT_MEASURED = {
    "sampled": "the engine's log-probs of the tokens it sampled (decode, as the rollout used them)",
    "prefill_replay": "the engine re-reading given tokens as a prompt (prefill): decode-time effects (batch "
                      "composition, KV cache, the trainer's TP layout and engine version) are not in these numbers",
}
"""What `rollout_logprob` measured (Manifest.measured.rollout)."""
TRAINER_MEASURED = {
    "pi_old": "the trainer's log-probs of the batch before its update (π_old: a recompute, or rcdiag's rescoring)",
    "pi_theta_microstep": "π_θ at the micro-step, while the policy is being updated (no π_old recompute: prime-rl)",
}
"""What `train_logprob` measured (Manifest.measured.trainer)."""


@dataclass
class Measured:
    """What each side's log-probs are (ROLLOUT_MEASURED, TRAINER_MEASURED); None = not recorded. A manifest that
    does not say reads it from what it does say: a replayed engine (`engine.replayed`, set by `rcdiag score
    --rescore-both`) → "prefill_replay", whatever was written before (the replay overwrote the rollout side); a
    generated run → "sampled"; a rescored trainer side (`trainer.model`) → "pi_old"."""
    rollout: str | None = None
    trainer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TokenizerRef:
    """The run's tokenizer (`tokenizer`): its local path and vocabulary fingerprint, which `rcdiag score`'s
    vocabulary check holds a training model against (rcdiag.score.tokenizer_check)."""
    path: str | None = None
    vocab_size: int | None = None
    """Tokens with the added ones (len(AutoTokenizer))."""
    base_vocab_size: int | None = None
    hash: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Checkpoints:
    """What `rcdiag score --checkpoint` wrote (CHECKPOINTS_SECTION): its files, relative to the run, and each
    checkpoint's version label (name → policy version) that the lag split reads."""
    logprobs: str | None = None
    attribution: str | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)



ARCHITECTURES = ("dense", "moe")
"""Values of ModelInfo.architecture."""


@dataclass
class ModelInfo:
    """The policy model's architecture (`model`): what its config says, read by rcdiag.store.context.model_info
    from a model/tokenizer directory's config.json, a trainer's loaded config or a dump's; None = not known."""
    architecture: str | None = None
    """'dense' or 'moe' (a config with more than one expert)."""
    model_type: str | None = None
    """The config's model_type (qwen2, qwen3_moe, llama, …)."""
    architectures: list[str] = field(default_factory=list)
    """The config's architectures (Qwen2ForCausalLM, …)."""
    num_experts: int | None = None
    """Routed experts per MoE layer (num_experts / num_local_experts / n_routed_experts)."""
    experts_per_token: int | None = None
    """num_experts_per_tok (top-k of the router)."""
    config_dtype: str | None = None
    """The dtype the checkpoint is stored in (config torch_dtype / dtype): what vLLM's dtype 'auto' starts from."""
    name: str | None = None
    """The model as the source names it (a hub id or a path)."""
    config: str | None = None
    """The config.json that was read (absolute), when one was."""
    source: str | None = None
    """Where the facts came from ("config.json", "trl model.config", "--architecture", …)."""
    extra: dict[str, Any] = field(default_factory=dict)

