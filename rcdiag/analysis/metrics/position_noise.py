"""The noise floor per response position band: where in a response the mismatch sits.

A whole-run noise scale averages positions away. Two mechanisms live at particular positions:
- a prompt the two sides did not share (a chat template, a system prompt, a BOS token rendered on one side only)
  moves the first response tokens of every sequence by nats, and the effect fades as the response's own tokens take
  over the context;
- precision that degrades with context (a quantized KV cache, RoPE or attention in low precision over long
  sequences) leaves the first positions at the floor and lifts the later ones above it from some position on.

So the rows' u = |ℓ| / (1 − p) (rcdiag.analysis.metrics.floor) are also binned by position: pow2 bands below 256
(0, 1, 2–3, … 128–255: fine where a template's effect fades), 256-wide bands up to 8192 (where an onset is read),
pow2 bands beyond. Each band keeps a coarse log10(u) histogram (BAND_U_BINS over floor.U_LOG10) and counters,
O(#bands) memory, mergeable. `PositionProfile` gives each band's noise scale σ̂ (the median of u / 0.6745, as the
run's), mean |ℓ|, E[1 − p] and the tokens beyond the dense limit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numba
import numpy as np

from rcdiag.analysis.metrics.floor import CERTAIN, DENSE_LIMIT, NORMAL_MAD, U_LOG10, hist_quantile, tail_share

FINE_LIMIT = 256
"""Below this position the bands are powers of two (0, 1, 2–3, …, 128–255)."""
LINEAR_WIDTH = 256
"""From FINE_LIMIT to LINEAR_LIMIT the bands are this wide (where an onset of precision loss is located)."""
LINEAR_LIMIT = 8192
"""Beyond this position the bands are powers of two again (8192–16383, 16384–32767, ≥ 32768)."""
BAND_STARTS = np.array([0, 1, 2, 4, 8, 16, 32, 64, 128, *range(FINE_LIMIT, LINEAR_LIMIT, LINEAR_WIDTH), 8192, 16384,
                        32768], dtype=np.int64)
"""The first position of each band (the last band is open-ended)."""
BAND_U_BINS = 96
"""log10(u) bins per band over floor.U_LOG10 (1/8 decade: a band's median within ~±5 % after interpolation)."""
MIN_BAND_SCORED = 100
"""Fewer scored tokens than this in a band: no noise scale for it."""


@numba.njit(cache=True, nogil=True)
def band_of(pos: int) -> int:
    """The band index of a response position (BAND_STARTS)."""
    if pos < 1:
        return 0
    if pos < FINE_LIMIT:
        k = 0
        while (1 << (k + 1)) <= pos:
            k += 1
        return k + 1
    if pos < LINEAR_LIMIT:
        return 9 + (pos - FINE_LIMIT) // LINEAR_WIDTH
    if pos < 16384:
        return 40
    return 41 if pos < 32768 else 42


@numba.njit(cache=True, nogil=True)
def position_evidence(pos, a, b, valid, gap, log10_u, hist, counts, sums):
    """Add one batch to the per-band histograms and counters, in place (the same clean / certain / scored rules as
    floor.noise_evidence). hist int64 [B, BAND_U_BINS + 2] (under/overflow cells), counts int64 [B, 3]: clean,
    scored, beyond DENSE_LIMIT; sums float64 [B, 2]: Σ|ℓ| (clean), Σ(1 − p) (scored)."""
    lo, hi = U_LOG10
    scale = BAND_U_BINS / (hi - lo)
    for i in range(a.size):
        x, y = a[i], b[i]
        if not valid[i] or not (math.isfinite(x) and math.isfinite(y)) or x >= 0.0 or y >= 0.0 \
                or x <= -1e9 or y <= -1e9:
            continue
        j = band_of(pos[i])
        d = abs(x - y)
        counts[j, 0] += 1
        counts[j, 2] += d > DENSE_LIMIT
        sums[j, 0] += d
        g = gap[i]
        if g < CERTAIN:
            continue
        counts[j, 1] += 1
        sums[j, 1] += g
        k = 0 if d <= 0.0 else int(math.floor((log10_u[i] - lo) * scale)) + 1
        hist[j, min(max(k, 0), BAND_U_BINS + 1)] += 1


@dataclass
class PositionNoise:
    """Mergeable per-band evidence (fresh → update → merge → finish)."""

    hist: np.ndarray = field(default_factory=lambda: np.zeros((BAND_STARTS.size, BAND_U_BINS + 2), np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros((BAND_STARTS.size, 3), np.int64))
    sums: np.ndarray = field(default_factory=lambda: np.zeros((BAND_STARTS.size, 2), np.float64))

    def fresh(self) -> PositionNoise:
        return PositionNoise()

    def update(self, pos: np.ndarray, a: np.ndarray, b: np.ndarray, valid: np.ndarray, gap: np.ndarray,
               log10_u: np.ndarray) -> None:
        """Add rows: response positions, both log-probs, the valid mask and the rows' floor.noise_terms."""
        position_evidence(pos, a, b, valid, gap, log10_u, self.hist, self.counts, self.sums)

    def merge(self, other: PositionNoise) -> PositionNoise:
        self.hist += other.hist
        self.counts += other.counts
        self.sums += other.sums
        return self

    def finish(self) -> PositionProfile:
        width = (U_LOG10[1] - U_LOG10[0]) / BAND_U_BINS
        bands = []
        for j, start in enumerate(BAND_STARTS.tolist()):
            clean, scored, dense = (int(c) for c in self.counts[j])
            if not clean:
                continue
            end = int(BAND_STARTS[j + 1]) if j + 1 < BAND_STARTS.size else None
            sigma = (10 ** hist_quantile(self.hist[j], U_LOG10[0], width, 0.5) / NORMAL_MAD if scored >= MIN_BAND_SCORED
                     else math.nan)
            bands.append(Band(start, end, clean, scored, sigma, self.sums[j, 0] / clean,
                              self.sums[j, 1] / scored if scored else math.nan, dense, self.hist[j].copy()))
        return PositionProfile(tuple(bands))


@dataclass(frozen=True)
class Band:
    """One position band: [start, end) (end None: open), its clean and scored tokens, noise scale σ̂ (NaN below
    MIN_BAND_SCORED), mean |ℓ|, E[1 − p] and tokens beyond the dense limit."""

    start: int
    end: int | None
    tokens: int
    scored: int
    sigma: float
    mean_abs: float
    mean_gap: float
    beyond_dense: int
    hist: np.ndarray | None = field(default=None, compare=False, repr=False)

    def beyond(self, edge: float) -> float:
        """The share of the band's scored tokens with u beyond `edge` (NaN without scored tokens)."""
        return math.nan if self.hist is None else tail_share(self.hist, self.scored, edge, BAND_U_BINS)

    @property
    def label(self) -> str:
        if self.end is None:
            return f"{self.start}+"
        return str(self.start) if self.end == self.start + 1 else f"{self.start}–{self.end - 1}"

    def to_dict(self) -> dict[str, object]:
        return {"start": self.start, "end": self.end, "label": self.label, "tokens": self.tokens,
                "scored": self.scored, "sigma": self.sigma, "mean_abs": self.mean_abs, "mean_gap": self.mean_gap,
                "beyond_dense": self.beyond_dense}


@dataclass(frozen=True)
class PositionProfile:
    """The bands that hold tokens, in position order."""

    bands: tuple[Band, ...] = ()

    @property
    def tokens(self) -> int:
        return sum(b.tokens for b in self.bands)

    def to_dict(self) -> list[dict[str, object]]:
        return [b.to_dict() for b in self.bands]
