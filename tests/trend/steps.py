"""A synthetic multi-step run: one synthetic_frames block per step, with the engine noise (the mismatch) growing
from a known step, so drift detection and per-step exports have a known answer."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

import rcdiag
from rcdiag.store.run import Run
from tests.fixtures.runs import SyntheticSpec, synthetic_frames

BASE_NOISE = 0.03


def noise_schedule(steps: int, change: int | None, factor: float = 2.0) -> list[float]:
    """Engine noise per step: BASE_NOISE up to `change`, then × `factor` more each step (None: flat)."""
    return [BASE_NOISE * (factor ** (1 + s - change) if change is not None and s >= change else 1.0)
            for s in range(steps)]


def step_frames(noises: list[float], n_seq: int = 40, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(tokens, sequences) with a `step` column: step s is synthetic_frames(noise=noises[s], seed=seed + s)."""
    tokens, sequences = [], []
    for step, noise in enumerate(noises):
        tok, seq = synthetic_frames(replace(SyntheticSpec(), n_seq=n_seq, noise=noise, seed=seed + step))
        tok["seq_id"] += step * n_seq
        seq["seq_id"] += step * n_seq
        seq["prompt_id"] = [f"s{step}-{p}" for p in seq["prompt_id"]]
        seq["step"] = np.int64(step)
        tokens.append(tok)
        sequences.append(seq)
    return pd.concat(tokens, ignore_index=True), pd.concat(sequences, ignore_index=True)


def write_step_run(path: Path, noises: list[float], n_seq: int = 40, seed: int = 0, shard_tokens: int = 4000) -> Run:
    """A multi-step run on disk (several token files, so steps straddle file and chunk boundaries)."""
    tokens, sequences = step_frames(noises, n_seq, seed)
    return rcdiag.write_run(path, tokens, sequences, shard_tokens=shard_tokens)
