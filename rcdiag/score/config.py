"""Every setting of `rcdiag score` with its default, validated once: importable without torch or vLLM, so the CLI
shows the real defaults in --help and refuses a bad option before any engine starts.

Dtypes accept the names RL users type (bf16, fp16, fp32, half, float, in any case) and keep the canonical name.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from rcdiag.errors import ConfigError

ENGINE_DTYPES = ("auto", "bfloat16", "float16", "float32")
TRAIN_DTYPES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
"""What verl, TRL and ms-swift users type for a dtype → the torch name rcdiag stores."""
DTYPE_HELP = "(bf16, fp16, fp32 accepted)"


def canonical_dtype(name: str, choices: tuple[str, ...], option: str) -> str:
    """`name` as one of `choices` (aliases and case folded); ConfigError naming `option` otherwise."""
    key = str(name).strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in choices:
        raise ConfigError(f"{option} {name!r} is not one of {', '.join(choices)} (or bf16, fp16, fp32)")
    return key


SDPA_VARLEN = "sdpa_varlen"
DEVICE_HELP = "auto (cuda when available, else cpu) | cpu | cuda | cuda:N"
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device_name(device: str, option: str = "--device") -> str:
    """`device` when it is a name rcdiag runs on (DEVICE_HELP), without importing torch; ConfigError otherwise.
    Whether that device exists is `rcdiag.score.devices.resolve_device`'s question."""
    text = str(device).strip().lower()
    if not _DEVICE.fullmatch(text):
        raise ConfigError(f"{option} {device!r} is not one of {DEVICE_HELP}")
    return text


@dataclass(frozen=True)
class AttentionSpec:
    """An attention choice: the transformers name, the devices it runs on, and what it needs installed."""

    name: str
    devices: tuple[str, ...]
    requires: str | None = None
    note: str = ""


ATTENTION: dict[str, AttentionSpec] = {spec.name: spec for spec in (
    AttentionSpec(SDPA_VARLEN, ("cpu", "cuda"), note="per-sequence causal SDPA from cu_seqlens (rcdiag)"),
    AttentionSpec("flash_attention_2", ("cuda",), requires="flash_attn", note="flash-attention varlen"),
    AttentionSpec("sdpa", ("cpu", "cuda"), note="transformers packed detection, dense T×T mask per row"),
    AttentionSpec("flex_attention", ("cpu", "cuda"), note="transformers flex attention (compiles on first use)"),
    AttentionSpec("eager", ("cpu", "cuda"), note="transformers eager attention, dense T×T mask per row"),
)}
ATTN_CHOICES = ("auto", *ATTENTION)


@dataclass(frozen=True)
class EngineSettings:
    """What `vllm.LLM` is built with. `max_logprobs=-1` allows full-vocabulary prompt log-probs (replay)."""

    model: str
    dtype: str = "auto"
    seed: int = 0
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    trust_remote_code: bool = False
    max_logprobs: int = -1
    quantization: str | None = None
    """vLLM's `quantization` (fp8, …); None: the checkpoint's own."""
    kv_cache_dtype: str | None = None
    """vLLM's `kv_cache_dtype` (auto, fp8, fp8_e4m3, fp8_e5m2, …); None: vLLM's default (auto)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype, ENGINE_DTYPES, "--engine-dtype"))
        for name in ("quantization", "kv_cache_dtype"):
            value = getattr(self, name)
            if value is not None:
                text = str(value).strip().lower()
                if not re.fullmatch(r"[a-z0-9_]+", text):
                    raise ConfigError(f"--{name.replace('_', '-')} {value!r} is not a vLLM name (e.g. fp8)")
                object.__setattr__(self, name, text)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"--max-model-len must be ≥ 2, got {self.max_model_len}")


TRUNCATION_HELP = (
    "top-p < 1 or top-k truncate the sampling distribution: vLLM's processed log-probs are then renormalised over "
    "the kept tokens (log p − log S, S = the kept probability mass) while a trainer scores every token against the "
    "full vocabulary, so each rollout/train log-ratio is offset by log S and the importance weights are biased. "
    "Sample with --top-p 1 and no --top-k, or pass --allow-truncated-sampling to store them anyway (the manifest "
    "records it and reports flag it)")


@dataclass(frozen=True)
class GenerateConfig:
    """Every setting of the generation stage; the CLI reads its defaults from here."""

    n: int = 1
    """Samples per prompt (a GRPO group)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    """None (or ≤ 0): no top-k."""
    max_tokens: int = 256
    seed: int = 0
    """Base seed; request (prompt i, sample j) samples with `request_seed(seed, i, j)`."""
    engine_dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    allow_truncated_sampling: bool = False
    max_model_len: int | None = None
    shard_prompts: int = 256
    """Prompts per shard: the unit of resumption."""
    prompt_field: str | None = None
    limit: int | None = None
    trust_remote_code: bool = False
    quantization: str | None = None
    """The engine's weight quantization as vLLM names it (`--quantization`; None: the checkpoint's own)."""
    kv_cache_dtype: str | None = None
    """The engine's KV-cache dtype as vLLM names it (`--kv-cache-dtype`; None: auto, the model dtype)."""

    def __post_init__(self) -> None:
        if self.top_k is not None and self.top_k <= 0:
            object.__setattr__(self, "top_k", None)
        for name in ("n", "max_tokens", "shard_prompts"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be ≥ 1, got {getattr(self, name)}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ConfigError(f"--temperature must be a finite number > 0, got {self.temperature}: greedy "
                              "decoding has no sampling distribution to correct for; use e.g. 1.0 as RL does")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")
        object.__setattr__(self, "engine_dtype", canonical_dtype(self.engine_dtype, ENGINE_DTYPES, "--engine-dtype"))
        self.engine_settings("<model>")  # validates the engine options now, before any work
        if self.truncated and not self.allow_truncated_sampling:
            raise ConfigError(f"refusing to sample with top_p={self.top_p}, top_k={self.top_k}: {TRUNCATION_HELP}")

    @property
    def truncated(self) -> bool:
        """True when top-p/top-k cut the sampling distribution."""
        return self.top_p < 1 or self.top_k is not None

    def engine_settings(self, model: str) -> EngineSettings:
        return EngineSettings(model=model, dtype=self.engine_dtype, seed=self.seed,
                              gpu_memory_utilization=self.gpu_memory_utilization,
                              enable_prefix_caching=self.enable_prefix_caching, max_model_len=self.max_model_len,
                              trust_remote_code=self.trust_remote_code, quantization=self.quantization,
                              kv_cache_dtype=self.kv_cache_dtype)


@dataclass(frozen=True)
class RescoreConfig:
    """Settings of the rescoring stage (the CLI's --train-model, --train-dtype, --device, --token-budget,
    --chunk-tokens, --attn read their defaults from here)."""

    train_model: str | None = None
    """Training model directory; None: the run manifest's engine model path."""
    train_dtype: str = "float32"
    """float32 | bfloat16 | float16: the dtype the trainer computes in."""
    device: str = "auto"
    """auto (cuda when available, else cpu) | cpu | cuda | cuda:N; resolved before any engine starts."""
    token_budget: int = 4096
    """Tokens per packed row (a longer sequence gets a row of its own, with a warning)."""
    chunk_tokens: int = 1024
    """Response positions sent through the LM head at once (bounds the logits memory)."""
    attn: str = "auto"
    """auto | sdpa_varlen | flash_attention_2 | sdpa | flex_attention | eager."""
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "train_dtype", canonical_dtype(self.train_dtype, TRAIN_DTYPES, "--train-dtype"))
        object.__setattr__(self, "device", check_device_name(self.device))
        if self.attn not in ATTN_CHOICES:
            raise ConfigError(f"--attn {self.attn!r} is not one of {', '.join(ATTN_CHOICES)}")
        for name in ("token_budget", "chunk_tokens"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be ≥ 1, got {getattr(self, name)}")
