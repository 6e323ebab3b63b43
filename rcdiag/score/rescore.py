"""Stage 2 of `rcdiag score`: rescore every response token of a run with the training model (transformers).

Reads a complete run directory, scores prompt + response ids padding-free (`rcdiag.score.scoring`), and writes
`train_logprob` / `train_entropy` (float32) into each token shard atomically. A rescored shard carries its trainer
settings in the Parquet key-value metadata (`rcdiag.rescored`), so a rerun with the same settings skips it.
The manifest gets a `trainer` section last. Everything that can be refused (model/vocabulary mismatch, token ids
out of range, sequences longer than the context) is checked over all shards before any model work.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag.errors import ConfigError, InputError, RunDirError
from rcdiag.progress import Phases, progress
from rcdiag.score.config import RescoreConfig
from rcdiag.score.devices import resolve_device
from rcdiag.score.engine import model_files_hash
from rcdiag.score.logprobs import choose_epilogue
from rcdiag.score.packing import cu_seqlens_from_lengths, unpack_positions
from rcdiag.score.routes import RESCORED, routing_update, trainer_hooks, with_trainer_routes
from rcdiag.score.scoring import (
    RescoreWarning,
    attention_used,
    check_sequence,
    load_config,
    load_model,
    model_limits,
    score_sequences,
)
from rcdiag.score.tokenizer_check import check_vocabulary
from rcdiag.store.files import SEQUENCES_DIR, TOKENS_DIR
from rcdiag.store.manifest import Manifest, abs_path, update_manifest
from rcdiag.store.run import Run, open_run
from rcdiag.store.writer import shard_marker, write_marked

RESCORED_KEY = b"rcdiag.rescored"
"""Parquet key-value metadata of a rescored token shard: the JSON trainer settings it was scored with."""


# --------------------------------------------------------------------------------------------------- manifest
def run_temperature(manifest: Manifest | dict[str, Any]) -> float:
    """The sampling temperature of the rollouts (`engine.temperature`); 1.0 with a warning when absent or
    greedy (0), since vLLM's processed log-probs of greedy requests are at temperature 1."""
    engine = Manifest.of(manifest).engine
    value = None if engine is None else engine.temperature
    if value is None:
        warnings.warn("the run manifest has no engine.temperature; rescoring at temperature 1.0 — if the "
                      "rollouts were sampled at another temperature the mismatch will look large",
                      RescoreWarning, stacklevel=3)
        return 1.0
    temperature = float(value)
    if not np.isfinite(temperature) or temperature < 0:
        raise RunDirError(f"manifest engine.temperature is {value!r}; it must be a finite number ≥ 0")
    if temperature == 0:
        warnings.warn("engine.temperature is 0 (greedy); rescoring at temperature 1.0", RescoreWarning,
                      stacklevel=3)
        return 1.0
    return temperature


def engine_model_path(manifest: Manifest | dict[str, Any]) -> str | None:
    """The engine's model as recorded in the manifest (`engine.model`, else `models.engine.path`)."""
    return Manifest.of(manifest).engine_model


# --------------------------------------------------------------------------------------------------- shards
def shard_pairs(tokens: pa.Table, sequences: pa.Table, *, source: str, vocab_size: int,
                max_context: int | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(prompt ids, response ids) per sequence of one shard, in sequence (= token row) order, validated.

    Needs `token_id` on every token row, positions 0..R-1 without gaps, and `prompt_token_ids` on every
    sequence with a response; raises InputError naming the file, row and field otherwise.
    """
    seq_ids = np.asarray(sequences.column("seq_id"))
    tok_seq = np.asarray(tokens.column("seq_id"))
    starts, ends = np.searchsorted(tok_seq, seq_ids, "left"), np.searchsorted(tok_seq, seq_ids, "right")
    if int((ends - starts).sum()) != tokens.num_rows:
        raise InputError("token rows reference sequences missing from the sequences file", file=source,
                         field="seq_id")
    token_column = tokens.column("token_id")
    if token_column.null_count:
        row = int(np.flatnonzero(np.asarray(token_column.is_null()))[0])
        raise InputError("token_id is null; rescoring needs the sampled token ids", file=source, row=row,
                         field="token_id", hint="imported runs need token ids (retokenize) before rescoring")
    _check_contiguous(np.asarray(tokens.column("pos")), ends - starts, tok_seq, source)
    token_ids = np.asarray(token_column, dtype=np.int64)
    prompts = sequences.column("prompt_token_ids").to_pylist()
    pairs = []
    for row, (prompt, start, end) in enumerate(zip(prompts, starts, ends, strict=True)):
        if prompt is None and end > start:
            raise InputError(f"prompt_token_ids is null for seq {int(seq_ids[row])}", field="prompt_token_ids",
                             file=source.replace(TOKENS_DIR, SEQUENCES_DIR), row=row,
                             hint="rescoring needs the prompt token ids the engine saw")
        pair = (np.asarray(prompt or [], dtype=np.int64), token_ids[start:end])
        check_sequence(*pair, vocab_size=vocab_size, max_context=max_context,
                       source=source.replace(TOKENS_DIR, SEQUENCES_DIR), row=row)
        pairs.append(pair)
    return pairs


def _check_contiguous(pos: np.ndarray, lengths: np.ndarray, seq: np.ndarray, source: str) -> None:
    """Every sequence's token rows must be positions 0, 1, …, R-1 (the model input is rebuilt from them)."""
    _, expected = unpack_positions(cu_seqlens_from_lengths(lengths))
    bad = np.flatnonzero(pos != expected)
    if bad.size:
        i = int(bad[0])
        raise InputError(f"seq {int(seq[i])} has position {int(pos[i])} where {int(expected[i])} was expected; "
                         "rescoring needs every response token", file=source, row=i + 1, field="pos")


def _shard_files(run_path: Path) -> list[tuple[Path, Path]]:
    seq_files = sorted((run_path / SEQUENCES_DIR).glob("part-*.parquet"))
    return [(run_path / TOKENS_DIR / f.name, f) for f in seq_files]


def _read(tok_file: Path, seq_file: Path) -> tuple[pa.Table, pa.Table]:
    try:
        return pq.read_table(tok_file), pq.read_table(seq_file, columns=["seq_id", "prompt_token_ids"])
    except (pa.ArrowInvalid, OSError, KeyError) as exc:
        raise RunDirError(f"{tok_file.parent.parent}: unreadable shard {tok_file.name} ({exc})") from None


def _marker(tok_file: Path) -> Any:
    return shard_marker(tok_file, RESCORED_KEY)  # the resume rule of a rewriting stage (rcdiag.store.writer)


def _write_scored(tokens: pa.Table, logprobs: np.ndarray, entropies: np.ndarray, settings: dict[str, Any],
                  tok_file: Path) -> None:
    for name, values in (("train_logprob", logprobs), ("train_entropy", entropies)):
        index = tokens.schema.get_field_index(name)
        tokens = tokens.set_column(index, pa.field(name, pa.float32()), pa.array(values, type=pa.float32()))
    write_marked(tokens, tok_file, RESCORED_KEY, settings)


# --------------------------------------------------------------------------------------------------- the stage
def trainer_settings(model_path: str, model: Any, config: RescoreConfig, temperature: float,
                     epilogue: str) -> dict[str, Any]:
    """The manifest's `trainer` section (also each rescored shard's marker)."""
    import torch
    import transformers

    return {"model": abs_path(model_path), "model_hash": model_files_hash(model_path), "dtype": config.train_dtype,
            "attn_implementation": attention_used(model), "temperature": temperature,
            "token_budget": config.token_budget, "chunk_tokens": config.chunk_tokens, "device": config.device,
            "epilogue": epilogue, "transformers_version": transformers.__version__,
            "torch_version": torch.__version__}


def rescore_run(run_path: Run | str | os.PathLike, config: RescoreConfig = RescoreConfig(), *,
                silent: bool = False, phases: Phases | None = None) -> dict[str, Any]:
    """Write train_logprob / train_entropy for every token of a run; returns the updated manifest.

    Shards already rescored with the same settings are skipped (resumable); refusals happen before any work.
    The bar counts the response tokens the run holds (the model also runs the prompts: the bar's rate is the
    rate of stored log-probs). `phases` times checking, loading the model and rescoring.
    """
    phases = phases or Phases(silent)
    config = replace(config, device=resolve_device(config.device))
    run = run_path if isinstance(run_path, Run) else open_run(run_path)  # score_run passes the Run it opened
    temperature = run_temperature(run.info)
    model_path = config.train_model or run.info.engine_model
    if model_path is None:
        raise ConfigError(f"{run.path}: the manifest names no engine model; pass --train-model")
    files = _shard_files(run.path)
    with phases("checking tokens", f"{len(files)} shard(s) against {Path(model_path).name}"):
        model_config = load_config(model_path, trust_remote_code=config.trust_remote_code)
        check_vocabulary(run.info, run.info.engine_model, model_path, model_config)
        vocab_size, max_context = model_limits(model_config)
        response_total = 0
        for tok_file, seq_file in files:  # validate every shard before loading the model
            tokens, sequences = _read(tok_file, seq_file)
            pairs = shard_pairs(tokens, sequences, source=f"{TOKENS_DIR}/{tok_file.name}",
                                vocab_size=vocab_size, max_context=max_context)
            response_total += sum(r.size for _, r in pairs)
    with phases("loading training model", f"{Path(model_path).name}, {config.train_dtype} on {config.device}"), \
            _transformers_bars(not silent):
        model = load_model(model_path, dtype=config.train_dtype, device=config.device, attn=config.attn,
                           trust_remote_code=config.trust_remote_code)
    epilogue_name, epilogue = choose_epilogue(response_total, vocab_size, config.device)
    settings = trainer_settings(model_path, model, config, temperature, epilogue_name)
    hooks = trainer_hooks(model)  # MoE models only: the trainer's routes (rcdiag.score.routes)
    settings.update({"routes": RESCORED} if hooks is not None else {})
    with phases("rescoring", f"{response_total:,} response tokens"), \
            progress(total=response_total, desc="rescore", unit="tok", unit_scale=True, silent=silent) as bar:
        for k, (tok_file, seq_file) in enumerate(files):
            bar.set_postfix_str(f"shard {k + 1}/{len(files)}")
            tokens, sequences = _read(tok_file, seq_file)
            pairs = shard_pairs(tokens, sequences, source=f"{TOKENS_DIR}/{tok_file.name}",
                                vocab_size=vocab_size, max_context=max_context)
            responses, done_before = sum(r.size for _, r in pairs), bar.n
            if _marker(tok_file) == settings:
                bar.update(responses)
                continue
            share = responses / max(_input_tokens(pairs), 1)  # rows report model input tokens; the bar counts
            with hooks or contextlib.nullcontext():
                scored = score_sequences(model, pairs, temperature=temperature, token_budget=config.token_budget,
                                         chunk_tokens=config.chunk_tokens, epilogue=epilogue,
                                         on_row=lambda n, share=share, cap=done_before + responses:
                                         advance(bar, n * share, cap),
                                         source=f"{SEQUENCES_DIR}/{seq_file.name}", routes=hooks)
            tokens = with_trainer_routes(tokens, hooks, source=f"{TOKENS_DIR}/{tok_file.name}")
            _write_scored(tokens, scored.logprobs, scored.entropies, settings, tok_file)
            advance(bar, done_before + responses - bar.n, done_before + responses)  # exact at each shard's end
    routing = routing_update(run.info, hooks, "trainer", RESCORED)
    return update_manifest(run.path, {"trainer": settings, **routing})


def advance(bar: Any, amount: float, cap: float) -> None:
    """Move `bar` by `amount`, never past `cap`: per-row progress is an estimate (input tokens scaled to response
    tokens), and a bar past its total makes tqdm warn and show more than 100 %."""
    step = min(amount, cap - bar.n)
    if step > 0:
        bar.update(step)


def _input_tokens(pairs: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """Tokens the model runs for these pairs (prompt + response minus its last token; empty responses: none)."""
    return sum(p.size + r.size - 1 for p, r in pairs if r.size)


@contextlib.contextmanager
def _transformers_bars(enabled: bool) -> Iterator[None]:
    """Show or hide transformers' weight-loading bars for the duration, then restore the previous state."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()

