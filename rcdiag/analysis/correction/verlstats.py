"""The numbers verl logs beyond rcdiag's IS metrics, as mergeable reductions over token chunks.

Written from verl v0.9.0 (`483b8a009ba3`) `verl/trainer/ppo/rollout_corr_helper.py`:
`compute_rollout_correction_weights` (weights, IcePop `rollout_is_oob_ratio`, `rollout_is_batch_norm_factor`),
`compute_is_metrics` (`rollout_is_seq_*`), `compute_rollout_rejection_mask` and `compute_rs_metrics`
(`rollout_rs_<option>_*`, `rollout_rs_masked_fraction`, `rollout_rs_seq_masked_fraction`); and
`verl/utils/debug/metrics.py` (`training/rollout_probs_diff_*`, `training/rollout_actor_probs_pearson_corr`). verl computes all of them
once per training step over the whole step batch, on the ORIGINAL response mask (before rejection) and before batch
normalisation; rcdiag pools the whole data set as one batch (a data set of one step reproduces verl's values).

Differences kept on purpose (documented in docs/metrics.md): sums are exact float64 (verl float32); the `_std` values are
the two-pass float64 population std, exactly 0 for equal values (verl float32 `sqrt(max(E[x²] − E[x]², 0))`, which
is noise below ~1e-3); k3 is
`expm1(ℓ̂) − ℓ̂` (verl's float32 `exp(ℓ̂) − 1 − ℓ̂` is rounding noise for |ℓ| ≲ 1e-3); ties are decided exactly in
float64 (conventions.py). Where verl raises (no valid token in the batch) every value is NaN.
"""
from __future__ import annotations

import math

import numpy as np

from rcdiag.analysis.conventions import LOG_RATIO_CLAMP
from rcdiag.analysis.correction.rejection import Rejection
from rcdiag.analysis.passes.accum import ExactSum, Extremum, Moments
from rcdiag.analysis.passes.chunks import TokenChunk

IS_SEQ_NAMES = ("is_seq_mean", "is_seq_std", "is_seq_min", "is_seq_max", "is_seq_max_deviation",
                "is_seq_fraction_high", "is_seq_fraction_low")
"""verl's `rollout_is_seq_*` under rcdiag's names (+ `is_oob_ratio` for mask modes, `batch_norm_factor` when
batch-normalising)."""
RS_SUFFIXES = ("mean", "max", "min", "fraction_high", "fraction_low", "std", "seq_mean", "seq_std", "seq_max",
               "seq_min", "seq_max_deviation", "seq_fraction_high", "seq_fraction_low", "masked_fraction",
               "seq_masked_fraction")
"""Suffixes of verl's per-option `rollout_rs_<option>_<suffix>` (seq_fraction_low only for k1 options)."""
BATCH_NORM_MIN = 1e-8
"""verl divides by the normalisation factor only above this; otherwise it logs a factor of 1.0."""


class SeqValues:
    """Count, exact sum, moments and extrema of one value per row (mergeable); rows added later as zeros."""

    def __init__(self) -> None:
        self.total, self.moments, self.ext, self.dev = ExactSum(), Moments(), Extremum(), Extremum()

    def add(self, values: np.ndarray, centre: float) -> None:
        if values.size:
            self.total.add(values)
            self.moments.add(values)
            self.ext.add(values)
            self.dev.add(np.abs(values - centre))

    def merge(self, other: SeqValues) -> None:
        self.total.merge(other.total)
        self.moments.merge(other.moments)
        self.ext.merge(other.ext)
        self.dev.merge(other.dev)

    def summary(self, zeros: int, centre: float) -> dict[str, float]:
        """mean, unbiased std (0 for one row), min, max, max |v − centre| over the rows plus `zeros` zero rows."""
        moments = Moments(self.moments.n, self.moments.mean, self.moments.m2)
        moments.merge(Moments(zeros, 0.0, 0.0))
        n = moments.n
        if n == 0:
            return dict.fromkeys(("mean", "std", "min", "max", "max_deviation"), math.nan)
        lo, hi, dev = self.ext.lo, self.ext.hi, self.dev.hi
        if zeros:
            lo, hi, dev = min(lo, 0.0), max(hi, 0.0), max(dev, abs(centre))
        std = math.sqrt(max(moments.m2 / (n - 1), 0.0)) if n > 1 else 0.0
        return {"mean": self.total.value() / n, "std": std, "min": lo, "max": hi, "max_deviation": dev}


PROBS_NAMES = ("probs_diff_valid", "probs_diff_max", "probs_diff_mean", "probs_diff_std", "actor_probs_pearson_corr")
"""verl's `training/rollout_probs_diff_*` and `training/rollout_actor_probs_pearson_corr` under rcdiag's names."""


class VerlProbStats:
    """verl's debug metrics of the probabilities p_a = exp(a), p_b = exp(b) over the valid tokens of the step batch
    (`verl/utils/debug/metrics.py` `calculate_debug_metrics`, called by `ray_trainer.py` whenever the batch has
    `rollout_log_probs`, before any rejection): max, mean and unbiased std (`torch.std`) of |p_a − p_b| — the
    PROBABILITY difference, not |ℓ| — and `torch.corrcoef` of p_a and p_b. Moments are two-pass per chunk merged
    with Chan's formula (verl: float32 torch), so nearly equal probabilities keep their precision."""

    def __init__(self) -> None:
        self.diff, self.diff_max = Moments(), Extremum()
        self.n, self.mean_a, self.mean_b, self.m2_a, self.m2_b, self.c_ab = 0, 0.0, 0.0, 0.0, 0.0, 0.0

    def update(self, chunk: TokenChunk) -> None:
        pa = np.exp(chunk.valid_values(chunk.train).astype(np.float64))
        pb = np.exp(chunk.valid_values(chunk.rollout).astype(np.float64))
        if not pa.size:
            return
        d = np.abs(pa - pb)
        self.diff.add(d)
        self.diff_max.add(d)
        ma, mb = float(pa.mean()), float(pb.mean())
        da, db = pa - ma, pb - mb
        self._merge(int(pa.size), ma, mb, float(da @ da), float(db @ db), float(da @ db))

    def _merge(self, n: int, mean_a: float, mean_b: float, m2_a: float, m2_b: float, c_ab: float) -> None:
        """Chan's pairwise update of the co-moments (the cross term gains δa·δb·n₁n₂/n like M2 gains δ²)."""
        if n == 0:
            return
        total = self.n + n
        da, db = mean_a - self.mean_a, mean_b - self.mean_b
        w = self.n * n / total
        self.m2_a += m2_a + da * da * w
        self.m2_b += m2_b + db * db * w
        self.c_ab += c_ab + da * db * w
        self.mean_a += da * n / total
        self.mean_b += db * n / total
        self.n = total

    def merge(self, other: VerlProbStats) -> None:
        self.diff.merge(other.diff)
        self.diff_max.merge(other.diff_max)
        self._merge(other.n, other.mean_a, other.mean_b, other.m2_a, other.m2_b, other.c_ab)

    def finish(self) -> dict[str, float]:
        """verl's values: valid 0 and NaN without a valid token (as verl returns); std and correlation NaN for one
        token (torch's unbiased std and corrcoef divide by n − 1 = 0) and the correlation NaN when either side is
        constant (0/0); torch.corrcoef clips to [−1, 1]."""
        if self.n == 0:
            return {"probs_diff_valid": 0, **dict.fromkeys(PROBS_NAMES[1:], math.nan)}
        std = math.sqrt(self.diff.m2 / (self.n - 1)) if self.n > 1 else math.nan
        denominator = math.sqrt(self.m2_a * self.m2_b)
        corr = min(max(self.c_ab / denominator, -1.0), 1.0) if self.n > 1 and denominator > 0 else math.nan
        return {"probs_diff_valid": 1, "probs_diff_max": self.diff_max.hi, "probs_diff_mean": self.diff.mean,
                "probs_diff_std": std, "actor_probs_pearson_corr": corr}


class VerlISExtras:
    """verl's extra IS numbers for one mode: `rollout_is_seq_*` (per-row mean weight sw_i = Σ_t m w / T_i, 0 for
    an empty row, over all B rows; fractions on the raw per-row mean), `rollout_is_oob_ratio` (mask modes) and
    `rollout_is_batch_norm_factor` (token level: the token mean of w; sequence level: the mean of sw_i over rows
    with T_i > 0)."""

    def __init__(self, level: str, action: str, upper: float, lower: float | None) -> None:
        self.level, self.action, self.upper, self.lower = level, action, upper, lower
        self.lo = lower if lower is not None else 1.0 / upper  # verl's rollout_is_threshold_lower
        self.seq = SeqValues()
        self.token_sum = ExactSum()
        self.rows = self.tokens = self.high = self.low = self.oob = 0

    def _weigh(self, log_ratio: np.ndarray, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(applied weight, out of [L, C]) from ℓ̂ (ratio bounds compared in log space, ties kept)."""
        out = log_ratio > math.log(self.upper)
        if self.lower is not None:
            out |= log_ratio < math.log(self.lower)
        if self.action == "truncate":
            return np.minimum(raw, self.upper), out
        return np.where(out, 0.0, raw), out

    def update(self, chunk: TokenChunk, log_ratio: np.ndarray, ratio: np.ndarray) -> None:
        """Add a chunk; `log_ratio`, `ratio`: ℓ̂ and exp(ℓ̂) per row (verl's ±20 clamp)."""
        counts = chunk.counts
        valid = counts > 0
        t = np.maximum(counts, 1).astype(np.float64)
        if self.level == "token":
            raw = np.where(chunk.mask, ratio, 0.0)
            w, out = self._weigh(log_ratio, raw)
            w = np.where(chunk.mask, w, 0.0)
            sum_w = chunk.seq_sum(w)
            sw, rsw = sum_w / t, chunk.seq_sum(raw) / t
            self.oob += int(np.count_nonzero(out & chunk.mask))
            high, low = rsw > self.upper, rsw < self.lo
        else:
            lam = np.clip(chunk.sum_ell, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            with np.errstate(over="ignore"):
                w, out = self._weigh(lam, np.exp(lam))
            sum_w, sw = w * counts, w
            self.oob += int(counts[out].sum())
            high, low = lam > math.log(self.upper), lam < math.log(self.lo)
        self.seq.add(sw[valid], 1.0)
        self.token_sum.add(sum_w[valid])
        self.rows += int(np.count_nonzero(valid))
        self.tokens += int(counts.sum())
        self.high += int(np.count_nonzero(high & valid))
        self.low += int(np.count_nonzero(low & valid))

    def merge(self, other: VerlISExtras) -> None:
        self.seq.merge(other.seq)
        self.token_sum.merge(other.token_sum)
        for name in ("rows", "tokens", "high", "low", "oob"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def factor(self) -> float:
        """verl's batch-normalisation divisor (1.0 when it is ≤ 1e-8, as verl logs; NaN without valid tokens)."""
        if self.tokens == 0:
            return math.nan
        if self.level == "token":
            value = self.token_sum.value() / self.tokens
        else:
            value = self.seq.total.value() / self.rows
        return value if value > BATCH_NORM_MIN else 1.0

    def finish(self, num_sequences: int, batch_normalize: bool) -> dict[str, float]:
        empty = num_sequences - self.rows
        names = IS_SEQ_NAMES + (("is_oob_ratio",) if self.action == "mask" else ()) + (
            ("batch_norm_factor",) if batch_normalize else ())
        if self.tokens == 0:  # verl raises ValueError("response_mask must contain at least one valid token")
            return dict.fromkeys(names, math.nan)
        summary = self.seq.summary(empty, 1.0)
        out = {f"is_seq_{k}": v for k, v in summary.items()}
        out["is_seq_fraction_high"] = f32_share(self.high, num_sequences)
        out["is_seq_fraction_low"] = f32_share(self.low + empty, num_sequences)  # an empty row's mean is 0 < lo
        if self.action == "mask":
            out["is_oob_ratio"] = f32_share(self.oob, self.tokens)
        if batch_normalize:
            out["batch_norm_factor"] = self.factor()
        return out


class OptionStats:
    """verl's `rollout_rs_<option>_*` for one rejection option (compute_rs_metrics + the masked fractions)."""

    def __init__(self, rejection: Rejection) -> None:
        self.rejection = rejection
        lo, hi = rejection.bounds()
        self.k1 = rejection.statistic_name == "k1"
        self.hi, self.lo = hi, (lo if self.k1 else 0.0)  # verl's metrics thresholds
        self.token_sum, self.token_ext, self.clamped = ExactSum(), Extremum(), Moments()
        self.seq = SeqValues()
        self.tokens = self.rows = self.high = self.low = self.seq_high = self.seq_low = 0
        self.masked_tokens = self.masked_rows = 0

    def update(self, chunk: TokenChunk) -> np.ndarray:
        """Add a chunk; returns this option's keep flags per row."""
        values, per_seq = self.rejection.statistic(chunk)
        keep = self.rejection.keep_from(chunk, values, per_seq)
        counts = chunk.counts
        valid = counts > 0
        mask = chunk.mask
        rejected = mask & ~keep
        if per_seq is None:  # token option: per-row statistic, per-sequence mean over valid rows
            tok = chunk.valid_values(values)
            v = chunk.seq_sum(np.where(mask, values, 0.0)) / np.maximum(counts, 1)
            self.token_sum.add(tok)
            self.token_ext.add(tok)
            self.high += int(np.count_nonzero(tok > self.hi))
            self.low += int(np.count_nonzero(tok < self.lo))
            self.clamped.add(np.clip(tok, self.lo, self.hi))
        else:  # sequence option: the per-sequence statistic, broadcast to the row's tokens
            v = per_seq
            self.token_sum.add(v * counts)
            self.clamped.add_weighted(np.clip(v, self.lo, self.hi), counts)
        vv = v[valid]
        self.seq.add(vv, 0.0)
        self.seq_high += int(np.count_nonzero(vv > self.hi))
        self.seq_low += int(np.count_nonzero(vv < self.lo))
        self.tokens += int(counts.sum())
        self.rows += int(np.count_nonzero(valid))
        self.masked_tokens += int(np.count_nonzero(rejected))
        self.masked_rows += int(np.count_nonzero(np.logical_or.reduceat(rejected, chunk.starts)))
        return keep

    def merge(self, other: OptionStats) -> None:
        for name in ("token_sum", "token_ext", "clamped", "seq"):
            getattr(self, name).merge(getattr(other, name))
        for name in ("tokens", "rows", "high", "low", "seq_high", "seq_low", "masked_tokens", "masked_rows"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def finish(self) -> dict[str, float]:
        prefix = f"rs_{self.rejection.option}_"
        if self.tokens == 0:
            return {prefix + k: math.nan for k in RS_SUFFIXES}
        seq = {f"seq_{k}": v for k, v in self.seq.summary(0, 0.0).items()}
        sequence_option = self.rejection.scope != "token"
        out = {"mean": self.token_sum.value() / self.tokens}
        if sequence_option:
            out.update(max=seq["seq_max"], min=seq["seq_min"], fraction_high=f32_share(self.seq_high, self.rows),
                       fraction_low=f32_share(self.seq_low, self.rows) if self.k1 else 0.0)
        else:
            out.update(max=self.token_ext.hi, min=self.token_ext.lo, fraction_high=f32_share(self.high, self.tokens),
                       fraction_low=f32_share(self.low, self.tokens) if self.k1 else 0.0)
        out["std"] = math.sqrt(max(self.clamped.var, 0.0)) if self.tokens > 1 else 0.0
        out.update(seq)
        out["seq_fraction_high"] = f32_share(self.seq_high, self.rows)
        if self.k1:  # verl logs seq_fraction_low for k1 options only
            out["seq_fraction_low"] = f32_share(self.seq_low, self.rows)
        out["masked_fraction"] = f32_share(self.masked_tokens, self.tokens)
        out["seq_masked_fraction"] = f32_share(self.masked_rows, self.rows)
        return {prefix + k: v for k, v in out.items()}


class VerlRejectionStats:
    """Every `rollout_rs_*` number of a chain of rejection options (all must pass), mergeable over chunks."""

    def __init__(self, rejections: tuple[Rejection, ...]) -> None:
        self.options = [OptionStats(r) for r in rejections]
        self.tokens = self.masked_tokens = self.masked_rows = 0

    def update(self, chunk: TokenChunk) -> np.ndarray:
        """Add a chunk; returns the combined keep flags per row."""
        keep_all = np.ones(chunk.n, dtype=bool)
        for option in self.options:
            keep_all &= option.update(chunk)
        rejected = chunk.mask & ~keep_all
        self.tokens += int(chunk.counts.sum())
        self.masked_tokens += int(np.count_nonzero(rejected))
        self.masked_rows += int(np.count_nonzero(np.logical_or.reduceat(rejected, chunk.starts)))
        return keep_all

    def merge(self, other: VerlRejectionStats) -> None:
        for mine, theirs in zip(self.options, other.options, strict=True):
            mine.merge(theirs)
        self.tokens += other.tokens
        self.masked_tokens += other.masked_tokens
        self.masked_rows += other.masked_rows

    def finish(self, num_sequences: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for option in self.options:
            out.update(option.finish())
        if self.tokens == 0:
            return {**out, "rs_masked_fraction": math.nan, "rs_seq_masked_fraction": math.nan}
        out["rs_masked_fraction"] = f32_share(self.masked_tokens, self.tokens)
        out["rs_seq_masked_fraction"] = f32_share(self.masked_rows, num_sequences)  # over ALL B rows, as verl
        return out


def f32_share(k: int, n: int) -> float:
    """A framework's float32 count share k/n (`.float().mean()`): float32(k) / float32(n); NaN when n = 0."""
    if n == 0:
        return math.nan
    return float(np.float32(k) / np.float32(n))
