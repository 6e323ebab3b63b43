"""`rcdiag score --rescore-only RUN --checkpoint A,B,…`: which weights did the engine really sample with?

A weight sync that silently fails (TRL's sleep-mode sync, trl#5312), a prefix cache kept across refits (NeMo-RL
#4018) or an fp32 update below the bf16 engine's resolution all leave the engine on other weights than the
trainer believes. Rescoring a sample of the run's tokens with each candidate checkpoint and holding the result
against the rollout's log-probs names the checkpoint the engine matches best, per step, with the margin to the
runner-up: the engine's own numerical floor is small against a real change of weights, so the right checkpoint
wins by a wide factor. Checkpoints whose log-probs are bit-identical on the sample are reported as
indistinguishable (an update the dtype cannot hold, or no update at all).

Writes RUN/checkpoints/logprobs.parquet (seq_id, pos, mask, rollout_logprob, one float32 column per checkpoint)
and RUN/checkpoints/attribution.json atomically, and the manifest section `checkpoints` (rcdiag.store.manifest
.CHECKPOINTS_SECTION) naming them with each checkpoint's version label (`NAME=PATH`, NAME an integer: the
policy version it is, which the lag split uses for its exact per-token decomposition).
"""
from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.errors import ConfigError, RunDirError
from rcdiag.progress import Phases
from rcdiag.score.config import RescoreConfig
from rcdiag.score.rescore import run_temperature
from rcdiag.score.scoring import load_model, score_sequences
from rcdiag.store.files import write_json_atomic, write_parquet_atomic
from rcdiag.store.manifest import CHECKPOINTS_SECTION, abs_path, update_manifest
from rcdiag.store.run import open_run
from rcdiag.store.schema import mask_as_bool

DEFAULT_SAMPLE = 64
"""Sequences rescored per step (the first ones by seq_id): enough tokens that a change of weights stands out."""
OUT_DIR = "checkpoints"


def parse_checkpoints(text: str) -> dict[str, tuple[Path, int | None]]:
    """'A,B' or '3=ckpt/step3,4=ckpt/step4' → {name: (directory, version or None)}; ConfigError on a missing
    directory or a repeated name."""
    out: dict[str, tuple[Path, int | None]] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, path = item.rpartition("=") if "=" in item else ("", "", item)
        directory = Path(path).expanduser()
        if not (directory / "config.json").is_file():
            raise ConfigError(f"--checkpoint {path}: not a model directory (no config.json)")
        name = name or directory.name
        if name in out:
            raise ConfigError(f"--checkpoint: the name {name!r} is given twice (name them NAME=PATH)")
        out[name] = (directory, int(name) if name.lstrip("-").isdigit() else None)
    if len(out) < 2:
        raise ConfigError("--checkpoint needs at least two checkpoints to tell apart, comma-separated")
    return out


def _sample(run: Any, per_step: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], pa.Table, np.ndarray]:
    """(prompt, response) pairs of the first `per_step` sequences of each step, their token rows, and each
    token's step."""
    seqs = run.sequence_table(["seq_id", "step", "prompt_token_ids", "response_len"])
    frame = seqs.to_pandas()
    frame = frame[frame["response_len"].fillna(0) > 0]
    frame["step"] = frame["step"].fillna(-1).astype(np.int64)
    chosen = frame.sort_values("seq_id").groupby("step", sort=True).head(per_step).sort_values("seq_id")
    if chosen.empty:
        raise RunDirError(f"{run.path}: no sequence with response tokens to rescore")
    if chosen["prompt_token_ids"].isna().any():
        raise RunDirError(f"{run.path}: sequences without prompt_token_ids cannot be rescored")
    tokens = run.token_table(["seq_id", "pos", "token_id", "rollout_logprob", "mask"], seq_ids=chosen["seq_id"])
    tok_seq = np.asarray(tokens.column("seq_id"))
    ids = np.asarray(tokens.column("token_id"), dtype=np.int64)
    pairs = []
    for seq_id, prompt in zip(chosen["seq_id"], chosen["prompt_token_ids"], strict=True):
        lo, hi = np.searchsorted(tok_seq, seq_id, "left"), np.searchsorted(tok_seq, seq_id, "right")
        pairs.append((np.asarray(prompt, dtype=np.int64), ids[lo:hi]))
    steps = dict(zip(chosen["seq_id"], chosen["step"], strict=True))
    return pairs, tokens, np.array([steps[s] for s in tok_seq], dtype=np.int64)


def _score(path: Path, pairs: list[tuple[np.ndarray, np.ndarray]], config: RescoreConfig,
           temperature: float, silent: bool) -> np.ndarray:
    if silent:  # transformers' own "Loading weights" bar, under --quiet
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    model = load_model(path, dtype=config.train_dtype, device=config.device, attn=config.attn,
                       trust_remote_code=config.trust_remote_code)
    scored = score_sequences(model, pairs, temperature=temperature, token_budget=config.token_budget,
                             chunk_tokens=config.chunk_tokens, source=str(path)).logprobs
    del model
    gc.collect()
    return scored


def attribution(rollout: np.ndarray, mask: np.ndarray, steps: np.ndarray,
                scores: dict[str, np.ndarray]) -> dict[str, Any]:
    """Per step (and over all): mean |b − a_c| of every checkpoint c over the valid tokens, the best, the margin
    to the runner-up (absolute and as a ratio), and the groups of checkpoints that are bit-identical there.
    `rollout` b, `mask`, `steps`: per token; `scores` {name: a_c per token}. Pure numpy (tested on its own)."""
    names = list(scores)
    valid = mask & np.isfinite(rollout)

    def judge(where: np.ndarray) -> dict[str, Any]:
        dist = {n: float(np.mean(np.abs(rollout[where] - scores[n][where]))) if where.any() else float("nan")
                for n in names}
        groups: list[list[str]] = []
        for n in names:
            same = next((g for g in groups if np.array_equal(scores[g[0]][where], scores[n][where])), None)
            if same is None:
                groups.append([n])
            else:
                same.append(n)
        order = sorted(names, key=lambda n: dist[n])
        best, runner = order[0], next((n for n in order[1:] if n not in _group(groups, order[0])), None)
        margin = float("nan") if runner is None else dist[runner] - dist[best]
        return {"tokens": int(where.sum()), "mean_abs_diff": dist, "best": best if runner is not None else None,
                "runner_up": runner, "margin": margin,
                "ratio": float("inf") if runner is not None and dist[best] == 0 else
                (float("nan") if runner is None else dist[runner] / dist[best]),
                "identical": [g for g in groups if len(g) > 1]}

    per_step = {int(s): judge(valid & (steps == s)) for s in np.unique(steps)}
    return {"checkpoints": names, "overall": judge(valid), "by_step": per_step}


def _group(groups: list[list[str]], name: str) -> list[str]:
    return next(g for g in groups if name in g)


def attribute_checkpoints(run_path: str | Path, checkpoints: dict[str, tuple[Path, int | None]],
                          config: RescoreConfig = RescoreConfig(), *, sample: int = DEFAULT_SAMPLE,
                          silent: bool = False) -> dict[str, Any]:
    """Rescore `sample` sequences per step with each checkpoint; write and return the attribution (module
    docstring). One model is loaded at a time."""
    run = open_run(run_path)
    phases = Phases(silent)
    pairs, tokens, steps = _sample(run, sample)
    temperature = run_temperature(run.info)
    scores = {}
    for name, (path, _) in checkpoints.items():
        with phases(f"rescoring with {name}", f"{len(pairs)} sequences, {tokens.num_rows:,} tokens"):
            scores[name] = _score(path, pairs, config, temperature, silent)
    rollout = np.asarray(tokens.column("rollout_logprob").to_numpy(zero_copy_only=False), dtype=np.float64)
    mask = mask_as_bool(tokens)
    result = attribution(rollout, mask, steps, scores)
    result.update({"sample_per_step": sample, "train_dtype": config.train_dtype, "temperature": temperature,
                   "paths": {n: abs_path(p) for n, (p, _) in checkpoints.items()},
                   "versions": {n: v for n, (_, v) in checkpoints.items()}})
    out = Path(run.path) / OUT_DIR
    out.mkdir(exist_ok=True)
    table = tokens.select(["seq_id", "pos", "mask", "rollout_logprob"])
    for name, values in scores.items():
        table = table.append_column(f"logprob:{name}", pa.array(values, pa.float32()))
    write_parquet_atomic(table, out / "logprobs.parquet")
    write_json_atomic(out / "attribution.json", result)
    update_manifest(run.path, {CHECKPOINTS_SECTION: {"logprobs": f"{OUT_DIR}/logprobs.parquet",
                                                     "attribution": f"{OUT_DIR}/attribution.json",
                                                     "versions": result["versions"]}})
    return result


def summary_lines(result: dict[str, Any]) -> list[str]:
    """What the command prints: per step (and over all) the checkpoint the rollout matches, with the margin."""
    def line(label: str, judged: dict[str, Any]) -> str:
        dist = judged["mean_abs_diff"]
        listed = ", ".join(f"{n} {dist[n]:.3g}" for n in sorted(dist, key=dist.get))
        if judged["best"] is None:
            return f"  {label}: indistinguishable — every checkpoint gives identical log-probs ({listed})"
        said = (f"  {label}: rollout matches {judged['best']} (mean |Δ| {listed}; margin {judged['margin']:.3g}, "
                f"{judged['ratio']:.3g}× closer)")
        identical = [" = ".join(g) for g in judged["identical"]]
        return said + (f"; identical log-probs: {'; '.join(identical)}" if identical else "")

    lines = [f"Checkpoint attribution ({result['sample_per_step']} sequences per step, trainer dtype "
             f"{result['train_dtype']}, T={result['temperature']:g}): mean |rollout − checkpoint| per token"]
    lines += [line(f"step {s}" if s >= 0 else "no step", j) for s, j in result["by_step"].items()]
    lines.append(line("all steps", result["overall"]))
    return lines
