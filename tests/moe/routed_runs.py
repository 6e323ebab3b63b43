"""Synthetic mixture-of-experts runs with both sides' routes, built the way the mismatch arises.

Per token and MoE layer, the trainer's router logits are z ~ N(0, σ²) over E experts and the engine's are z + ε
(rounding noise); each side routes to its own top-k, so choices flip exactly where the k-th and (k+1)-th logits are
close. The token is then drawn from the engine's next-token distribution, whose logits differ from the trainer's
by a small numeric noise plus a larger one per disagreeing layer (a different expert computes a different hidden
state), and both sides' log-probs of it are computed exactly in float64 — real log-probs, not clamped noise.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rcdiag.store.routes import PROMPT_ROUTES, RoutingInfo, prompt_column, token_columns
from rcdiag.store.writer import write_run


@dataclass(frozen=True)
class MoESpec:
    n_seq: int = 24
    min_len: int = 6
    max_len: int = 30
    layers: int = 4
    top_k: int = 2
    experts: int = 8
    router_scale: float = 1.0
    router_noise: float = 0.08
    vocab: int = 40
    numeric_noise: float = 0.01
    flip_noise: float = 0.25
    seed: int = 0


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _routes(z: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(top-k ids [T, L, k], probs of those then of the best unchosen [T, L, k+1]) of router logits [T, L, E]."""
    order = np.argsort(-z, axis=2, kind="stable")
    p = _softmax(z)
    return order[:, :, :k], np.take_along_axis(p, order[:, :, :k + 1], axis=2)


def moe_sequences(spec: MoESpec = MoESpec()) -> list[dict]:
    """Per sequence: prompt ids, token ids, both log-probs, both sides' routes and probabilities, prompt routes."""
    rng = np.random.default_rng(spec.seed)
    out = []
    for i in range(spec.n_seq):
        n = int(rng.integers(spec.min_len, spec.max_len + 1))
        z = rng.normal(0, spec.router_scale, (n, spec.layers, spec.experts))
        z_engine = z + rng.normal(0, spec.router_noise, z.shape)
        train_ids, train_p = _routes(z, spec.top_k)
        engine_ids, engine_p = _routes(z_engine, spec.top_k)
        flips = (np.sort(train_ids, 2) != np.sort(engine_ids, 2)).any(axis=2).sum(axis=1)
        logits = rng.normal(0, 2.5, (n, spec.vocab))
        eps = rng.normal(0, 1, logits.shape) * (spec.numeric_noise + spec.flip_noise * flips[:, None])
        p_train, p_engine = _softmax(logits), _softmax(logits + eps)
        tokens = np.array([rng.choice(spec.vocab, p=row) for row in p_engine])
        prompt = rng.integers(1, spec.vocab, int(rng.integers(3, 8)))
        out.append({"seq_id": i, "prompt": prompt, "tokens": tokens,
                    "rollout": np.log(p_engine[np.arange(n), tokens]), "train": np.log(p_train[np.arange(n), tokens]),
                    "engine_ids": engine_ids, "train_ids": train_ids, "engine_p": engine_p, "train_p": train_p,
                    "flips": flips,
                    "prompt_routes": rng.integers(0, spec.experts, (prompt.size - 1, spec.layers, spec.top_k))})
    return out


def write_moe_run(path: Path, spec: MoESpec = MoESpec(), sequences: list[dict] | None = None,
                  engine: str = "prefill_replay") -> tuple[Path, list[dict]]:
    """A run directory holding `moe_sequences(spec)` with both sides' route columns and a routing section."""
    seqs = sequences if sequences is not None else moe_sequences(spec)
    info = RoutingInfo(layers=spec.layers, top_k=spec.top_k, experts=spec.experts, engine=engine, trainer="rescored")
    tokens = pd.DataFrame({
        "seq_id": np.concatenate([np.full(s["tokens"].size, s["seq_id"]) for s in seqs]),
        "pos": np.concatenate([np.arange(s["tokens"].size) for s in seqs]),
        "token_id": np.concatenate([s["tokens"] for s in seqs]),
        "rollout_logprob": np.concatenate([s["rollout"] for s in seqs]).astype(np.float32),
        "train_logprob": np.concatenate([s["train"] for s in seqs]).astype(np.float32)})
    for side, ids, probs in (("engine", "engine_ids", "engine_p"), ("trainer", "train_ids", "train_p")):
        for name, column in token_columns(side, [s[ids] for s in seqs], info, probs=[s[probs] for s in seqs],
                                          source="synthetic").items():
            tokens[name] = column.to_pylist()
    sequences_df = pd.DataFrame({"seq_id": [s["seq_id"] for s in seqs],
                                 "prompt_token_ids": [s["prompt"].tolist() for s in seqs],
                                 "prompt_len": [s["prompt"].size for s in seqs]})
    sequences_df[PROMPT_ROUTES] = prompt_column([s["prompt_routes"] for s in seqs], info,
                                                source="synthetic").to_pylist()
    manifest = {"engine": {"name": "vllm", "temperature": 1.0}, "routing": info.to_dict(),
                "trainer": {"model": "synthetic", "dtype": "float32"}}
    write_run(path, tokens, sequences_df, manifest)
    return path, seqs
