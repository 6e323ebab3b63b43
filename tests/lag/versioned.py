"""Versioned multi-step dumps shaped like the frameworks' own, from true log-softmax values: the engine samples each
token with the weights of its version (logits perturbed as a bf16 engine's would be), the trainer scores it with
its own version's, the policy drifting with each version. Each builder returns the rows it wrote, so a test can
compute the framework's logged numbers from them, independently of rcdiag.

- verl batch rows (`global_steps`, non-tensor `max_global_steps` / `min_global_steps`: a partial rollout spans
  versions), imported with the generic JSONL importer's verl profile;
- TRL AsyncGRPO rows (`model_version` of the sample, the trainer's `current_model_version` when consumed);
- a Recorder run with per-token versions (a partial rollout switches weights mid-response, as AReaL records).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

VOCAB = 48


@dataclass
class Sample:
    """One response: tokens, the engine's and the trainer's log-probs (float32), the loss mask and the version
    of each token (the sequence's oldest and newest are their min and max)."""

    step: int
    trainer: int
    prompt: list[int]
    tokens: list[int]
    rollout: np.ndarray
    train: np.ndarray
    mask: np.ndarray
    versions: np.ndarray

    @property
    def newest(self) -> int:
        return int(self.versions.max()) if self.versions.size else self.trainer

    @property
    def oldest(self) -> int:
        return int(self.versions.min()) if self.versions.size else self.trainer


def samples(steps: int = 4, batch: int = 10, seed: int = 0, drift: float = 0.5, noise: float = 0.04,
            empty_every: int = 7) -> list[Sample]:
    """Random samples per step: lag of the newest version 0, 1 or 2; a third of them partial (the first part on
    an older version); tool spans masked out; every `empty_every`-th response empty (it still counts as a
    trajectory). Trainer version at step s: s + 4 (versions start before the first logged step, and stay ≥ 0:
    AReaL and the recorder read a negative per-token version as "not generated")."""
    rng = np.random.default_rng(seed)
    base = torch.from_numpy(rng.standard_normal(VOCAB) * 2.0)
    directions = torch.from_numpy(rng.standard_normal((steps + 4, VOCAB)))
    out, k = [], 0
    for step in range(steps):
        trainer = step + 4
        for _ in range(batch):
            k += 1
            n = 0 if k % empty_every == 0 else int(rng.integers(3, 14))
            newest = trainer - int(rng.choice([0, 0, 1, 2]))
            versions = np.full(n, newest, dtype=np.int64)
            if n >= 4 and rng.random() < 0.35:
                versions[: n // 2] = newest - int(rng.integers(1, 3))
            context = torch.from_numpy(rng.standard_normal((n, VOCAB)))
            z_gen = base + context + drift * directions[torch.from_numpy(versions)]
            z_engine = z_gen + torch.from_numpy(rng.standard_normal((n, VOCAB))) * noise
            z_train = base + context + drift * directions[trainer]
            tok = torch.multinomial(torch.softmax(z_engine, -1), 1, generator=torch.Generator().manual_seed(k)) \
                if n else torch.zeros((0, 1), dtype=torch.long)

            def pick(z: torch.Tensor, tok: torch.Tensor = tok) -> np.ndarray:
                return torch.log_softmax(z, -1).gather(1, tok).squeeze(1).float().numpy().reshape(-1)

            mask = np.ones(n, dtype=np.int64)
            if n >= 8:
                mask[3:5] = 0  # a tool span
            rollout = pick(z_engine)
            rollout[mask == 0] = 0.0  # the frameworks' placeholder on tool tokens
            out.append(Sample(step, trainer, rng.integers(1, 500, 3).tolist(), tok.squeeze(1).tolist(), rollout,
                              pick(z_train), mask, versions))
    return out


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def verl_rows(path: Path, data: list[Sample]) -> Path:
    """verl batch rows (the trainer's DataProto as rows): responses, rollout_log_probs, old_log_probs,
    response_mask, global_steps (= trainer version + 1: the trainer at global step g trains version g − 1) and
    the agent loop's max/min_global_steps."""
    rows = [{"prompts": s.prompt, "responses": s.tokens, "rollout_log_probs": s.rollout.tolist(),
             "old_log_probs": s.train.tolist(), "response_mask": s.mask.tolist(), "global_steps": s.trainer + 1,
             "max_global_steps": s.newest, "min_global_steps": s.oldest} for s in data]
    return _jsonl(path, rows)


def trl_async_rows(path: Path, data: list[Sample]) -> Path:
    """TRL AsyncGRPO RolloutSample rows: input_ids over prompt + completion, completion_mask, the generator's
    old_log_probs (0.0 on the prompt and on masked tokens), the sample's model_version and the trainer's
    model_version when it consumed the sample (current_model_version), at the optimizer step."""
    rows = []
    for s in data:
        p = len(s.prompt)
        rows.append({"input_ids": s.prompt + s.tokens, "completion_mask": [0] * p + s.mask.tolist(),
                     "old_log_probs": [0.0] * p + np.where(s.mask == 1, s.rollout, 0.0).tolist(),
                     "train_log_probs": [0.0] * p + s.train.tolist(), "model_version": s.newest,
                     "current_model_version": s.trainer, "global_step": s.step})
    return _jsonl(path, rows)


def recorded_run(path: Path, data: list[Sample]) -> Path:
    """A Recorder run with per-token versions and the trainer's version, one `add` per step (an empty response
    has no token, so no version: it is an unversioned sequence there)."""
    from rcdiag.record import Recorder

    with Recorder(path) as recorder:
        for step in sorted({s.step for s in data}):
            batch = [s for s in data if s.step == step]
            recorder.add(step, [s.prompt for s in batch], [s.tokens for s in batch], [s.rollout for s in batch],
                         [s.train for s in batch], [s.mask for s in batch],
                         version=[s.versions.tolist() for s in batch], trainer_version=[s.trainer for s in batch])
    return path
