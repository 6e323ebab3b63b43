"""IS-weight statistics of one correction mode at one threshold, as a mergeable reduction over token chunks.

Sums of weights are exact (per sequence, then ExactSum, so the batching cannot change them); variances are two-pass
per chunk merged with Chan's formula (no E[w²] − E[w]² cancellation for nearly equal weights). Threshold
comparisons are made in log space (ℓ̂ > log C), exactly, so ties (ρ = C) follow the docs/metrics.md rule (a mask keeps
w ≤ C; "high"/"low" use strict > and <) without exp() rounding. Sequence-level weights are reduced per sequence
(weight × T_i), never broadcast to tokens.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from rcdiag.analysis.conventions import LOG_RATIO_CLAMP, Convention
from rcdiag.analysis.correction import is_kernels
from rcdiag.analysis.correction.verlstats import f32_share
from rcdiag.analysis.passes.accum import ExactSum, Extremum, Moments, ratio
from rcdiag.analysis.passes.chunks import TokenChunk

IS_METRIC_NAMES = ("is_weight_mean", "is_weight_std", "is_weight_min", "is_weight_max", "ess", "clipped_frac",
                   "fraction_high", "fraction_low", "kept_token_frac", "kept_seq_frac")
_COUNTS = ("high", "low", "clipped", "high_f32", "low_f32", "kept_tokens", "kept_seqs")


def _geometric(s: np.ndarray, sh: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.where(t > 0, np.clip(s / np.maximum(t, 1), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), 0.0)


def _swift(s: np.ndarray, sh: np.ndarray, t: np.ndarray) -> np.ndarray:
    return sh / np.maximum(t, 1)


def _product_clamped(s: np.ndarray, sh: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.clip(s, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _product(s: np.ndarray, sh: np.ndarray, t: np.ndarray) -> np.ndarray:
    return s


SEQ_LOG_RATIO = {"geometric": _geometric, "swift": _swift, "product_clamped": _product_clamped,
                 "product": _product}
"""log ρ_i^seq from (S_i = Σmℓ, Σmℓ̂, T_i) by Convention.is_seq_ratio (docs/metrics.md)."""


@dataclass(frozen=True)
class SequenceValues:
    """Per-sequence inputs of the sequence-level modes over some chunks: log ρ_i^seq, T'_i and S_i of the scored
    sequences, S_i of the sequences with T_i > 0 (verl's raw extrema), and the valid tokens and sequences."""

    lam: np.ndarray
    counts: np.ndarray
    scored_sum: np.ndarray
    valid_sum: np.ndarray
    valid_tokens: int
    valid_seqs: int

    @classmethod
    def concat(cls, parts: list[SequenceValues]) -> SequenceValues:
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("lam", "counts", "scored_sum",
                                                                                "valid_sum")),
                   sum(p.valid_tokens for p in parts), sum(p.valid_seqs for p in parts))


_SEQUENCES_AT = 1 << 15
"""Sequences a sequence-level mode buffers before reducing them: its numpy work per chunk is a few dozen calls on
arrays of ~100 values. Per chunk, the report's 28-mode sweep accumulator took 22.1 ns a token; buffered, 17.8
(issue #15, measured alternately in one process on the 10 M run's chunks)."""


@dataclass
class ChunkView:
    """What all modes of one chunk share. Scored rows = valid and not rejected by a rejection option: `stat` the row
    flags (None when every row is scored), `stat_counts` T'_i per sequence, `scored` T'_i > 0; `lr_rows`, `rho_rows`
    ℓ̂ and ρ on every row; `lr`, `rho`, `starts` the same compressed to the scored rows; `seq_lr` log ρ_i^seq and
    `seq_sum` S_i per sequence. Everything past the rows is built on first use: token-level modes never need it."""

    chunk: TokenChunk
    lr_rows: np.ndarray
    rho_rows: np.ndarray
    stat: np.ndarray | None
    conv: Convention
    rejected: bool

    @classmethod
    def build(cls, chunk: TokenChunk, conv: Convention, keep: np.ndarray | None) -> ChunkView:
        lr, rho = chunk.token_rows(conv.token_clamp)
        stat = None if keep is None and chunk.all_valid else (chunk.mask if keep is None else chunk.mask & keep)
        return cls(chunk, lr, rho, stat, conv, keep is not None)

    @cached_property
    def stat_counts(self) -> np.ndarray:
        if not self.rejected:
            return self.chunk.counts
        return np.add.reduceat(self.stat.view(np.int8), self.chunk.starts, dtype=np.int64)

    @cached_property
    def scored(self) -> np.ndarray:
        return self.stat_counts > 0

    @property
    def seq_sum(self) -> np.ndarray:
        return self.chunk.sum_ell

    @cached_property
    def valid(self) -> tuple[int, int]:
        """(valid tokens, sequences with one) of the chunk, counted once for every mode."""
        counts = self.chunk.counts
        return int(counts.sum()), int(np.count_nonzero(counts))

    @cached_property
    def sequences(self) -> SequenceValues:
        """What a sequence-level mode reads of this chunk, shared by all of them."""
        scored = self.scored
        return SequenceValues(self.seq_lr[scored], self.stat_counts[scored], self.seq_sum[scored],
                              self.seq_sum[self.chunk.counts > 0], *self.valid)

    @cached_property
    def seq_lr(self) -> np.ndarray:
        conv, chunk = self.conv, self.chunk
        sh = chunk.column("sum_lhat") if conv.is_seq_ratio == "swift" else chunk.sum_ell
        return SEQ_LOG_RATIO[conv.is_seq_ratio](chunk.sum_ell, sh, chunk.counts)

    @property
    def scores_kept(self) -> bool:
        """The scored rows are the chunk's kept rows and ℓ̂, ρ its own terms (no rejection, a validated chunk, the
        ±LOG_RATIO_CLAMP clamp): what is_kernels.token_modes_core reads."""
        return not self.rejected and self.chunk.validated and self.conv.token_clamp == LOG_RATIO_CLAMP

    @property
    def stat_rows(self) -> np.ndarray:
        """bool [n]: the scored rows (the chunk's all-True mask when every row is scored)."""
        return self.chunk.mask if self.stat is None else self.stat

    @cached_property
    def _rows(self) -> np.ndarray | None:
        return None if self.stat is None else np.flatnonzero(self.stat)

    @cached_property
    def lr(self) -> np.ndarray:
        return self.lr_rows if self._rows is None else self.lr_rows[self._rows]

    @cached_property
    def rho(self) -> np.ndarray:
        return self.rho_rows if self._rows is None else self.rho_rows[self._rows]

    @cached_property
    def starts(self) -> np.ndarray:
        """First compressed row of each sequence with T'_i > 0."""
        counts = self.stat_counts
        return self.chunk.starts if self.stat is None else (np.cumsum(counts) - counts)[counts > 0]

    def scored_rows(self, per_sequence: np.ndarray) -> np.ndarray:
        """Broadcast a per-sequence array to the scored rows."""
        return np.repeat(per_sequence, self.stat_counts)

    def full_rows(self, scored_values: np.ndarray, fill: float) -> np.ndarray:
        """Scored-row values back on every row: NaN on masked rows, `fill` on rows a rejection removed."""
        chunk = self.chunk
        if self.stat is None:
            return scored_values.copy()
        out = np.full(chunk.n, fill)
        out[self.stat] = scored_values
        out[~chunk.mask] = np.nan
        return out


class WeightStats:
    """Exact sum, moments and extrema of weights: per row (`add_rows`, segments = sequences) or per sequence
    repeated on its tokens (`add_repeated`)."""

    def __init__(self) -> None:
        self.total, self.moments, self.ext = ExactSum(), Moments(), Extremum()

    def add_rows(self, values: np.ndarray, starts: np.ndarray) -> None:
        if values.size:
            per_sequence = np.add.reduceat(values, starts)
            self.total.add(per_sequence)
            self.moments.add(values, float(per_sequence.sum()) / values.size)
            self.ext.add(values)

    def add_reduced(self, per_sequence: np.ndarray, n: int, mean: float, m2: float, lo: float, hi: float) -> None:
        """Add n values already reduced by a kernel: per-sequence sums, their mean, M2 about it, min and max."""
        if n:
            self.total.add(per_sequence)
            self.moments.merge(Moments(n, mean, m2))
            self.ext.add_scalar(lo)
            self.ext.add_scalar(hi)

    def add_repeated(self, values: np.ndarray, counts: np.ndarray) -> None:
        if values.size:
            self.total.add(values * counts)
            self.moments.add_weighted(values, counts)
            self.ext.add(values)

    def merge(self, other: WeightStats) -> None:
        self.total.merge(other.total)
        self.moments.merge(other.moments)
        self.ext.merge(other.ext)

    def padded(self, extra: int, value: float) -> WeightStats:
        """A copy with `extra` more values equal to `value` (trl's empty rows, ratio 1)."""
        out = WeightStats()
        out.merge(self)
        if extra > 0:
            out.total.add_scalar(extra * value)
            out.moments.merge(Moments(extra, value, 0.0))
            out.ext.add_scalar(value)
        return out

    def summary(self) -> tuple[float, float, float, float, float]:
        """(mean, population std, min, max, E[w²]); NaN when empty, std 0 for one value."""
        n = self.moments.n
        if n == 0:
            return (math.nan,) * 5
        mean = self.total.value() / n
        var = self.moments.var if n > 1 else 0.0
        return mean, math.sqrt(max(var, 0.0)), self.ext.lo, self.ext.hi, var + mean * mean


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

    @property
    def lo(self) -> float:
        """lo = L, or 1/C without L (0 without an upper bound)."""
        return self.lower if self.lower is not None else 1.0 / self.upper


class ModeStats:
    """IS metrics of one (level, action, C, L) under one convention; update with ChunkViews, merge, finish."""

    def __init__(self, level: str, action: str, bounds: Bounds, conv: Convention, keep_weights: bool = False):
        self.level, self.action, self.bounds, self.conv = level, action, bounds, conv
        self.tok = WeightStats()  # applied weights over scored tokens
        self.ess = WeightStats() if conv.ess == "swift" else None  # w̃ when it differs from w (else self.tok)
        self.per_seq = WeightStats()  # trl sequence modes: one weight per sequence
        self.raw = Extremum()  # verl sequence modes: raw S_i
        self.n_valid_tokens = self.n_valid_seqs = self.n_scored_seqs = 0
        self.counts = dict.fromkeys(_COUNTS, 0)
        self.weights: list[np.ndarray] | None = [] if keep_weights else None
        # sequence modes without per-row output reduce their chunks in blocks (sums, extrema and counts are the
        # same whatever the blocks; the variance's Chan merges move by ulps, as with any other batching)
        self._defers = level == "sequence" and self.weights is None and not (
            conv.seq_mask_weight == "token" and action == "mask")
        self._pending: list[SequenceValues] = []
        self._pending_n = 0

    # ------------------------------------------------------------------ update
    def update(self, view: ChunkView, token_result: tuple[np.ndarray, ...] | None = None) -> None:
        """Add a chunk (token modes: with their slice of is_kernels.token_modes' result, see update_modes)."""
        if self.level == "token":
            tokens, seqs = view.valid
            self.n_valid_tokens += tokens
            self.n_valid_seqs += seqs
            self._update_tokens(view, token_result)
        elif self._defers:
            values = view.sequences
            self._pending.append(values)
            self._pending_n += values.lam.size
            if self._pending_n >= _SEQUENCES_AT:
                self._flush()
        else:
            self._add_sequences(view.sequences, view)

    def _flush(self) -> None:
        """Reduce the buffered chunks of a sequence-level mode."""
        if self._pending:
            parts, self._pending, self._pending_n = self._pending, [], 0
            self._add_sequences(SequenceValues.concat(parts), None)

    def _weigh(self, rho: np.ndarray, high: np.ndarray, below: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(w, flags of weights changed): truncate clamps to [L, C]; mask zeroes outside [L, C]."""
        out = high if below is None else high | below
        b = self.bounds
        if self.action == "truncate":
            w = np.minimum(rho, b.upper)
            return (w if b.lower is None else np.maximum(w, b.lower)), out
        return np.where(out, 0.0, rho), out

    def _flags(self, log_ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        b = self.bounds
        below = log_ratio < b.log_lower if b.lower is not None else None
        return log_ratio > b.log_upper, below, log_ratio < b.log_lo

    def _ess_rows(self, w: np.ndarray, starts: np.ndarray) -> None:
        """swift's ESS weight w̃ = clamp(w, 1/C, C) (rejected zeros count as 1/C)."""
        if self.ess is not None:
            self.ess.add_rows(np.clip(w, 1.0 / self.bounds.upper, self.bounds.upper), starts)

    def kernel_params(self) -> tuple[float, ...]:
        """This token mode's row of is_kernels.token_modes' `params`."""
        b = self.bounds
        return b.upper, b.lower or 0.0, b.log_upper, b.log_lower, b.log_lo, float(self.action == "mask")

    def _update_tokens(self, view: ChunkView, result: tuple[np.ndarray, ...]) -> None:
        """Add this mode's slice of is_kernels.token_modes' result (per_w, per_e, fields, weights)."""
        per_w, per_e, out, w_rows = result
        f = dict(zip(is_kernels.TOKEN_MODE_FIELDS, out.tolist(), strict=True))
        self.tok.add_reduced(per_w, int(f["n"]), f["mean"], f["m2"], f["lo"], f["hi"])
        if self.ess is not None:
            self.ess.add_reduced(per_e, int(f["n"]), f["ess_mean"], f["ess_m2"], f["ess_lo"], f["ess_hi"])
        c = self.counts
        for key in ("high", "low", "clipped", "kept_tokens", "kept_seqs"):
            c[key] += int(f[key])
        if "fraction_high" in self.conv.float32_counts:
            c["high_f32"], c["low_f32"] = c["high"], c["low"]
        if self.weights is not None:
            w_rows = w_rows.copy()
            if not view.chunk.all_valid:
                w_rows[~view.chunk.mask] = np.nan
            self.weights.append(w_rows)

    def _add_sequences(self, values: SequenceValues, view: ChunkView | None) -> None:
        """Add sequences: of one chunk's `view` (needed for per-row output), or buffered chunks (view None)."""
        conv = self.conv
        self.n_valid_tokens += values.valid_tokens
        self.n_valid_seqs += values.valid_seqs
        lam, counts = values.lam, values.counts
        high, below, low = self._flags(lam)
        with np.errstate(over="ignore"):
            w, out = self._weigh(np.exp(lam), high, below)
        if view is not None and conv.seq_mask_weight == "token" and self.action == "mask":  # swift: token ratios
            rows = np.where(view.scored_rows(view.seq_lr > self.bounds.log_upper), 0.0, view.rho)
            self.tok.add_rows(rows, view.starts)
            self._ess_rows(rows, view.starts)
        else:
            self.tok.add_repeated(w, counts)
            rows = None
            if self.ess is not None:
                self.ess.add_repeated(np.clip(w, 1.0 / self.bounds.upper, self.bounds.upper), counts)
        if conv.seq_extrema == "per_sequence":
            self.per_seq.add_repeated(w, np.ones(w.size, dtype=np.int64))
        if conv.seq_extrema == "raw":
            self.raw.add(values.valid_sum)
        self._count_sequences(lam, counts, high, low, out, values.scored_sum)
        if self.weights is not None:
            full = np.zeros(view.stat_counts.size)
            full[view.scored] = w
            self.weights.append(view.full_rows(view.scored_rows(full) if rows is None else rows, 0.0))

    def _count_sequences(self, lam: np.ndarray, counts: np.ndarray, high: np.ndarray, low: np.ndarray,
                         out: np.ndarray, raw_sum: np.ndarray) -> None:
        c, b = self.counts, self.bounds
        self.n_scored_seqs += int(lam.size)
        c["high"] += int(np.count_nonzero(high))
        c["low"] += int(np.count_nonzero(low))
        c["clipped"] += int(np.count_nonzero(out))
        if self.conv.high_low_rows == "all":  # verl: unclamped S_i vs torch.log(torch.tensor(x)), float32
            c["high_f32"] += int(np.count_nonzero(raw_sum > float(np.log(np.float32(b.upper)))))
            c["low_f32"] += int(np.count_nonzero(raw_sum < float(np.log(np.float32(b.lo)))))
        kept = ~out if self.action == "mask" else np.ones(out.size, dtype=bool)
        c["kept_tokens"] += int(counts[kept].sum())
        c["kept_seqs"] += int(np.count_nonzero(kept))

    # ------------------------------------------------------------------ merge / finish
    def merge(self, other: ModeStats) -> None:
        self._flush()
        other._flush()
        self.tok.merge(other.tok)
        if self.ess is not None:
            self.ess.merge(other.ess)
        self.per_seq.merge(other.per_seq)
        self.raw.merge(other.raw)
        for name in ("n_valid_tokens", "n_valid_seqs", "n_scored_seqs"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for key in self.counts:
            self.counts[key] += other.counts[key]
        if self.weights is not None:
            self.weights += other.weights

    def finish(self, num_sequences: int, batch_normalize: bool = False) -> dict[str, float]:
        """IS metrics dict (IS_METRIC_NAMES); NaN where there is nothing to score."""
        self._flush()
        conv, sequence_level = self.conv, self.level == "sequence"
        population = self.tok
        if conv.seq_extrema == "per_sequence" and sequence_level and self.n_valid_tokens:
            population = self.per_seq.padded(num_sequences - self.per_seq.moments.n, 1.0)
        mean, std, w_min, w_max, _ = population.summary()
        if conv.seq_extrema == "raw" and sequence_level and self.n_valid_tokens:
            lo, hi = self.raw.lo, self.raw.hi
            if num_sequences > self.n_valid_seqs:
                lo, hi = min(lo, 0.0), max(hi, 0.0)
            w_min, w_max = math.exp(lo), math.exp(min(hi, LOG_RATIO_CLAMP))
        if conv.no_data == "trl" and self.n_valid_tokens == 0:
            # TRL v1.9.0 grpo_trainer.py logs 0.0 when a batch has no valid token (token modes: nothing to
            # flatten) and exp(0) = 1.0 per row in sequence modes (rows without tokens have ratio 1).
            mean = w_min = w_max = 1.0 if sequence_level and num_sequences else 0.0
        out = {"is_weight_mean": mean, "is_weight_std": std, "is_weight_min": w_min, "is_weight_max": w_max,
               "ess": self._ess()}
        out.update(self._fractions(num_sequences))
        if conv.no_data == "swift" and self.n_valid_tokens == 0 and num_sequences:
            # ms-swift v4.5.2 _compute_is_correction_metrics on a micro-batch without a valid token: masked means
            # divide by max(N, 1), so the mean weight and clipped share are 0 and the ESS is 1 / max(0, 1e-10)
            out.update(is_weight_mean=0.0, ess=1e10, clipped_frac=0.0)
        if batch_normalize:  # divide every weight by the token mean of the weights
            scale = self.token_mean()
            for key in ("is_weight_mean", "is_weight_std", "is_weight_min", "is_weight_max"):
                out[key] = out[key] / scale if scale else math.nan
        return out

    def token_mean(self) -> float:
        """E_tok[w] over scored tokens (the batch-normalisation divisor); NaN when there are none."""
        self._flush()
        return self.tok.summary()[0]

    def _ess(self) -> float:
        mean, _, _, _, second = (self.ess or self.tok).summary()
        if math.isnan(mean):
            return math.nan
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
        scored = self.tok.moments.n if token else self.n_scored_seqs
        clipped = ratio(c["clipped"], scored)
        if token and "clipped_frac" in conv.float32_counts:  # swift's mm([ρ > C].float(), m): float32(k/N)
            clipped = f32_share(c["clipped"], scored)
        if not token and conv.clipped_rows == "all":
            clipped = f32_share(c["high"], num_sequences)
        high, low = ratio(c["high"], scored), ratio(c["low"], scored)
        if "fraction_high" in conv.float32_counts:
            rows = scored if token else num_sequences
            high, low = f32_share(c["high_f32"], rows), f32_share(c["low_f32"], rows)
        return {"clipped_frac": clipped, "fraction_high": high, "fraction_low": low,
                "kept_token_frac": ratio(c["kept_tokens"], self.n_valid_tokens),
                "kept_seq_frac": ratio(c["kept_seqs"], self.n_valid_seqs)}


def update_modes(stats: list[ModeStats], view: ChunkView) -> None:
    """Add one chunk to every mode: all token-level modes from ONE fused kernel pass over the rows — which also
    sums the chunk's kernels.CORE_COLUMNS on a mostly quiet chunk when nothing has yet (is_kernels.token_modes_core:
    the same bits as is_kernels.token_modes and the chunk's own sequence_core; analyze's modes then come before its
    metrics)."""
    token = [s for s in stats if s.level == "token"]
    if token:
        chunk = view.chunk
        params = np.array([s.kernel_params() for s in token], dtype=np.float64)
        swift_ess, rows = token[0].ess is not None, token[0].weights is not None
        if not rows and view.scores_kept and chunk.core_pending:
            t = chunk.terms
            *fields, core = is_kernels.token_modes_core(t.a, t.b, chunk.kept, t.lh, t.em1, t.rho, chunk.starts, params,
                                                     swift_ess)
            if core.shape[0]:
                chunk.core_table(core)
            result = (*fields, np.zeros((len(token), 0)))
        else:
            result = is_kernels.token_modes(view.lr_rows, view.rho_rows, view.stat_rows, chunk.starts, params,
                                         swift_ess, rows)
        for j, mode in enumerate(token):
            mode.update(view, tuple(r[j] for r in result))
    for mode in stats:
        if mode.level != "token":
            mode.update(view)


