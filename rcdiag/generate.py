"""Stage 1 of `rcdiag score`: sample rollouts with vLLM and store each token with its processed log-prob.

Prompts are processed in fixed chunks of `shard_prompts` (shard k always holds prompts k·S … k·S+S−1), every
(prompt, sample) request gets its own seed derived from `seed`, and seq_id = prompt_index · n + sample_index, so
a killed run restarted with the same settings skips its complete shards and ends with exactly the rows of an
uninterrupted run.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.engine import (
    LOGPROBS_MODE,
    EngineSettings,
    check_model_dir,
    engine_facts,
    engine_session,
    model_files_hash,
    vllm_version,
)
from rcdiag.errors import ConfigError
from rcdiag.progress import progress
from rcdiag.prompts import RenderedPrompt, load_prompts, prompts_hash, render_prompts
from rcdiag.runstore import MANIFEST_NAME, RunWriter, new_manifest, read_manifest
from rcdiag.schema import SEQUENCE_SCHEMA, TOKEN_SCHEMA

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
                              trust_remote_code=self.trust_remote_code)


def request_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """A 63-bit seed for one (prompt, sample) request, independent of batching and shard boundaries."""
    digest = hashlib.blake2b(f"{seed}:{prompt_index}:{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def sampling_params(config: GenerateConfig, seed: int) -> Any:
    """vLLM SamplingParams of one request: n=1 (samples are separate requests, each with its own seed)."""
    from vllm import SamplingParams

    extra = {} if config.top_k is None else {"top_k": config.top_k}
    return SamplingParams(n=1, temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_tokens,
                          seed=seed, logprobs=0, **extra)


# --------------------------------------------------------------------------------------------------- one shard
@dataclass(frozen=True)
class Completion:
    """One finished request as stored: token ids (EOS included when sampled) with their processed log-probs."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None


def sampled_logprobs(completion: Any) -> list[float]:
    """The log-prob of each sampled token, from the per-position dicts vLLM returns (`logprobs=0` gives exactly
    the sampled token). Raises RuntimeError when vLLM returned no or misaligned log-probs."""
    ids, per_position = list(completion.token_ids), completion.logprobs
    if per_position is None or len(per_position) != len(ids):
        raise RuntimeError(f"vLLM returned {0 if per_position is None else len(per_position)} log-prob entries "
                           f"for {len(ids)} tokens; was logprobs=0 requested?")
    values = []
    for pos, (token, entry) in enumerate(zip(ids, per_position, strict=True)):
        if token not in entry:
            raise RuntimeError(f"vLLM's log-probs at position {pos} do not contain the sampled token {token}")
        values.append(float(entry[token].logprob))
    return values


def run_requests(llm: Any, chunk: Sequence[RenderedPrompt], config: GenerateConfig,
                 silent: bool = True) -> list[list[Completion]]:
    """Generate `config.n` samples for each prompt of `chunk`; result[i][j] is sample j of chunk[i]."""
    requests, params = [], []
    for item in chunk:
        for sample in range(config.n):
            requests.append({"prompt_token_ids": list(item.token_ids)})
            params.append(sampling_params(config, request_seed(config.seed, item.prompt.index, sample)))

    def bar(iterable: Any = None, **kwargs: Any) -> Any:  # vLLM's tqdm factory: adding, then running requests
        return progress(iterable, total=kwargs.get("total"), desc=kwargs.get("desc", ""), unit="req",
                        postfix=kwargs.get("postfix"))

    outputs = llm.generate(requests, params, use_tqdm=False if silent else bar)
    completions = []
    for output in outputs:
        (done,) = output.outputs
        completions.append(Completion(list(done.token_ids), sampled_logprobs(done), done.text, done.finish_reason))
    return [completions[i * config.n:(i + 1) * config.n] for i in range(len(chunk))]


def shard_tables(chunk: Sequence[RenderedPrompt], results: Sequence[Sequence[Completion]], n: int,
                 reward: Callable[[str, str], float] | None) -> tuple[pa.Table, pa.Table]:
    """(tokens, sequences) tables of one shard, sorted by seq_id; train columns null, mask True."""
    seq_rows: dict[str, list[Any]] = {name: [] for name in SEQUENCE_SCHEMA.names}
    seq_of_token, pos, token_ids, logprobs = [], [], [], []
    for item, samples in zip(chunk, results, strict=True):
        for sample_index, done in enumerate(samples):
            seq_id = item.prompt.index * n + sample_index
            length = len(done.token_ids)
            seq_of_token.append(np.full(length, seq_id, dtype=np.int64))
            pos.append(np.arange(length, dtype=np.int32))
            token_ids.append(np.asarray(done.token_ids, dtype=np.int32))
            logprobs.append(np.asarray(done.logprobs, dtype=np.float32))
            answer = item.prompt.answer
            row = {"seq_id": seq_id, "prompt_id": item.prompt.prompt_id, "sample_index": sample_index,
                   "prompt_text": item.prompt_text, "response_text": done.text, "prompt_len": len(item.token_ids),
                   "response_len": length, "finish_reason": done.finish_reason,
                   "reward": None if reward is None or answer is None else float(reward(done.text, answer)),
                   "step": None, "prompt_token_ids": list(item.token_ids)}
            for name, value in row.items():
                seq_rows[name].append(value)
    count = sum(len(a) for a in pos)

    def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    tokens = pa.Table.from_arrays([
        pa.array(cat(seq_of_token, np.int64)), pa.array(cat(pos, np.int32)), pa.array(cat(token_ids, np.int32)),
        pa.array(cat(logprobs, np.float32)), pa.nulls(count, pa.float32()), pa.nulls(count, pa.float32()),
        pa.array(np.ones(count, dtype=bool))], schema=TOKEN_SCHEMA)
    sequences = pa.Table.from_pydict(seq_rows, schema=SEQUENCE_SCHEMA)
    return tokens, sequences


# --------------------------------------------------------------------------------------------------- the run
def _reward_function(rendered: Sequence[RenderedPrompt]) -> Callable[[str, str], float] | None:
    if not any(item.prompt.answer is not None for item in rendered):
        return None
    from rcdiag.sample import reward

    return reward


def _load_tokenizer(model_dir: Path, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)


def _context_length(model_dir: Path, config: GenerateConfig) -> int | None:
    if config.max_model_len is not None:
        return config.max_model_len
    import json

    data = json.loads((model_dir / "config.json").read_text())
    value = data.get("max_position_embeddings") or (data.get("text_config") or {}).get("max_position_embeddings")
    return int(value) if value else None


def run_spec(config: GenerateConfig, model_dir: Path, model_hash: str, rendered: Sequence[RenderedPrompt]
             ) -> dict[str, Any]:
    """The settings that determine a run's rows: a resumed run must match them exactly."""
    settings = asdict(config)
    for name in ("gpu_memory_utilization", "trust_remote_code", "prompt_field", "limit"):
        settings.pop(name)
    return {"stage": "generate", "model": str(model_dir), "model_hash": model_hash, "vllm_version": vllm_version(),
            "logprobs_mode": LOGPROBS_MODE, "prompts_hash": prompts_hash(rendered), "prompts": len(rendered),
            **settings}


def _manifest(config: GenerateConfig, model_dir: Path, model_hash: str, prompts_path: Path,
              rendered: Sequence[RenderedPrompt], facts: dict[str, Any], tokenizer: dict[str, Any],
              rewards: bool) -> dict[str, Any]:
    engine = {"name": "vllm", "version": vllm_version(), "model": str(model_dir), "logprobs_mode": LOGPROBS_MODE,
              **{k: v for k, v in asdict(config).items() if k not in ("prompt_field", "limit", "shard_prompts")},
              "seed_scheme": "request (prompt i, sample j) seeded with blake2b(f'{seed}:{i}:{j}') & (2**63-1)",
              "eos_kept": True, **facts}
    chats = sum(item.prompt.messages is not None for item in rendered)
    return new_manifest(
        "generated", engine=engine, models={"engine": {"path": str(model_dir), "hash": model_hash}},
        tokenizer=tokenizer,
        prompts={"path": str(prompts_path.resolve()), "count": len(rendered), "chat": chats,
                 "field": config.prompt_field, "limit": config.limit, "hash": prompts_hash(rendered),
                 "shard_prompts": config.shard_prompts},
        rewards={"function": "rcdiag.sample.reward" if rewards else None},
        warnings=[f"truncated sampling (top_p={config.top_p}, top_k={config.top_k}) allowed: {TRUNCATION_HELP}"]
        if config.truncated else [])


def _tokenizer_section(model_dir: Path) -> dict[str, Any]:
    from rcdiag.tokenizer_check import tokenizer_fingerprint

    fingerprint = tokenizer_fingerprint(model_dir) or {}
    return {"path": str(model_dir), **{k: v for k, v in fingerprint.items() if not k.startswith("_")}}


def _check_engine(llm: Any, model_dir: Path) -> None:
    """A caller's engine must serve `model_dir`, or the stored rows would be attributed to the wrong model."""
    served = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "model", None)
    if served is not None and Path(served).resolve() != model_dir:
        raise ConfigError(f"the given engine serves {served}, not --model {model_dir}")


def generate_run(model: str | Path, prompts: str | Path, out: str | Path, config: GenerateConfig | None = None,
                 *, llm: Any = None, overwrite: bool = False, silent: bool = False) -> dict[str, Any]:
    """Generate (or resume) a run directory at `out`; returns its manifest.

    `llm`: an existing engine built from `model` (kept open; e.g. shared by tests), else one is built and shut
    down at the end. A complete run with the same settings is returned as is; different settings raise
    RunDirError unless `overwrite`. Raises ConfigError/InputError before any generation for bad settings/prompts.
    """
    config = config or GenerateConfig()
    model_dir = check_model_dir(model)
    if llm is not None:
        _check_engine(llm, model_dir)
    tokenizer = _load_tokenizer(model_dir, config.trust_remote_code)
    loaded = load_prompts(prompts, prompt_field=config.prompt_field, limit=config.limit)
    rendered = render_prompts(loaded, tokenizer, source=str(prompts), max_len=_context_length(model_dir, config))
    model_hash = model_files_hash(model_dir)
    writer = RunWriter(out, spec=run_spec(config, model_dir, model_hash, rendered), overwrite=overwrite)
    size = config.shard_prompts
    done = set(writer.complete_shards())
    todo = [k for k in range(math.ceil(len(rendered) / size)) if k not in done]
    if not todo and (writer.path / MANIFEST_NAME).exists():
        return read_manifest(writer.path)
    reward = _reward_function(rendered)
    with engine_session(config.engine_settings(str(model_dir)), llm) as engine, \
            progress(desc="generate", unit="tok", unit_scale=True, silent=silent) as bar:
        for k in todo:
            chunk = rendered[k * size:(k + 1) * size]
            tokens, sequences = shard_tables(chunk, run_requests(engine, chunk, config, silent), config.n, reward)
            writer.write_shard(k, tokens, sequences)
            bar.update(tokens.num_rows)
            bar.set_postfix_str(f"shard {k + 1}/{todo[-1] + 1}")
        facts = engine_facts(engine)
    manifest = _manifest(config, model_dir, model_hash, Path(prompts), rendered, facts,
                         _tokenizer_section(model_dir), reward is not None)
    return writer.finish(manifest)
