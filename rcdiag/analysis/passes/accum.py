"""The accumulator contract every pass consumer declares, and the mergeable primitives they are built from.

Contract (rcdiag.analysis.passes.engine runs every pass on it):
- `Mergeable`: `fresh()` → an empty twin with the same settings (a file's own copy), `merge(other)` → self with
  `other`'s state added (`other` covers other sequences: another file).
- `ChunkConsumer(Mergeable)`: `update_chunk(chunk)` with validated chunks of whole sequences (chunks.TokenChunk),
  `finish(totals)` → its result. Such a consumer stops at the first refused row (the engine keeps the InputError).
- `BatchConsumer(Mergeable)`: `update_batch(rows, file, row0)` with every record batch as read (rows.BatchRows,
  refused rows included, `row0` the batch's first row in `file`), `finish(totals)`.
A class that names one of them as a base and lacks a method, or gives `finish` or an update another parameter
list, is a TypeError when its `class` statement runs (at import), not a silent slow path when a pass meets it.

Primitives: exact sums (`ExactSum`; K side by side, `ExactSums`), extrema (`Extremum`) and moments (`Moments`; K side
by side, `MomentsArray`), whose results do not depend on how the data was split, and `merge_fields`, which merges
such attributes generically.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.analysis.passes import kernels


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
    """TypeError unless `cls` defines every method of the CONTRACT of each of its bases (a class may be both a
    chunk and a batch consumer) with exactly the declared parameters."""
    contract = {name: params for base in reversed(cls.__mro__) for name, params in getattr(base, "CONTRACT",
                                                                                             {}).items()}
    for name, params in contract.items():
        method = getattr(cls, name, None)
        if not callable(method):
            raise TypeError(f"{cls.__qualname__} declares {_declared(cls)} but defines no {name}() — it needs "
                            f"{', '.join(f'{m}()' for m in contract)}")
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
    """A consumer of validated chunks of whole sequences: `update_chunk(chunk)`, `finish(totals)`.

    `strict = False` declares a consumer that reports on refused data (the report's scan): after the first refused
    row it goes on receiving the chunks, cut but not validated (`chunk.validated` False; `chunk.kept` leaves the
    non-finite rows out). `chunk_columns`: token columns beyond the required ones to carry into each chunk's
    `extra` (`entropy`, `token_id`)."""

    CONTRACT = {**Mergeable.CONTRACT, "update_chunk": ("chunk",), "finish": ("totals",)}
    strict: ClassVar[bool] = True
    chunk_columns: ClassVar[tuple[str, ...]] = ()


class BatchConsumer(Mergeable, abstract=True):
    """A consumer of every record batch as read (refused rows included): `update_batch(rows, file, row0)`,
    `finish(totals)`."""

    CONTRACT = {**Mergeable.CONTRACT, "update_batch": ("rows", "file", "row0"), "finish": ("totals",)}


def merge_keyed(target: dict, other: dict) -> dict:
    """Merge `other`'s parts into `target`'s key by key (per-step states: a part under a new key is taken as it
    is, one under a known key merged into it). Returns target."""
    for key, part in other.items():
        if key in target:
            target[key].merge(part)
        else:
            target[key] = part
    return target


def merge_fields(target: Any, other: Any, fields: tuple[str, ...]) -> Any:
    """Merge `other`'s named attributes into `target`'s by their type (torchmetrics' add_state reductions, stated
    once): a mergeable primitive or consumer merges, numbers and numpy arrays add, lists extend. Returns target."""
    for name in fields:
        mine, theirs = getattr(target, name), getattr(other, name)
        if isinstance(mine, (ExactSum, ExactSums, Extremum, Moments, MomentsArray, Mergeable)):
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

_PARTIALS = 96
"""Capacity of an ExactSum's partials: non-overlapping doubles span at most ~2,100 / 53 ≈ 40 of them."""


class ExactSum:
    """A float64 sum that is exact until `value()` rounds it once (correctly), so any batching, order or merge gives
    the same value.

    The state is Shewchuk's non-overlapping partials (math.fsum's algorithm, kernels.grow_partials, compiled:
    ~3 ns a value, so per-row arrays are cheap too); `value()` is math.fsum of the partials, the correctly rounded
    sum of everything added. An empty sum is 0.0; an inf/NaN value makes the sum inf/NaN, and an intermediate
    overflow gives the IEEE sum (no exception).
    """

    __slots__ = ("partials", "count", "plain", "special", "flags")

    def __init__(self) -> None:
        self.partials = np.zeros(_PARTIALS)
        self.count = 0
        self.plain = self.special = 0.0
        self.flags = 0

    def add(self, values: np.ndarray | list[float]) -> None:
        values = np.asarray(values, dtype=np.float64)
        if values.size:
            self.count, self.plain, self.special, self.flags = kernels.grow_partials(
                self.partials, self.count, values.reshape(-1), self.plain, self.special, self.flags)

    def add_scalar(self, value: float) -> None:
        self.add(np.array([float(value)]))

    def merge(self, other: ExactSum) -> ExactSum:
        plain = self.plain
        if not other.flags & 2:  # an overflowed sum's partials are stale (its value is its plain sum)
            self.add(other.partials[:other.count])  # exact: the partials are values like any other
        self.plain = plain + other.plain
        self.special += other.special
        self.flags |= other.flags
        return self

    def value(self) -> float:
        if self.flags & 2:
            return self.plain + self.special
        total = math.fsum(self.partials[:self.count].tolist()) if self.count else 0.0
        return total + self.special if self.flags & 1 else total


class ExactSums:
    """K exact float64 sums side by side, each with ExactSum's semantics (exact until `value(k)` rounds it once, so
    any batching, order or merge gives the same bits): a chunk's (K, m) values, or (K,) one each, are ONE compiled
    call (kernels.grow_partials_rows), where K ExactSums cost K Python calls — the gate sweep's ~130 settings × 3
    sums per chunk were most of its Python time (issue #32)."""

    __slots__ = ("partials", "count", "plain", "special", "flags")

    def __init__(self, k: int) -> None:
        self.partials = np.zeros((k, _PARTIALS))
        self.count = np.zeros(k, np.int64)
        self.plain = np.zeros(k)
        self.special = np.zeros(k)
        self.flags = np.zeros(k, np.int64)

    def __len__(self) -> int:
        return self.count.size

    def add(self, values: np.ndarray) -> None:
        """Add row k of `values` (float64 [K, m], or [K]: one value each) to sum k."""
        values = np.asarray(values, dtype=np.float64)
        values = values.reshape(values.shape[0], -1) if values.ndim else values.reshape(1, 1)
        if values.shape[0] != len(self):
            raise ValueError(f"ExactSums of {len(self)} sums given {values.shape[0]} rows of values")
        if values.shape[1]:
            kernels.grow_partials_rows(self.partials, self.count, values, np.full(len(self), values.shape[1]),
                                       self.plain, self.special, self.flags, True)

    def merge(self, other: ExactSums) -> ExactSums:
        lengths = np.where(other.flags & 2, 0, other.count)  # an overflowed sum's partials are stale (ExactSum)
        kernels.grow_partials_rows(self.partials, self.count, other.partials, lengths, self.plain, self.special,
                                   self.flags, False)  # exact: the partials are values like any other
        self.plain += other.plain
        self.special += other.special
        self.flags |= other.flags
        return self

    def value(self, k: int) -> float:
        """Sum k, correctly rounded (ExactSum.value)."""
        flags, special = int(self.flags[k]), float(self.special[k])
        if flags & 2:
            return float(self.plain[k]) + special
        count = int(self.count[k])
        total = math.fsum(self.partials[k, :count].tolist()) if count else 0.0
        return total + special if flags & 1 else total


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


class MomentsArray:
    """K Moments side by side (count, mean, M2 per slot), merged slot by slot with Moments' own Chan formula in
    numpy: a chunk's K batches are one vectorised merge, not K Python merges (the gate sweep, issue #32)."""

    __slots__ = ("n", "mean", "m2")

    def __init__(self, k: int) -> None:
        self.n = np.zeros(k, np.int64)
        self.mean = np.zeros(k)
        self.m2 = np.zeros(k)

    def add(self, n: np.ndarray, mean: np.ndarray, m2: np.ndarray) -> None:
        """Merge batch k (n[k] values of mean[k] and M2 m2[k]; n[k] = 0: nothing) into slot k, as Moments.merge."""
        n = np.asarray(n, np.int64)
        total = self.n + n
        first, both = (self.n == 0) & (n > 0), (self.n > 0) & (n > 0)
        safe = np.where(total > 0, total, 1)
        delta = mean - self.mean
        merged_mean = self.mean + delta * (n / safe)
        merged_m2 = self.m2 + (m2 + delta * delta * (self.n.astype(np.float64) * n / safe))
        self.mean = np.where(first, mean, np.where(both, merged_mean, self.mean))
        self.m2 = np.where(first, m2, np.where(both, merged_m2, self.m2))
        self.n = total

    def merge(self, other: MomentsArray) -> MomentsArray:
        self.add(other.n, other.mean, other.m2)
        return self

    def slot(self, k: int) -> Moments:
        """Slot k as a Moments (its var, n, mean)."""
        return Moments(int(self.n[k]), float(self.mean[k]), float(self.m2[k]))


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
