"""IS-weight statistics of one correction mode at one threshold, as a mergeable reduction over token chunks.

Sums of weights are exact (ExactSum, so the batching cannot change them) and variances are two-pass per chunk
merged with Chan's formula (no E[w²] − E[w]² cancellation when the weights are nearly equal).
Threshold comparisons are made in log space (ℓ̂ > log C), exactly, so ties (ρ = C) follow the METRICS.md rule
(a mask keeps w ≤ C; "high"/"low" use strict > and <) without exp() rounding.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from rcdiag.accum import ExactSum, Extremum, Moments, ratio
from rcdiag.conventions import LOG_RATIO_CLAMP, Convention
from rcdiag.tokendata import TokenChunk

IS_METRIC_NAMES = ("is_weight_mean", "is_weight_std", "is_weight_min", "is_weight_max", "ess", "clipped_frac",
                   "fraction_high", "fraction_low", "kept_token_frac", "kept_seq_frac")
_COUNTS = ("high", "low", "clipped", "high_f32", "low_f32", "kept_tokens", "kept_seqs")


def _geometric(s: np.ndarray, sh: np.ndarray, t: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(t > 0, np.clip(s / np.maximum(t, 1), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), 0.0)


def _swift(s: np.ndarray, sh: np.ndarray, t: np.ndarray) -> np.ndarray:
    return sh / np.maximum(t, 1)


def _product_clamped(s: np.ndarray, sh: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.clip(s, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _product(s: np.ndarray, sh: np.ndarray, t: np.ndarray) -> np.ndarray:
    return s


SEQ_LOG_RATIO = {"geometric": _geometric, "swift": _swift, "product_clamped": _product_clamped,
                 "product": _product}
"""log ρ_i^seq from (S_i = Σmℓ, Σmℓ̂, T_i) by Convention.is_seq_ratio (METRICS.md)."""


@dataclass
class ChunkView:
    """What all modes of one chunk share. `stat` = rows whose weights are scored (valid, not rejected by a
    rejection option), None when that is every row."""

    chunk: TokenChunk
    lr: np.ndarray
    rho: np.ndarray
    stat: np.ndarray | None
    stat_counts: np.ndarray
    seq_lr: np.ndarray
    seq_sum: np.ndarray

    @classmethod
    def build(cls, chunk: TokenChunk, conv: Convention, keep: np.ndarray | None) -> ChunkView:
        stat = None if keep is None and chunk.all_valid else (chunk.mask if keep is None else chunk.mask & keep)
        stat_counts = chunk.counts if stat is None else np.add.reduceat(stat.astype(np.int64), chunk.starts)
        s = chunk.seq_sum(chunk.ell)
        sh = chunk.seq_sum(chunk.log_ratio(LOG_RATIO_CLAMP)) if conv.is_seq_ratio == "swift" else s
        return cls(chunk, chunk.log_ratio(conv.token_clamp), chunk.ratio(conv.token_clamp), stat, stat_counts,
                   SEQ_LOG_RATIO[conv.is_seq_ratio](s, sh, chunk.counts), s)


@dataclass(frozen=True)
class Bounds:
    upper: float
    lower: float | None

    @property
    def log_upper(self) -> float:
        return math.log(self.upper)

    @property
    def log_lower(self) -> float:
        return -math.inf if self.lower is None else math.log(self.lower)

    @property
    def log_lo(self) -> float:
        """log of lo = L, or 1/C without L (for fraction_low)."""
        return self.log_lower if self.lower is not None else -self.log_upper


class ModeStats:
    """IS metrics of one (level, action, C, L) under one convention; update with ChunkViews, merge, finish."""

    def __init__(self, level: str, action: str, bounds: Bounds, conv: Convention, keep_weights: bool = False):
        self.level, self.action, self.bounds, self.conv = level, action, bounds, conv
        self.pop_sum = ExactSum()  # Σw over the population of mean/std: tokens, or sequences (trl)
        self.pop_moments = Moments()
        self.ess = {"e": ExactSum(), "e2": ExactSum()}  # Σw̃, Σw̃² of the token ESS weights
        self.n_pop = 0
        self.n_tok = 0
        self.n_stat_seqs = 0
        self.n_valid_tokens = 0
        self.n_valid_seqs = 0
        self.counts = dict.fromkeys(_COUNTS, 0)
        self.ext = Extremum()
        self.raw = Extremum()
        self.weights: list[np.ndarray] | None = [] if keep_weights else None

    # ------------------------------------------------------------------ update
    def update(self, view: ChunkView) -> None:
        chunk = view.chunk
        self.n_valid_tokens += int(chunk.counts.sum())
        self.n_valid_seqs += int(np.count_nonzero(chunk.counts))
        if self.level == "token":
            self._update_tokens(view)
        else:
            self._update_sequences(view)

    def _count(self, name: str, flags: np.ndarray, where: np.ndarray | None) -> None:
        self.counts[name] += int(np.count_nonzero(flags if where is None else flags & where))

    def _ess_weight(self, w: np.ndarray) -> np.ndarray:
        """w̃: swift clamps to [1/C, C] (rejected zeros count as 1/C); canonical/verl clamp to [0, C]."""
        if self.conv.ess == "swift":
            return np.clip(w, 1.0 / self.bounds.upper, self.bounds.upper)
        return np.clip(w, 0.0, self.bounds.upper)

    def _weigh(self, rho: np.ndarray, high: np.ndarray, below: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(w, flags of weights changed): truncate clamps to [L, C]; mask zeroes outside [L, C]."""
        out = high if below is None else high | below
        b = self.bounds
        if self.action == "truncate":
            w = np.minimum(rho, b.upper)
            return (w if b.lower is None else np.maximum(w, b.lower)), out
        return np.where(out, 0.0, rho), out

    def _update_tokens(self, view: ChunkView) -> None:
        chunk, stat, b = view.chunk, view.stat, self.bounds
        high = view.lr > b.log_upper
        below = view.lr < b.log_lower if b.lower is not None else None
        w, out = self._weigh(view.rho, high, below)
        self._add_rows(view, w, self._ess_weight(w), population=True)
        self._count("high", high, stat)
        self._count("low", view.lr < b.log_lo, stat)
        if "fraction_high" in self.conv.float32_counts:
            self.counts["high_f32"], self.counts["low_f32"] = self.counts["high"], self.counts["low"]
        self._count("clipped", out, stat)
        kept = ~out if self.action == "mask" else np.ones(chunk.n, dtype=bool)
        self._count_kept(chunk, kept if stat is None else kept & stat)

    def _add_rows(self, view: ChunkView, w: np.ndarray, e: np.ndarray, population: bool) -> None:
        """Sum per-row weights over scored rows (per sequence first, so the batching cannot matter)."""
        chunk, stat = view.chunk, view.stat
        if stat is not None:
            w, e = np.where(stat, w, 0.0), np.where(stat, e, 0.0)
        n = int(view.stat_counts.sum())
        self.ess["e"].add(chunk.seq_sum(e))
        self.ess["e2"].add(chunk.seq_sum(e * e))
        self.n_tok += n
        if population:
            self.pop_sum.add(chunk.seq_sum(w))
            scored = w if stat is None else w[stat]
            self.pop_moments.add(scored)
            self.n_pop += n
            self.ext.add(scored)
        if self.weights is not None:
            self.weights.append(np.where(chunk.mask, w, np.nan))

    def _count_kept(self, chunk: TokenChunk, kept_rows: np.ndarray) -> None:
        self.counts["kept_tokens"] += int(np.count_nonzero(kept_rows))
        per_seq = np.add.reduceat(kept_rows.astype(np.int64), chunk.starts)
        self.counts["kept_seqs"] += int(np.count_nonzero(per_seq))

    def _update_sequences(self, view: ChunkView) -> None:
        chunk, b, conv = view.chunk, self.bounds, self.conv
        lam, tp = view.seq_lr, view.stat_counts
        scored = tp > 0
        high = lam > b.log_upper
        below = lam < b.log_lower if b.lower is not None else None
        with np.errstate(over="ignore"):
            rho = np.exp(lam)
        w, out = self._weigh(rho, high, below)
        if conv.seq_mask_weight == "token" and self.action == "mask":
            wt = np.where(chunk.per_row(out), 0.0, view.rho)
            self._add_rows(view, wt, self._ess_weight(wt), population=True)
        else:
            self._add_rows(view, chunk.per_row(w), chunk.per_row(self._ess_weight(w)),
                           population=conv.seq_extrema != "per_sequence")
        if conv.seq_extrema == "per_sequence":
            self.pop_sum.add(w[scored])
            self.pop_moments.add(w[scored])
            self.n_pop += int(np.count_nonzero(scored))
            self.ext.add(w[scored])
        if conv.seq_extrema == "raw":
            self.raw.add(view.seq_sum[chunk.counts > 0])
        self.n_stat_seqs += int(np.count_nonzero(scored))
        self._count("high", high, scored)
        self._count("low", lam < b.log_lo, scored)
        self._count("clipped", out, scored)
        if conv.high_low_rows == "all":
            self._count("high_f32", lam > float(np.float32(b.log_upper)), scored)
            self._count("low_f32", lam < float(np.float32(b.log_lo)), scored)
        kept = ~out if self.action == "mask" else np.ones(out.size, dtype=bool)
        self.counts["kept_tokens"] += int(tp[kept].sum())
        self.counts["kept_seqs"] += int(np.count_nonzero(kept & scored))

    # ------------------------------------------------------------------ merge / finish
    def merge(self, other: ModeStats) -> None:
        self.pop_sum.merge(other.pop_sum)
        self.pop_moments.merge(other.pop_moments)
        for key in self.ess:
            self.ess[key].merge(other.ess[key])
        for name in ("n_pop", "n_tok", "n_stat_seqs", "n_valid_tokens", "n_valid_seqs"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for key in self.counts:
            self.counts[key] += other.counts[key]
        self.ext.merge(other.ext)
        self.raw.merge(other.raw)

    def finish(self, num_sequences: int, batch_normalize: bool = False) -> dict[str, float]:
        """IS metrics dict (IS_METRIC_NAMES); NaN where there is nothing to score."""
        conv = self.conv
        n_pop, ext_lo, ext_hi = self.n_pop, self.ext.lo, self.ext.hi
        moments = Moments(self.pop_moments.n, self.pop_moments.mean, self.pop_moments.m2)
        total = self.pop_sum.value()
        if conv.seq_extrema == "per_sequence" and self.level == "sequence" and self.n_valid_tokens:
            empty = num_sequences - self.n_pop  # empty rows: ratio exp(0) = 1, a weight of 1
            if empty > 0:
                n_pop, ext_lo, ext_hi = num_sequences, min(ext_lo, 1.0), max(ext_hi, 1.0)
                moments.merge(Moments(empty, 1.0, 0.0))
                total += empty
        var = moments.var if n_pop > 1 else (0.0 if n_pop == 1 else math.nan)
        w_min, w_max = (ext_lo, ext_hi) if n_pop else (math.nan, math.nan)
        if conv.seq_extrema == "raw" and self.level == "sequence" and self.n_valid_tokens:
            lo, hi = self.raw.lo, self.raw.hi
            if num_sequences > self.n_valid_seqs:
                lo, hi = min(lo, 0.0), max(hi, 0.0)
            w_min, w_max = math.exp(lo), math.exp(min(hi, LOG_RATIO_CLAMP))
        out = {"is_weight_mean": ratio(total, n_pop), "is_weight_std": math.sqrt(var), "is_weight_min": w_min,
               "is_weight_max": w_max, "ess": self._ess()}
        out.update(self._fractions(num_sequences))
        if batch_normalize:
            scale = out["is_weight_mean"]
            for key in ("is_weight_mean", "is_weight_std", "is_weight_min", "is_weight_max"):
                out[key] = out[key] / scale if scale else math.nan
        return out

    def _ess(self) -> float:
        n = self.n_tok
        if n == 0:
            return math.nan
        mean = self.ess["e"].value() / n
        second = self.ess["e2"].value() / n
        if mean <= 0.0:
            warnings.warn("every IS weight is 0 (all tokens masked or rejected): ESS is undefined (NaN)",
                          RuntimeWarning, stacklevel=4)
            return math.nan
        if self.conv.ess == "canonical":
            return mean * mean / second
        denominator = second / (mean + 1e-8) ** 2
        return 1.0 / (max(denominator, 1e-10) if self.conv.ess == "swift" else denominator)

    def _fractions(self, num_sequences: int) -> dict[str, float]:
        c, conv = self.counts, self.conv
        if self.n_valid_tokens == 0:  # no data is not "nothing clipped"
            return dict.fromkeys(("clipped_frac", "fraction_high", "fraction_low", "kept_token_frac",
                                  "kept_seq_frac"), math.nan)
        token = self.level == "token"
        scored = self.n_tok if token else self.n_stat_seqs
        clipped = ratio(c["clipped"], scored)
        if not token and conv.clipped_rows == "all":
            clipped = _f32(c["high"], num_sequences)
        high, low = ratio(c["high"], scored), ratio(c["low"], scored)
        if "fraction_high" in conv.float32_counts:
            rows = scored if token else num_sequences
            high, low = _f32(c["high_f32"], rows), _f32(c["low_f32"], rows)
        return {"clipped_frac": clipped, "fraction_high": high, "fraction_low": low,
                "kept_token_frac": ratio(c["kept_tokens"], self.n_valid_tokens),
                "kept_seq_frac": ratio(c["kept_seqs"], self.n_valid_seqs)}


def _f32(k: int, n: int) -> float:
    """The framework's float32 count share: float32(k) / float32(n) in float32 (NaN when n = 0)."""
    if n == 0:
        return math.nan
    return float(np.float32(k) / np.float32(n))
