"""Test data builders and a comparison that reports the largest deviation and where."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

CONVENTIONS = ("canonical", "swift", "verl", "trl")
MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def make_tokens(seed: int, n_seq: int = 12, max_len: int = 9, scale: float = 0.5, mask_p: float = 0.15,
                big_p: float = 0.05, zero_p: float = 0.1, min_len: int = 0) -> pd.DataFrame:
    """Random token rows: lengths in [min_len, max_len] (0 = no rows), float32 log-probs, ℓ mostly ~N(0, scale),
    some exactly 0 (ties at C=1), some |ℓ| > 20, some masked rows holding NaN (must be ignored)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=n_seq)
    n = int(lengths.sum())
    seq_id = np.repeat(np.arange(n_seq, dtype=np.int64) * 3 + 5, lengths)
    pos = np.concatenate([np.arange(k) for k in lengths]).astype(np.int32) if n else np.zeros(0, np.int32)
    b = (-rng.exponential(2.0, n)).astype(np.float32)
    ell = rng.normal(0.0, scale, n)
    ell = np.where(rng.random(n) < big_p, rng.choice([-1, 1], n) * rng.uniform(20, 40, n), ell)
    ell = np.where(rng.random(n) < zero_p, 0.0, ell)
    a = (b.astype(np.float64) + ell).astype(np.float32)
    mask = rng.random(n) >= mask_p
    a = np.where(~mask & (rng.random(n) < 0.5), np.float32(np.nan), a)
    return pd.DataFrame({"seq_id": seq_id, "pos": pos, "token_id": np.zeros(n, np.int32),
                         "rollout_logprob": b, "train_logprob": a, "mask": mask})


def assert_close(got: dict, want: dict, *, rel: float = 1e-11, abs_tol: float = 1e-13, what: str = "") -> None:
    """Every key of `want` matches `got` (NaN == NaN, inf == inf); the message names the worst key."""
    worst = None
    for key, expected in want.items():
        actual = got[key]
        if isinstance(expected, float) and math.isnan(expected):
            if not (isinstance(actual, float) and math.isnan(actual)):
                raise AssertionError(f"{what} {key}: expected NaN, got {actual!r}")
            continue
        if isinstance(expected, float) and math.isinf(expected):
            assert actual == expected, f"{what} {key}: expected {expected}, got {actual!r}"
            continue
        error = abs(float(actual) - float(expected))
        bound = abs_tol + rel * abs(float(expected))
        if error > bound and (worst is None or error / bound > worst[0]):
            worst = (error / bound, key, actual, expected, error)
    if worst is not None:
        _, key, actual, expected, error = worst
        raise AssertionError(f"{what} largest deviation at {key!r}: got {actual!r}, reference {expected!r} "
                             f"(|diff| {error:.3e})")


def split_frame(frame: pd.DataFrame, pieces: int, seed: int = 0) -> list[pd.DataFrame]:
    """Cut the rows into `pieces` consecutive batches at random places (sequences may be cut)."""
    n = len(frame)
    if pieces <= 1 or n == 0:
        return [frame]
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(pieces - 1, max(n - 1, 0)), replace=False))
    bounds = [0, *cuts.tolist(), n]
    return [frame.iloc[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
