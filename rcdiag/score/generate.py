"""Stage 1 of `rcdiag score`: sample rollouts with vLLM and store each token with its processed log-prob.

Prompts are processed in fixed chunks of `shard_prompts` (shard k always holds prompts k·S … k·S+S−1), every
(prompt, sample) request gets its own seed derived from `seed`, and seq_id = prompt_index · n + sample_index, so
a killed run restarted with the same settings skips its complete shards and ends with exactly the rows of an
uninterrupted run.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.errors import ConfigError
from rcdiag.progress import Phases, progress, request_ticker
from rcdiag.score.config import GenerateConfig
from rcdiag.score.engine import (
    check_model_dir,
    engine_facts,
    engine_session,
    model_context_length,
    model_files_hash,
)
from rcdiag.score.prompts import RenderedPrompt, load_prompts, render_prompts
from rcdiag.score.routes import (
    PREFILL,
    SAMPLED,
    engine_moe_layers,
    engine_shard_routes,
    moe_shape,
    returns_routes,
)
from rcdiag.score.spec import generate_manifest, reward_function, run_spec, tokenizer_section
from rcdiag.store.files import MANIFEST_NAME
from rcdiag.store.manifest import read_manifest
from rcdiag.store.routes import PROMPT_ROUTES, ROUTING_SECTION, RoutingInfo, with_column
from rcdiag.store.schema import SEQUENCE_SCHEMA, TOKEN_SCHEMA
from rcdiag.store.writer import RunWriter
from rcdiag.tokenizers import load_tokenizer


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
    output: Any = None
    """vLLM's CompletionOutput (its `routed_experts` where the engine returns routes)."""


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
                 bar: Any = None) -> list[list[Completion]]:
    """Generate `config.n` samples for each prompt of `chunk`; result[i][j] is sample j of chunk[i].

    vLLM's own "Processed prompts" bar stays off; `bar` (a progress bar counting sequences), when given, moves
    by one per finished request."""
    requests, params = [], []
    for item in chunk:
        for sample in range(config.n):
            requests.append({"prompt_token_ids": list(item.token_ids)})
            params.append(sampling_params(config, request_seed(config.seed, item.prompt.index, sample)))
    outputs = llm.generate(requests, params, use_tqdm=False if bar is None else request_ticker(bar))
    completions = []
    for output in outputs:
        (done,) = output.outputs
        completions.append(Completion(list(done.token_ids), sampled_logprobs(done), done.text, done.finish_reason,
                                      done))
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


# --------------------------------------------------------------------------------------------------- routes
def engine_routing(llm: Any, model_dir: Path) -> RoutingInfo | None:
    """The route shape of the engine's model, None for a dense model (nothing is asked of the engine)."""
    shape = moe_shape(model_dir)
    if shape is None:
        return None
    layers = engine_moe_layers(llm)
    return shape.info(layers) if layers else None


def add_engine_routes(llm: Any, chunk: Sequence[RenderedPrompt], results: Sequence[Sequence[Completion]],
                      routing: RoutingInfo, tokens: pa.Table, sequences: pa.Table, *,
                      source: str) -> tuple[str, pa.Table, pa.Table]:
    """(what the routes are, tokens, sequences) of one shard with the engine's route columns added
    (rcdiag.score.routes.engine_shard_routes: returned by vLLM while sampling, or a prefill replay)."""
    pairs = [(item.token_ids, done.token_ids) for item, samples in zip(chunk, results, strict=True)
             for done in samples]
    outputs = [done.output for samples in results for done in samples]
    found = engine_shard_routes(llm, pairs, outputs, routing, source=source)
    for name, values in found.tokens.items():
        tokens = with_column(tokens, name, values)
    return found.what, tokens, with_column(sequences, PROMPT_ROUTES, found.prompt)


# --------------------------------------------------------------------------------------------------- the run
def _check_engine(llm: Any, model_dir: Path) -> None:
    """A caller's engine must serve `model_dir`, or the stored rows would be attributed to the wrong model."""
    served = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "model", None)
    if served is not None and Path(served).resolve() != model_dir:
        raise ConfigError(f"the given engine serves {served}, not --model {model_dir}")


def generate_run(model: str | Path, prompts: str | Path, out: str | Path, config: GenerateConfig | None = None,
                 *, llm: Any = None, overwrite: bool = False, silent: bool = False,
                 phases: Phases | None = None) -> dict[str, Any]:
    """Generate (or resume) a run directory at `out`; returns its manifest.

    `llm`: an existing engine built from `model` (kept open; e.g. shared by tests), else one is built and shut
    down at the end. A complete run with the same settings is returned as is; different settings raise
    RunDirError unless `overwrite`. Raises ConfigError/InputError before any generation for bad settings/prompts.
    `phases` times (and, unless silent, announces) loading prompts, starting the engine, generating, writing.
    """
    config = config or GenerateConfig()
    phases = phases or Phases(silent)
    model_dir = check_model_dir(model)
    if llm is not None:
        _check_engine(llm, model_dir)
    with phases("loading prompts", str(prompts)):
        tokenizer = load_tokenizer(model_dir, trust_remote_code=config.trust_remote_code, what="--model")
        loaded = load_prompts(prompts, prompt_field=config.prompt_field, limit=config.limit)
        rendered = render_prompts(loaded, tokenizer, source=str(prompts),
                                  max_len=model_context_length(model_dir, config.max_model_len))
    model_hash = model_files_hash(model_dir)
    writer = RunWriter(out, spec=run_spec(config, model_dir, model_hash, rendered), overwrite=overwrite)
    size = config.shard_prompts
    done = set(writer.complete_shards())
    todo = [k for k in range(math.ceil(len(rendered) / size)) if k not in done]
    if not todo and (writer.path / MANIFEST_NAME).exists():
        phases.say(f"{writer.path}: already generated with these settings; kept as is")
        return read_manifest(writer.path)
    reward = reward_function(rendered)
    with contextlib.ExitStack() as stack:
        with phases("starting vLLM engine", f"{model_dir.name}, loads the model"):
            engine = stack.enter_context(engine_session(config.engine_settings(str(model_dir)), llm))
            routing = engine_routing(engine, model_dir)
        what = PREFILL if routing is not None and not returns_routes() else SAMPLED
        requests = sum(len(rendered[k * size:(k + 1) * size]) for k in todo) * config.n
        with phases("generating", f"{requests} sequences"), \
                progress(total=requests, desc="generate", unit="seq", silent=silent) as bar:
            written = 0
            for k in todo:
                chunk = rendered[k * size:(k + 1) * size]
                results = run_requests(engine, chunk, config, bar)
                tokens, sequences = shard_tables(chunk, results, config.n, reward)
                if routing is not None:  # an MoE model: the engine's routes beside each token
                    what, tokens, sequences = add_engine_routes(engine, chunk, results, routing, tokens, sequences,
                                                                source=f"shard {k}")
                writer.write_shard(k, tokens, sequences)
                written += tokens.num_rows
                bar.set_postfix_str(f"{written:,} response tokens, shard {k + 1}/{todo[-1] + 1} written")
        facts = engine_facts(engine)
    with phases("writing manifest"):
        manifest = generate_manifest(config, model_dir, model_hash, Path(prompts), rendered, facts,
                                     tokenizer_section(model_dir), reward is not None)
        if routing is not None:
            manifest = {**manifest, ROUTING_SECTION: routing.with_side("engine", what).to_dict()}
        return writer.finish(manifest)
