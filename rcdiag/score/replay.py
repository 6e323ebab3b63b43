"""Rollout log-probs of fixed tokens by vLLM prompt-logprob replay (for imported / retokenized runs).

vLLM returns prompt log-probs RAW (before temperature) whatever `logprobs_mode` says, so at T ≠ 1 every
position's full-vocabulary raw log-probs are requested and the sampled distribution is rebuilt as
log_softmax(raw / T), which equals log_softmax(z / T) of the logits z exactly (raw = z − logsumexp z). At T = 1 only
the token's own entry is needed. Cost at T ≠ 1: V log-probs per position travel back from the engine.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag.errors import ConfigError, RunDirError
from rcdiag.progress import Phases, progress
from rcdiag.score.engine import LOGPROBS_MODE, check_model_dir, engine_facts, engine_session, model_files_hash
from rcdiag.score.engine import vllm_version as _vllm_version
from rcdiag.score.generate import GenerateConfig
from rcdiag.store.files import TOKENS_DIR
from rcdiag.store.manifest import update_manifest
from rcdiag.store.run import Run, open_run
from rcdiag.store.writer import shard_marker, write_marked

REPLAYED_KEY = b"rcdiag.replayed"
"""Parquet key-value metadata of a token shard whose rollout_logprob came from replay (its JSON settings)."""


def position_logprob(entry: dict[int, Any], token: int, temperature: float) -> float:
    """Log-prob of `token` at temperature T from one position's raw prompt log-probs (all vocabulary entries):
    log_softmax(raw / T)[token]; at T = 1 the raw value itself. The one place of this conversion."""
    if temperature == 1.0:
        return float(entry[token].logprob)
    raw = np.fromiter((e.logprob for e in entry.values()), dtype=np.float64, count=len(entry)) / temperature
    top = raw.max()
    return float(entry[token].logprob / temperature - top - math.log(np.exp(raw - top).sum()))


def replay_logprobs(llm: Any, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                    temperature: float = 1.0) -> list[np.ndarray]:
    """log p_T(response[k] | prompt + response[:k]) for each sequence, as float64 arrays of len(response).

    `llm` must be built with max_logprobs=-1 (rcdiag.score.engine does). An empty response gives an empty array.
    Raises ConfigError for temperature ≤ 0 and ValueError for mismatched list lengths or an empty prompt.
    """
    from vllm import SamplingParams

    if not (math.isfinite(temperature) and temperature > 0):
        raise ConfigError(f"replay temperature must be > 0, got {temperature}")
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token (the first response token is scored after it)")
    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0 if temperature == 1.0 else -1)
    todo = [i for i, r in enumerate(response_ids) if len(r)]
    requests = [{"prompt_token_ids": [*map(int, prompt_ids[i]), *map(int, response_ids[i])]} for i in todo]
    outputs = llm.generate(requests, params, use_tqdm=False) if requests else []
    result = [np.zeros(0, dtype=np.float64) for _ in response_ids]
    for i, output in zip(todo, outputs, strict=True):
        start, ids = len(prompt_ids[i]), output.prompt_token_ids
        result[i] = np.array([position_logprob(output.prompt_logprobs[p], ids[p], temperature)
                              for p in range(start, len(ids))], dtype=np.float64)
    return result


# --------------------------------------------------------------------------------------------------- run
def _shard_inputs(tokens: pa.Table, sequences: pa.Table, file: Path) -> tuple[list[list[int]], list[list[int]]]:
    seq_ids = np.asarray(tokens.column("seq_id"))
    pos = np.asarray(tokens.column("pos"))
    token_ids = tokens.column("token_id")
    if token_ids.null_count:
        raise RunDirError(f"{file}: token_id is null on {token_ids.null_count} row(s); replay needs token ids")
    prompts = dict(zip(sequences.column("seq_id").to_pylist(), sequences.column("prompt_token_ids").to_pylist(),
                       strict=True))
    ids = np.asarray(token_ids)
    bounds = np.flatnonzero(np.diff(seq_ids)) + 1
    prompt_ids, responses = [], []
    for start, stop in zip([0, *bounds], [*bounds, len(seq_ids)], strict=True):
        seq = int(seq_ids[start])
        if not np.array_equal(pos[start:stop], np.arange(stop - start)):
            raise RunDirError(f"{file}: seq {seq} has positions that are not 0…{stop - start - 1}; replay needs "
                              "every response token")
        if not prompts.get(seq):
            raise RunDirError(f"{file}: seq {seq} has no prompt_token_ids; replay needs the prompt's token ids "
                              "(import them with --prompt-ids-field)")
        prompt_ids.append(prompts[seq])
        responses.append(ids[start:stop].tolist())
    return prompt_ids, responses


def replay_run(run: Run | str | Path, model: str | Path, config: GenerateConfig | None = None, *, llm: Any = None,
               overwrite: bool = False, silent: bool = False, phases: Phases | None = None) -> dict[str, Any]:
    """Fill `rollout_logprob` of every token of a run (a Run, as `score_run` opened it, or its path) by replaying
    its tokens through vLLM at `config.temperature`; returns the updated manifest. Shards already replayed with
    the same settings are skipped (resumable). Refuses a run that has rollout log-probs unless `overwrite`, and a
    temperature that differs from the one the manifest records."""
    config = config or GenerateConfig()
    phases = phases or Phases(silent)
    run = run if isinstance(run, Run) else open_run(run)
    recorded = run.info.engine.temperature if run.info.engine is not None else None
    if recorded is not None and float(recorded) != config.temperature:
        raise ConfigError(f"{run.path}: the manifest records sampling temperature {recorded}; replay with "
                          f"--temperature {recorded}")
    model_dir = check_model_dir(model)
    settings = {"model": str(model_dir), "model_hash": model_files_hash(model_dir), "vllm_version": _vllm_version(),
                "temperature": config.temperature, "engine_dtype": config.engine_dtype}
    files = [f for f in run.token_files if shard_marker(f, REPLAYED_KEY) != settings]  # the rest: done
    if not overwrite:
        for file in files:
            if pq.read_table(file, columns=["rollout_logprob"]).column(0).null_count != pq.read_metadata(
                    file).num_rows:
                raise RunDirError(f"{file}: already holds rollout log-probs; pass --overwrite to replace them "
                                  "with the replay")
    total = sum(pq.read_metadata(file).num_rows for file in files)
    with contextlib.ExitStack() as stack:
        with phases("starting vLLM engine", f"{model_dir.name}, loads the model"):
            engine = stack.enter_context(engine_session(config.engine_settings(str(model_dir)), llm))
        with phases("replaying", f"{total:,} response tokens through vLLM"), \
                progress(total=total, desc="replay", unit="tok", unit_scale=True, silent=silent) as bar:
            for file in files:
                _replay_shard(engine, run.path, file, config.temperature, settings)
                bar.update(pq.read_metadata(file).num_rows)
        facts = engine_facts(engine)
    engine_section = {"name": "vllm", "version": _vllm_version(), "model": str(model_dir),
                      "logprobs_mode": LOGPROBS_MODE, "replayed": True, "temperature": config.temperature,
                      "top_p": 1.0, "top_k": None, "engine_dtype": config.engine_dtype,
                      "replay_method": "raw prompt log-probs → log_softmax(raw / T)", **facts}
    return update_manifest(run.path, {"engine": engine_section,
                                      "models": {"engine": {"path": str(model_dir), "hash": settings["model_hash"]}}})


def _replay_shard(engine: Any, run_path: Path, file: Path, temperature: float, settings: dict[str, Any]) -> None:
    table = pq.read_table(file)
    sequences = pq.read_table(run_path / "sequences" / file.name, columns=["seq_id", "prompt_token_ids"])
    prompts, responses = _shard_inputs(table, sequences, Path(TOKENS_DIR) / file.name)
    values = replay_logprobs(engine, prompts, responses, temperature)
    column = pa.array(np.concatenate(values) if values else np.zeros(0), type=pa.float32())
    table = table.set_column(table.schema.get_field_index("rollout_logprob"), "rollout_logprob", column)
    write_marked(table, file, REPLAYED_KEY, settings)
