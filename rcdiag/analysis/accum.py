"""Mergeable reductions whose result does not depend on how the data was split: exact sums and extrema."""
from __future__ import annotations

import math
from itertools import chain

import numpy as np

_COMPRESS_AT = 64
_PENDING_AT = 8192
"""Values an ExactSum holds as numpy arrays before reducing them (one fsum per many small per-chunk adds)."""


class ExactSum:
    """A float64 sum that is exact up to ~eps² of the running total, so any batching gives the same value.

    `add(values)` keeps the array; every ~8k values (and before `value`/`merge`) the kept values are reduced to
    their correctly rounded sum plus its rounded remainder (math.fsum twice); `value()` is the correctly rounded
    sum of everything stored. Merging concatenates the stored parts. An empty sum is 0.0; an inf/NaN value makes
    the sum inf/NaN (no exception). Arrays passed to `add` must not be modified afterwards.
    """

    __slots__ = ("parts", "pending", "pending_n")

    def __init__(self) -> None:
        self.parts: list[float] = []
        self.pending: list[np.ndarray] = []
        self.pending_n = 0

    def add(self, values: np.ndarray | list[float]) -> None:
        if not isinstance(values, np.ndarray):
            items = list(values)
            if items:
                self._store(items)
            return
        if values.size:
            self.pending.append(values)
            self.pending_n += values.size
            if self.pending_n >= _PENDING_AT:
                self._drain()

    def _drain(self) -> None:
        """Reduce the kept arrays into `parts`."""
        if self.pending:
            items = (self.pending[0] if len(self.pending) == 1 else np.concatenate(self.pending)).tolist()
            self.pending, self.pending_n = [], 0
            self._store(items)

    def add_scalar(self, value: float) -> None:
        self._drain()
        self.parts.append(float(value))
        if len(self.parts) > _COMPRESS_AT:
            self._store(self.parts, replace=True)

    def _store(self, items: list[float], replace: bool = False) -> None:
        try:
            total = math.fsum(items)
        except (OverflowError, ValueError):  # inf − inf, or an intermediate overflow: give IEEE semantics
            total = float(np.sum(np.asarray(items, dtype=np.float64)))
        parts = [total]
        if math.isfinite(total):
            rest = math.fsum(chain(items, (-total,)))
            if rest:
                parts.append(rest)
        if replace:
            self.parts = parts
            return
        self.parts.extend(parts)
        if len(self.parts) > _COMPRESS_AT:
            self._store(self.parts, replace=True)

    def merge(self, other: ExactSum) -> None:
        self._drain()
        other._drain()
        self.parts.extend(other.parts)
        if len(self.parts) > _COMPRESS_AT:
            self._store(self.parts, replace=True)

    def value(self) -> float:
        self._drain()
        if not self.parts:
            return 0.0
        try:
            return math.fsum(self.parts)
        except (OverflowError, ValueError):
            return float(np.sum(np.asarray(self.parts, dtype=np.float64)))


class Extremum:
    """Running min and max of float64 values (NaN-free input); empty → min=+inf, max=−inf."""

    __slots__ = ("lo", "hi")

    def __init__(self) -> None:
        self.lo = math.inf
        self.hi = -math.inf

    def add(self, values: np.ndarray) -> None:
        if values.size:
            self.lo = min(self.lo, float(values.min()))
            self.hi = max(self.hi, float(values.max()))

    def add_scalar(self, value: float) -> None:
        self.lo = min(self.lo, value)
        self.hi = max(self.hi, value)

    def merge(self, other: Extremum) -> None:
        self.lo = min(self.lo, other.lo)
        self.hi = max(self.hi, other.hi)

    @property
    def empty(self) -> bool:
        return self.lo > self.hi


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when the denominator is 0 ("no data" never reads as 0)."""
    return numerator / denominator if denominator else math.nan


class Moments:
    """Count, mean and sum of squared deviations (M2) of float64 values, merged with Chan's parallel formula.

    Each `add` is two-pass within its batch, so the variance of nearly equal values keeps full precision (no
    E[x²] − E[x]² cancellation). Empty → n = 0, mean and var NaN.
    """

    __slots__ = ("n", "mean", "m2")

    def __init__(self, n: int = 0, mean: float = 0.0, m2: float = 0.0) -> None:
        self.n, self.mean, self.m2 = n, mean, m2

    def add(self, values: np.ndarray, mean: float | None = None) -> None:
        """Add a batch of values (`mean`: their mean when the caller already knows it). The mean is taken about
        the first value (shift + mean of the offsets), so values that are all equal have exactly that mean and
        an M2 of exactly 0 (numpy's rounded mean of equal values left ~1e-17 of variance)."""
        if values.size:
            if mean is None:
                shift = float(values[0])
                mean = shift + float((values - shift).mean())
            dev = values - mean
            self.merge(Moments(int(values.size), mean, float(np.einsum("i,i->", dev, dev))))

    def add_weighted(self, values: np.ndarray, counts: np.ndarray) -> None:
        """Add each value `counts` times (e.g. one weight per sequence, repeated on its T_i tokens)."""
        n = int(counts.sum())
        if n:
            shift = float(values[np.flatnonzero(counts)[0]])  # about a counted value: equal values, M2 exactly 0
            mean = shift + float(np.einsum("i,i->", values - shift, counts.astype(np.float64))) / n
            dev = values - mean
            self.merge(Moments(n, mean, float(np.einsum("i,i,i->", dev, dev, counts.astype(np.float64)))))

    def merge(self, other: Moments) -> None:
        if other.n == 0:
            return
        if self.n == 0:
            self.n, self.mean, self.m2 = other.n, other.mean, other.m2
            return
        n = self.n + other.n
        delta = other.mean - self.mean
        self.mean += delta * (other.n / n)
        self.m2 += other.m2 + delta * delta * (self.n * other.n / n)
        self.n = n

    @property
    def var(self) -> float:
        """Population variance (divide by n); NaN when empty."""
        return self.m2 / self.n if self.n else math.nan


def add_range(ranges: list[list[int]], first: int, last: int) -> None:
    """Extend the last [first, last] interval when the new one follows it (sorted streams), else append."""
    if ranges and first > ranges[-1][1]:
        ranges[-1][1] = last
    else:
        ranges.append([first, last])


def merge_ranges(ranges: list[list[int]], other: list[list[int]]) -> None:
    """Add `other`'s intervals; ValueError when one overlaps (a sequence split between accumulators)."""
    for lo, hi in other:
        for mine_lo, mine_hi in ranges:
            if lo <= mine_hi and mine_lo <= hi:
                raise ValueError(f"accumulators overlap in seq_id range [{max(lo, mine_lo)}, {min(hi, mine_hi)}]: "
                                 "a sequence must not span two accumulators (merge per-file accumulators)")
    ranges.extend([list(r) for r in other])
