"""The probe's exact divergences: whole next-token distributions of the engine and the trainer on a sample of the
probed positions (the math is `rcdiag.analysis.distributions.divergence`).

Why the probe and not `rcdiag score`: the engine side needs V log-probs per position back from vLLM (49k for
SmolLM2, 152k for Qwen), which would multiply a scoring run's cost; the probe already holds a sample of tokens
fixed and runs both sides on it. The engine side is a **prefill replay** (vLLM's full-vocabulary prompt log-probs,
raw, rescaled to the sampling temperature); the trainer side is the reference (float32, one sequence at a time)
read at its LM head. So the exact numbers describe the engine's prefill distribution against the trainer's; the
probe's `decode_vs_prefill` factor says how far decode is from that.

`DivergenceCollector` picks the positions (whole sequences in sample order until `positions` response tokens,
then a seeded subsample), holds each engine setting's `[K, V]` rows in a float32 memory map (disk, not RAM), and
is fed the reference trainer's logits chunk by chunk, reducing each chunk at once (chunk-bounded memory).
"""
from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.analysis.distributions.divergence import (
    PER_POSITION,
    exact_divergences,
    sampled_estimators,
    summarize,
)

Pair = tuple[np.ndarray, np.ndarray]


class DivergenceCollector:
    """Positions, engine rows and per-position divergences of one probe (see the module doc)."""

    def __init__(self, pairs: Sequence[Pair], positions: int, seed: int, vocab: int, *, top_p: float = 1.0,
                 top_k: int | None = None) -> None:
        lengths = np.array([len(r) for _, r in pairs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        take, total = [], 0
        for i, n in enumerate(lengths):  # whole sequences: the engine returns every position of a request
            if total >= positions:
                break
            take.append(i)
            total += int(n)
        flat = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in take]) if take else np.zeros(0, int)
        if flat.size > positions:
            flat = np.sort(np.random.default_rng(seed).choice(flat, size=positions, replace=False))
        self.flat = flat.astype(np.int64)
        """Flat indices (into the probe's token rows) of the chosen positions, sorted."""
        self.per_pair = [self.flat[(self.flat >= offsets[i]) & (self.flat < offsets[i + 1])] - offsets[i]
                         for i in range(len(pairs))]
        self.vocab, self.top_p, self.top_k = vocab, top_p, top_k
        self._dir = tempfile.TemporaryDirectory(prefix="rcdiag-divergence-")
        self.engine: dict[str, np.ndarray] = {}
        self.values: dict[str, dict[str, np.ndarray]] = {}

    def engine_rows(self, name: str) -> np.ndarray:
        """A `[K, V]` float32 memory map for engine setting `name`'s rows (filled by replay_distributions)."""
        path = Path(self._dir.name) / f"{name}.npy"
        rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(self.flat.size, self.vocab))
        self.engine[name] = rows
        self.values[name] = {k: np.full(self.flat.size, np.nan) for k in PER_POSITION}
        return rows

    def on_logits(self, flat_index: np.ndarray, logits: Any) -> None:
        """Trainer logits (`[C, V]` float32 at the temperature) of flat token rows `flat_index`: the chosen ones
        are compared with every engine setting's rows now."""
        where = np.searchsorted(self.flat, flat_index)
        hit = (where < self.flat.size) & (self.flat[np.minimum(where, self.flat.size - 1)] == flat_index)
        if not hit.any() or not self.engine:
            return
        import torch

        trainer = torch.log_softmax(logits[torch.from_numpy(np.flatnonzero(hit))].double(), dim=-1).cpu().numpy()
        rows = where[hit]
        for name, engine in self.engine.items():
            got = exact_divergences(np.asarray(engine[rows]), trainer[:, :engine.shape[1]], top_p=self.top_p,
                                    top_k=self.top_k)
            for key, value in got.items():
                self.values[name][key][rows] = value

    def results(self, frame: Any, token_columns: dict[str, str]) -> dict[str, Any]:
        """Per engine setting: the summary (means, quantiles) beside the sampled-token estimators on the same
        positions — `sampled` from that setting's own log-probs of the sampled tokens (the same distributions as
        the exact values: their k3 − exact gap is the estimator's own), `rollout` from the run's decode
        log-probs. `token_columns` maps engine setting → its column in `frame`; the trainer is `reference`."""
        out: dict[str, Any] = {"positions": int(self.flat.size), "top_p": self.top_p, "top_k": self.top_k,
                               "engine": "prefill replay (vLLM prompt log-probs, full vocabulary)",
                               "trainer": "reference (float32, one sequence at a time)"}
        trainer = frame["reference"].to_numpy(np.float64)[self.flat]
        for name, values in self.values.items():
            done = np.isfinite(values["kl_mu_pi"])
            per = {k: v[done] for k, v in values.items()}
            own = sampled_estimators(frame[token_columns[name]].to_numpy(np.float64)[self.flat][done], trainer[done])
            record = summarize(per, own["k1"], own["k3"])
            rollout = sampled_estimators(frame["rollout"].to_numpy(np.float64)[self.flat][done], trainer[done])
            record["rollout_kl"] = float(rollout["k1"].mean()) if done.any() else float("nan")
            record["rollout_k3_kl"] = float(rollout["k3"].mean()) if done.any() else float("nan")
            out[name] = record
        return out

    def columns(self, name: str, n_rows: int) -> dict[str, np.ndarray]:
        """Per-token columns for the probe's Parquet (NaN off the chosen positions): exact_<metric>."""
        cols = {}
        for key in ("kl_mu_pi", "kl_pi_mu", "tv", "js", "kept_mass_mu"):
            column = np.full(n_rows, np.nan, dtype=np.float32)
            column[self.flat] = self.values[name][key]
            cols[f"exact_{key}"] = column
        return cols

    def close(self) -> None:
        self.engine.clear()
        self._dir.cleanup()
