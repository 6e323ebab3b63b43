"""THE table of off-policy metrics: one row per metric, read by the accumulator, the bootstrap and the name lists.

Every metric is a function of the per-sequence table (kernels.SEQ_COLUMNS): a per-sequence `term` reduced one of
three ways — "token": Σ_i term_i / Σ_i T_i (a mean over valid tokens); "sequence": the mean of term_i over the
sequence rows (those with T_i > 0, or every B row under a convention whose `seq_rows` is "all", an empty row
counting `empty`); "max" / "min": the extremum of term_i over those rows. MetricsAccumulator sums each term
exactly per chunk (analysis.metrics.compute), the bootstrap resamples the same terms per sequence (analysis.metrics.bootstrap), so
the two cannot disagree. Adding a metric is one row here (docs/recipes.md); `interval=True` also gives it a
bootstrap interval in the report.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rcdiag.analysis.conventions import LOG_RATIO_CLAMP, Convention

K3_COLUMN = {"clamped": "sum_k3", "clamped10": "sum_k3_swift", "raw": "sum_k3_raw"}
"""Convention.k3 → the per-sequence k3 column it sums."""


class Sequences:
    """The per-sequence columns a term reads (float64 arrays over some sequences with T_i > 0): every
    kernels.SEQ_COLUMNS name as an attribute (`s.sum_l`, `s.T`), and the per-sequence means ā, b̄, ℓ̄."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.__dict__.update(columns)
        self.mean_a = columns["sum_a"] / columns["T"]
        self.mean_b = columns["sum_b"] / columns["T"]
        self.mean_l = columns["sum_l"] / columns["T"]


Term = Callable[[Sequences, Convention], np.ndarray]


@dataclass(frozen=True)
class Metric:
    """One metric (module docstring). `empty`: an empty row's term (ā = b̄ = ℓ̄ = S = 0) for conventions that
    score all B rows; `no_token`: a token metric's value under ms-swift's no-data rule (no valid token: its
    max(N, 1) divisor gives Σ/1 = 0, or −1 for χ² = mean(ρ²) − 1); `interval`: a bootstrap interval in the report."""

    name: str
    kind: Literal["token", "sequence", "max", "min"]
    term: Term
    empty: float = 0.0
    no_token: float = 0.0
    interval: bool = False


def _chi2_seq(s: Sequences, conv: Convention) -> np.ndarray:
    log_ratio = s.sum_l if conv.chi2_seq == "product" else s.mean_l
    return np.expm1(2.0 * np.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


METRICS: tuple[Metric, ...] = (
    Metric("kl", "token", lambda s, c: -s.sum_l, interval=True),
    Metric("k3_kl", "token", lambda s, c: getattr(s, K3_COLUMN[c.k3]), interval=True),
    Metric("training_log_ppl", "sequence", lambda s, c: -s.mean_a),
    Metric("training_ppl", "sequence", lambda s, c: np.exp(-s.mean_a), empty=1.0),
    Metric("rollout_log_ppl", "sequence", lambda s, c: -s.mean_b),
    Metric("rollout_ppl", "sequence", lambda s, c: np.exp(-s.mean_b), empty=1.0),
    Metric("log_ppl_diff", "sequence", lambda s, c: -s.mean_l, interval=True),
    Metric("log_ppl_abs_diff", "sequence", lambda s, c: np.abs(s.mean_l), interval=True),
    Metric("log_ppl_diff_max", "max", lambda s, c: -s.mean_l),
    Metric("log_ppl_diff_min", "min", lambda s, c: -s.mean_l),
    Metric("ppl_ratio", "sequence", lambda s, c: np.exp(-s.mean_l), empty=1.0, interval=True),
    Metric("chi2_token", "token", lambda s, c: s.sum_chi2, no_token=-1.0, interval=True),  # ρ² − 1, accurate
    Metric("chi2_seq", "sequence", _chi2_seq, interval=True),
)
"""Every metric compute_metrics returns, in METRIC_NAMES order (docs/metrics.md's formulas)."""
EXTRA_INTERVALS: tuple[Metric, ...] = (
    Metric("abs_log_ratio_mean", "token", lambda s, c: s.sum_abs, interval=True),
)
"""Headline numbers with an interval that are not compute_metrics keys (mean |ℓ|: the tails, TRL's own)."""
METRIC_NAMES = tuple(m.name for m in METRICS)


def terms(metric: Metric, sequences: Sequences, conv: Convention) -> np.ndarray:
    """The metric's per-sequence terms over `sequences` (overflow gives inf, as a PPL beyond 1e308 is reported)."""
    with np.errstate(over="ignore"):
        return np.asarray(metric.term(sequences, conv), dtype=np.float64)
