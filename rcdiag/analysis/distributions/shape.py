"""The shape of the mismatch across sequences: whether a few sequences hold most of it.

Numerical mismatch — rounding, kernels, batch shapes, MoE routing flips — hits tokens independently of which
sequence they belong to, so the mismatch is spread over the sequences: under routing flips the worst sequence holds
a few percent of Σ|ℓ|. A bug that pairs a sequence with the wrong row (another sequence's engine log-probs, a row
shifted after sorting by length, a sample index off by one) moves every token of those few sequences by nats, and
they hold most of Σ|ℓ|. `concentration` reads that from the per-sequence sums the report's pass keeps anyway.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

TOP_SHARE = 0.02
"""The 'few' sequences: the top 2 % by Σ|ℓ| (at least one)."""
CONCENTRATED_SHARE = 0.5
"""They hold most of the mismatch when their share of Σ|ℓ| exceeds this (and the sharing rule below)."""
CONCENTRATED_RATIO = 20.0
"""…and their mean |ℓ| per token is at least this many times the median sequence's (long sequences hold more Σ|ℓ|
by length alone; a different policy or row holds more per token)."""
MIN_SEQUENCES = 50
"""Fewer scored sequences than this: concentration is not judged (one sequence of ten holds 10 % by chance)."""


@dataclass(frozen=True)
class Concentration:
    """How much of Σ|ℓ| the top `top` of `sequences` scored sequences hold (`share`), their mean |ℓ| per token
    (`top_mean`) against the median sequence's (`median_mean`), and their seq_ids (worst first, at most five)."""

    sequences: int
    top: int
    share: float
    top_mean: float
    median_mean: float
    ids: tuple[int, ...]

    @property
    def ratio(self) -> float:
        return self.top_mean / self.median_mean if self.median_mean > 0 else math.inf

    @property
    def concentrated(self) -> bool:
        """A few sequences hold most of the mismatch, far beyond the typical sequence's level."""
        return (self.sequences >= MIN_SEQUENCES and self.share > CONCENTRATED_SHARE
                and self.ratio >= CONCENTRATED_RATIO)

    def to_dict(self) -> dict[str, object]:
        return {"sequences": self.sequences, "top": self.top, "share": self.share, "top_mean": self.top_mean,
                "median_mean": self.median_mean, "ratio": self.ratio, "ids": list(self.ids),
                "concentrated": self.concentrated}


def concentration(ids: np.ndarray, tokens: np.ndarray, sum_abs: np.ndarray) -> Concentration | None:
    """The concentration of Σ|ℓ| over sequences: `ids` int [S], `tokens` their scored token counts, `sum_abs` their
    Σ|ℓ| (the per-sequence table's T and sum_abs). None without a scored sequence or any mismatch."""
    tokens = np.asarray(tokens, dtype=np.float64)
    sum_abs = np.asarray(sum_abs, dtype=np.float64)
    scored = tokens > 0
    total = float(sum_abs[scored].sum())
    n = int(scored.sum())
    if n == 0 or not total > 0:
        return None
    ids, tokens, sum_abs = np.asarray(ids)[scored], tokens[scored], sum_abs[scored]
    k = max(1, math.ceil(TOP_SHARE * n))
    order = np.argsort(-sum_abs, kind="stable")[:k]
    mean = sum_abs / tokens
    return Concentration(n, k, float(sum_abs[order].sum() / total), float(sum_abs[order].sum() / tokens[order].sum()),
                         float(np.median(mean)), tuple(int(i) for i in ids[order[:5]]))
