"""The accumulator contract every pass consumer declares, and the mergeable primitives they are built from.

Contract (rcdiag.analysis.engine runs every pass on it):
- `Mergeable`: `fresh()` → an empty twin with the same settings (a file's own copy), `merge(other)` → self with
  `other`'s state added (`other` covers other sequences: another file).
- `ChunkConsumer(Mergeable)`: `update_chunk(chunk)` with validated chunks of whole sequences (chunks.TokenChunk),
  `finish(totals)` → its result. Such a consumer stops at the first refused row (the engine keeps the InputError).
- `BatchConsumer(Mergeable)`: `update_batch(rows, file, row0)` with every record batch as read (rows.BatchRows,
  refused rows included, `row0` the batch's first row in `file`), `finish(totals)`.
A class that names one of them as a base and lacks a method, or gives `finish` or an update another parameter
list, is a TypeError when its `class` statement runs (at import), not a silent slow path when a pass meets it.

Primitives: exact sums (`ExactSum`), extrema (`Extremum`) and moments (`Moments`), whose results do not depend on
how the data was split, and `merge_fields`, which merges such attributes generically.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from itertools import chain
from typing import Any, ClassVar

import numpy as np


@dataclass(frozen=True)
class Totals:
    """What a consumer's `finish` may need beyond its own state: `sequences` = B, the rows of the sequences table
    (or the distinct seq_ids seen when no table is known), so empty responses count."""

    sequences: int


class Mergeable:
    """Base of every mergeable state: `fresh()` and `merge(other) -> self` (checked when a subclass is defined).

    `CONTRACT` maps each required method to its parameter names after `self` (None: any); subclasses extend it.
    A class meant as a further base, not used itself, passes `abstract=True` in its class statement."""

    CONTRACT: ClassVar[dict[str, tuple[str, ...] | None]] = {"fresh": (), "merge": ("other",)}

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not abstract:
            check_contract(cls)


def check_contract(cls: type) -> None:
    """TypeError unless `cls` defines every method of its CONTRACT with exactly the declared parameters."""
    for name, params in cls.CONTRACT.items():
        method = getattr(cls, name, None)
        if not callable(method):
            raise TypeError(f"{cls.__qualname__} declares {_declared(cls)} but defines no {name}() — every "
                            f"consumer needs {', '.join(f'{m}()' for m in cls.CONTRACT)}")
        if params is None:
            continue
        got = tuple(inspect.signature(method).parameters)[1:]
        if got != params:
            raise TypeError(f"{cls.__qualname__}.{name}{tuple(got)} must take ({', '.join(params)}): the one "
                            f"signature of {_declared(cls)}.{name}")


def _declared(cls: type) -> str:
    bases = [b.__name__ for b in cls.__mro__[1:] if b in (ChunkConsumer, BatchConsumer)]
    return bases[0] if bases else "Mergeable"


class ChunkConsumer(Mergeable, abstract=True):
    """A consumer of validated chunks of whole sequences: `update_chunk(chunk)`, `finish(totals)`."""

    CONTRACT = {**Mergeable.CONTRACT, "update_chunk": ("chunk",), "finish": ("totals",)}


class BatchConsumer(Mergeable, abstract=True):
    """A consumer of every record batch as read (refused rows included): `update_batch(rows, file, row0)`,
    `finish(totals)`."""

    CONTRACT = {**Mergeable.CONTRACT, "update_batch": ("rows", "file", "row0"), "finish": ("totals",)}


def merge_fields(target: Any, other: Any, fields: tuple[str, ...]) -> Any:
    """Merge `other`'s named attributes into `target`'s by their type (torchmetrics' add_state reductions, stated
    once): a mergeable primitive or consumer merges, numbers and numpy arrays add, lists extend. Returns target."""
    for name in fields:
        mine, theirs = getattr(target, name), getattr(other, name)
        if isinstance(mine, (ExactSum, Extremum, Moments, Mergeable)):
            mine.merge(theirs)
        elif isinstance(mine, list):
            mine.extend(theirs)
        elif isinstance(mine, np.ndarray):
            mine += theirs
        elif isinstance(mine, (int, float)):
            setattr(target, name, mine + theirs)
        else:
            raise TypeError(f"merge_fields: {type(target).__name__}.{name} is a {type(mine).__name__}, which has no "
                            "generic merge; merge it by hand")
    return target

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

    def merge(self, other: ExactSum) -> ExactSum:
        self._drain()
        other._drain()
        self.parts.extend(other.parts)
        if len(self.parts) > _COMPRESS_AT:
            self._store(self.parts, replace=True)
        return self

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

    def merge(self, other: Extremum) -> Extremum:
        self.lo = min(self.lo, other.lo)
        self.hi = max(self.hi, other.hi)
        return self

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

    def merge(self, other: Moments) -> Moments:
        if other.n == 0:
            return self
        if self.n == 0:
            self.n, self.mean, self.m2 = other.n, other.mean, other.m2
            return self
        n = self.n + other.n
        delta = other.mean - self.mean
        self.mean += delta * (other.n / n)
        self.m2 += other.m2 + delta * delta * (self.n * other.n / n)
        self.n = n
        return self

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
