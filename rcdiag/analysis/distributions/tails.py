"""Tail statistics of ℓ = a − b as a mergeable streaming accumulator: fine histograms, ratio bands, correlation.

Memory is fixed whatever the run's size: |ℓ| quantiles come from a log-spaced histogram with
`BINS_PER_DECADE` bins per decade over [1e-9, 1e4] nats (relative resolution 10^(1/200) − 1 ≈ 1.16 %; values
below 1e-9 count in an underflow bin reported as 0), the b-vs-a density from a fixed 2-D histogram, and the
worst tokens from a bounded top-K. Means, std, maxima, band shares and the Pearson correlation are exact sums.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rcdiag.analysis.conventions import LOG_RATIO_CLAMP

BINS_PER_DECADE = 200
LOG10_MIN, LOG10_MAX = -9, 4
EDGES = np.logspace(LOG10_MIN, LOG10_MAX, (LOG10_MAX - LOG10_MIN) * BINS_PER_DECADE + 1)
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
RATIO_BANDS = ((0.9, 1.1), (0.8, 1.25), (0.5, 2.0))
"""docs/metrics.md, 'Tails': share of tokens whose ratio exp(ℓ̂) lies outside each band."""
CLAMP = LOG_RATIO_CLAMP
DENSITY_RANGE = (-30.0, 0.0)
DENSITY_BINS = 300
"""b-vs-a density: 300 × 300 bins over [−30, 0] nats (0.1-nat cells); values outside land in the edge cells."""
WORST_K = 20
"""The worst tokens kept: the top WORST_K by |ℓ|, ties by (seq_id, pos) ascending (TailAccumulator.keep_worst)."""


def worst_rows(score: np.ndarray, floor: float = -np.inf, k: int = WORST_K) -> np.ndarray:
    """Positions, ascending, of the rows of `score` that can be among the k largest scores at or above `floor`:
    those ≥ the k-th largest, every row tied with it included (so keep_worst's order rule, not the partition's
    arbitrary order, picks among ties at the cut). NaN scores are never picked.

    Why a floor: the accumulator's own k-th worst |ℓ| so far (TailAccumulator.worst_floor) — after the first
    chunk few rows reach it, and one compare over the chunk replaces a partition of all of it (~10 ns a row)."""
    above = score >= floor
    count = int(np.count_nonzero(above))
    if count <= k:
        return np.flatnonzero(above)
    values = score if count == score.size else score[above]
    cut = np.partition(values, count - k)[count - k]  # the k-th largest (≥ floor)
    return np.flatnonzero(score >= cut)


def band_name(lo: float, hi: float) -> str:
    return f"frac_outside_{lo:g}_{hi:g}"


TAIL_NAMES = ("abs_log_ratio_mean", "abs_log_ratio_std", *(f"abs_log_ratio_{q}" for q in QUANTILES),
              "abs_log_ratio_max", *(band_name(lo, hi) for lo, hi in RATIO_BANDS), "prob_pearson_corr")
"""Names of the tail statistics in metrics.json (section "tails"), in display order."""


@dataclass
class TailAccumulator:
    """Streaming tails over valid, finite tokens. `update(l, a, b, keys)`; `merge`; `finish()` → dict."""

    n: int = 0
    sums: np.ndarray = field(default_factory=lambda: np.zeros(7))  # Σ|ℓ|, Σℓ², Σpa, Σpb, Σpa², Σpb², Σpa·pb
    max_abs: float = 0.0
    underflow: int = 0
    hist_pos: np.ndarray = field(default_factory=lambda: np.zeros(EDGES.size - 1, dtype=np.int64))
    hist_neg: np.ndarray = field(default_factory=lambda: np.zeros(EDGES.size - 1, dtype=np.int64))
    outside: np.ndarray = field(default_factory=lambda: np.zeros(len(RATIO_BANDS), dtype=np.int64))
    density: np.ndarray = field(default_factory=lambda: np.zeros((DENSITY_BINS, DENSITY_BINS), dtype=np.int64))
    worst: dict[str, np.ndarray] = field(default_factory=dict)

    def update(self, lr: np.ndarray, a: np.ndarray, b: np.ndarray, keys: dict[str, np.ndarray]) -> None:
        """lr (= a − b), a, b: float64 [n] of valid finite tokens; keys: seq_id, pos, token_id arrays [n] for worst tokens."""
        if not lr.size:
            return
        absl = np.abs(lr)
        pa_, pb_ = np.exp(a), np.exp(b)
        self.n += lr.size
        self.sums += (absl.sum(), (lr * lr).sum(), pa_.sum(), pb_.sum(), (pa_ * pa_).sum(), (pb_ * pb_).sum(),
                      (pa_ * pb_).sum())
        self.max_abs = max(self.max_abs, float(absl.max()))
        tiny = absl < EDGES[0]
        self.underflow += int(tiny.sum())
        idx = np.clip(np.searchsorted(EDGES, absl, side="right") - 1, 0, EDGES.size - 2)
        self.hist_pos += np.bincount(idx[~tiny & (lr > 0)], minlength=EDGES.size - 1)
        self.hist_neg += np.bincount(idx[~tiny & (lr < 0)], minlength=EDGES.size - 1)
        lc = np.clip(lr, -CLAMP, CLAMP)
        for i, (lo, hi) in enumerate(RATIO_BANDS):
            self.outside[i] += int(((lc < np.log(lo)) | (lc > np.log(hi))).sum())
        self._density(a, b)
        self._worst(absl, {"abs_log_ratio": absl, "log_ratio": lr, "train_logprob": a, "rollout_logprob": b, **keys})

    def _density(self, a: np.ndarray, b: np.ndarray) -> None:
        lo, hi = DENSITY_RANGE
        scale = DENSITY_BINS / (hi - lo)
        # clip before the cast: a -1e30 placeholder overflows int64 (numpy's "invalid value encountered in cast")
        ia = np.clip((a - lo) * scale, 0, DENSITY_BINS - 1).astype(np.int64)
        ib = np.clip((b - lo) * scale, 0, DENSITY_BINS - 1).astype(np.int64)
        self.density += np.bincount(ia * DENSITY_BINS + ib, minlength=DENSITY_BINS**2).reshape(self.density.shape)

    def _worst(self, score: np.ndarray, columns: dict[str, np.ndarray]) -> None:
        top = worst_rows(score, self.worst_floor())
        self.keep_worst({name: np.asarray(col)[top] for name, col in columns.items()})

    def worst_floor(self) -> float:
        """The smallest |ℓ| among the worst tokens once WORST_K are kept (a row below it can never enter), else −∞."""
        kept = self.worst.get("abs_log_ratio")
        return float(kept[-1]) if kept is not None and kept.size >= WORST_K else -np.inf

    def keep_worst(self, batch: dict[str, np.ndarray]) -> None:
        """Merge `batch` (columns of candidate rows) into the worst tokens: the WORST_K largest |ℓ|, ties by seq_id
        then pos, sorted so (worst_floor reads the last)."""
        merged = {n: np.concatenate([self.worst[n], v]) if self.worst else v for n, v in batch.items()}
        order = np.lexsort((merged["pos"], merged["seq_id"], -merged["abs_log_ratio"]))[:WORST_K]
        self.worst = {n: v[order] for n, v in merged.items()}

    def merge(self, other: TailAccumulator) -> TailAccumulator:
        self.n += other.n
        self.sums += other.sums
        self.max_abs = max(self.max_abs, other.max_abs)
        self.underflow += other.underflow
        self.hist_pos += other.hist_pos
        self.hist_neg += other.hist_neg
        self.outside += other.outside
        self.density += other.density
        if other.worst:
            self.keep_worst(other.worst)
        return self

    def quantile(self, q: float) -> float:
        """|ℓ| quantile from the histogram (geometric interpolation inside a bin); NaN when empty."""
        if self.n == 0:
            return float("nan")
        target = q * self.n
        if target <= self.underflow:
            return 0.0
        cum = np.cumsum(self.hist_pos + self.hist_neg) + self.underflow
        i = int(np.searchsorted(cum, target))
        if i >= cum.size:
            return self.max_abs
        below = cum[i - 1] if i else self.underflow
        frac = (target - below) / max(cum[i] - below, 1)
        value = EDGES[i] * (EDGES[i + 1] / EDGES[i]) ** frac
        return float(min(value, self.max_abs))

    def finish(self) -> dict[str, float]:
        """The TAIL_NAMES statistics (NaN for an empty run; Pearson NaN when either side is constant)."""
        n = self.n
        if n == 0:
            return dict.fromkeys(TAIL_NAMES, float("nan"))
        sabs, sl2, sa, sb, saa, sbb, sab = self.sums
        mean = sabs / n
        out = {"abs_log_ratio_mean": mean, "abs_log_ratio_std": float(np.sqrt(max(sl2 / n - mean**2, 0.0)))}
        out.update({f"abs_log_ratio_{name}": self.quantile(q) for name, q in QUANTILES.items()})
        out["abs_log_ratio_max"] = self.max_abs
        out.update({band_name(lo, hi): int(c) / n for (lo, hi), c in zip(RATIO_BANDS, self.outside, strict=True)})
        cov = sab / n - sa * sb / n**2
        var = (saa / n - (sa / n) ** 2) * (sbb / n - (sb / n) ** 2)
        out["prob_pearson_corr"] = float(cov / np.sqrt(var)) if var > 0 else float("nan")
        return {k: float(v) for k, v in out.items()}

    def signed_histogram(self, bins: int = 121, limit: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(edges [bins+1], counts [bins]) of ℓ on a linear axis over ±limit (default max|ℓ|), rebinned from the
        fine histogram (values beyond ±limit land in the outer bins)."""
        limit = max(limit if limit is not None else self.max_abs, 1e-6)
        edges = np.linspace(-limit, limit, bins + 1)
        centres = np.sqrt(EDGES[:-1] * EDGES[1:])
        counts = np.zeros(bins, dtype=np.int64)
        for sign, hist in ((1, self.hist_pos), (-1, self.hist_neg)):
            idx = np.clip(np.searchsorted(edges, sign * np.minimum(centres, limit), side="right") - 1, 0, bins - 1)
            counts += np.bincount(idx, weights=hist, minlength=bins).astype(np.int64)
        counts[bins // 2] += self.underflow
        return edges, counts

    def worst_tokens(self) -> list[dict[str, Any]]:
        """The WORST_K tokens by |ℓ| (ties by seq_id, pos), as plain dicts."""
        if not self.worst:
            return []
        names = list(self.worst)
        return [{n: _plain(self.worst[n][i]) for n in names} for i in range(self.worst[names[0]].size)]


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
