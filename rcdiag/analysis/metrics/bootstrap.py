"""Bootstrap confidence intervals over sequences for the headline metrics, from per-sequence sums.

Every headline metric is a function of sums over sequences of per-sequence quantities (token sums, or a
sequence's own mean), so one streaming pass keeps only O(#sequences × 16) float64 (`SequenceSums`) and the
bootstrap re-weights those rows. It is a Poisson(1) bootstrap (each sequence's weight ~ Poisson(1), the standard
streaming approximation of resampling n of n with replacement), seeded. The weights are never materialised: a
compiled kernel (bootstrap_kernels.poisson_totals) turns seeded uniforms into Poisson(1) counts by the inverse CDF and adds
the weighted rows in the same loop, on a thread per core — 1,000 replicates over 100 k sequences take ~0.5 s
instead of ~6 s of numpy's Poisson sampler (the draws differ from the former rng.poisson stream, so intervals
moved within their Monte-Carlo error). Uniforms are drawn in chunks of replicates (16 MB whatever the number of
sequences), in order from one seeded stream: the intervals do not depend on the number of threads.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rcdiag.analysis.conventions import LOG_RATIO_CLAMP, get_convention
from rcdiag.analysis.defaults import DEFAULT_LEVEL, DEFAULT_REPLICATES, DEFAULT_THRESHOLD
from rcdiag.analysis.metrics import bootstrap_kernels, metric_table
from rcdiag.analysis.metrics.metric_table import Sequences, terms
from rcdiag.analysis.passes import kernels
from rcdiag.analysis.passes.accum import ChunkConsumer, Totals
from rcdiag.analysis.passes.chunks import TokenChunk
from rcdiag.analysis.passes.threads import ordered_map

CLAMP = LOG_RATIO_CLAMP
SWIFT_K3_CLAMP = kernels.SWIFT_K3_CLAMP
COLUMNS = kernels.SEQ_COLUMNS
"""The per-sequence columns the bootstrap resamples: THE per-sequence table (kernels.SEQ_COLUMNS), one row per
sequence."""
CHUNK_CELLS = 1 << 21
"""Uniforms drawn at a time (16 MB); at most 2 × cores chunks are in flight (analysis.passes.threads.ordered_map)."""
POISSON1_CDF = np.cumsum([math.exp(-1.0) / math.factorial(k) for k in range(19)])
"""P(K ≤ k) of Poisson(1), k = 0…18 (the tail beyond 18 is < 1e-17, under a float64 uniform's resolution)."""
POISSON1_CDF[-1] = 1.0


@dataclass
class SequenceSums(ChunkConsumer):
    """Mergeable rows of the per-sequence table (kernels.SEQ_COLUMNS) for the IS threshold `threshold` and optional
    `lower` (its w columns): each chunk's own table, kept as it is (O(#sequences) memory)."""

    threshold: float = DEFAULT_THRESHOLD
    lower: float | None = None

    def __post_init__(self) -> None:
        self.ids: list[np.ndarray] = []
        self.rows: list[np.ndarray] = []  # float64 [len(COLUMNS), S] per chunk

    def update_chunk(self, chunk: TokenChunk) -> None:
        self.add(chunk.seq_ids, chunk.table(self.threshold, self.lower))

    def add(self, ids: np.ndarray, table: np.ndarray) -> None:
        """The table columns [len(COLUMNS), S] of sequences `ids` [S]."""
        if ids.size:
            self.ids.append(np.asarray(ids, np.int64))
            self.rows.append(table)

    def update(self, seq: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        """seq int64 [n] (sorted), a/b float64 [n] of valid finite tokens (rows as given, one pass)."""
        if not seq.size:
            return
        starts = kernels.segment_starts(seq)
        with np.errstate(over="ignore"):
            lh = np.clip(a - b, -CLAMP, CLAMP)
            self.add(seq[starts], kernels.sequence_table(a, b, np.ones(seq.size, np.bool_), lh, np.expm1(lh),
                                                         np.exp(lh), starts, float(self.threshold),
                                                         float(self.lower or 0.0)))

    def fresh(self) -> SequenceSums:
        return SequenceSums(self.threshold, self.lower)

    def merge(self, other: SequenceSums) -> SequenceSums:
        self.ids += other.ids
        self.rows += other.rows
        return self

    def finish(self, totals: Totals) -> tuple[np.ndarray, np.ndarray]:
        return self.table()

    def table(self, all_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(seq_id [n], sums [n, len(COLUMNS)]) sorted by seq_id; `all_ids` adds zero rows for sequences without
        kept tokens (empty responses). Pieces of one sequence (given to `update` in parts, or cut by a pass that
        went on past refused rows) are merged: sums add, maxima take the max."""
        width = len(COLUMNS)
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, dtype=np.int64)
        rows = np.concatenate(self.rows, axis=1).T if self.rows else np.zeros((0, width))
        if ids.size > 1 and not (np.diff(ids) > 0).all():
            order = np.argsort(ids, kind="stable")
            ids, rows = ids[order], rows[order]
            if not (np.diff(ids) > 0).all():
                uniq, inverse = np.unique(ids, return_inverse=True)
                merged = np.zeros((uniq.size, width))
                np.add.at(merged, inverse, rows)
                for j in _MAX_COLUMNS:
                    top = np.zeros(uniq.size)
                    np.maximum.at(top, inverse, rows[:, j])
                    merged[:, j] = top
                ids, rows = uniq, merged
        if all_ids is not None:
            everyone = np.union1d(ids, np.asarray(all_ids, dtype=np.int64))
            full = np.zeros((everyone.size, width))
            full[np.searchsorted(everyone, ids)] = rows
            ids, rows = everyone, full
        return ids, np.ascontiguousarray(rows)


_MAX_COLUMNS = (kernels.COLUMN["max_abs"], kernels.COLUMN["max_k3"])
"""The table columns that are maxima, not sums (merged by max)."""


# ----------------------------------------------------------------------------------------------- headline
def interval_metrics() -> tuple[metric_table.Metric, ...]:
    """The metrics with an interval: analysis.metrics.metric_table's rows with interval=True (as the table is now)."""
    return tuple(m for m in (*metric_table.METRICS, *metric_table.EXTRA_INTERVALS) if m.interval)


def sequence_terms(sums: np.ndarray, convention: str) -> dict[str, np.ndarray]:
    """Per-sequence terms [n] whose column totals give every headline metric under `convention`: T, the rows a
    sequence mean counts ("rows": T_i > 0, or every row when the convention's seq_rows is "all"), each interval
    metric's own per-sequence term (analysis.metrics.metric_table, the accumulator's very terms; an empty row's is 0 for a
    token metric, the metric's `empty` for a sequence metric) and the token_truncate weight sums for the ESS."""
    conv = get_convention(convention)
    c = dict(zip(COLUMNS, sums.T, strict=True))
    T = c["T"]
    scored = T > 0
    rows = np.ones_like(T) if conv.seq_rows == "all" else scored.astype(float)
    sequences = Sequences({k: v[scored] for k, v in c.items()})
    out = {"T": T, "rows": rows}
    for metric in interval_metrics():
        full = np.full(T.size, 0.0 if metric.kind == "token" else metric.empty)
        full[scored] = terms(metric, sequences, conv)
        out[metric.name] = full if metric.kind == "token" else rows * full
    out.update(w=c["w_sum"], w2=c["w_sq"], ws=c["ws_sum"], ws2=c["ws_sq"])
    return out


def _ess(convention: str) -> Callable[[dict[str, Any]], Any]:

    kind = get_convention(convention).ess
    if kind == "swift":
        return lambda t: 1 / np.maximum(t["ws2"] / t["T"] / (t["ws"] / t["T"] + 1e-8) ** 2, 1e-10)
    eps = 1e-8 if kind == "verl" else 0.0
    return lambda t: 1 / (t["w2"] / t["T"] / (t["w"] / t["T"] + eps) ** 2)


def _mean(name: str, over: str) -> Callable[[dict[str, Any]], Any]:
    return lambda t: t[name] / t[over]


HEADLINE = tuple(m.name for m in interval_metrics())
"""The headline metrics with an interval, in table order (+ `ess`, token_truncate at --threshold)."""


def headline_functions(convention: str) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """Headline metric → function of column totals: a token metric over ΣT, a sequence metric over its rows."""
    means = {m.name: _mean(m.name, "T" if m.kind == "token" else "rows") for m in interval_metrics()}
    return {**means, "ess": _ess(convention)}


def point_estimates(sums: np.ndarray, convention: str = "canonical") -> dict[str, float]:
    """The headline metrics on all sequences (no resampling); NaN where undefined (no valid tokens)."""
    terms = sequence_terms(sums, convention)
    totals = {k: v.sum() for k, v in terms.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        return {name: float(fn(totals)) for name, fn in headline_functions(convention).items()}


def bootstrap(sums: np.ndarray, convention: str = "canonical", *, replicates: int = DEFAULT_REPLICATES,
              level: float = DEFAULT_LEVEL, seed: int = 0) -> dict[str, dict[str, float]]:
    """{metric: {"low", "high", "se"}}: percentile interval at `level` over Poisson-bootstrap replicates.

    sums: [n_sequences, len(COLUMNS)] from SequenceSums.table. With fewer than 2 sequences every bound is NaN.
    """
    names = list(headline_functions(convention))
    if sums.shape[0] < 2 or replicates < 2:
        return {name: {"low": float("nan"), "high": float("nan"), "se": float("nan")} for name in names}
    terms = sequence_terms(sums, convention)
    keys = list(terms)
    matrix = np.stack([terms[k] for k in keys], axis=1)
    matrix = np.ascontiguousarray(matrix)
    n = matrix.shape[0]
    chunk = max(1, CHUNK_CELLS // n)
    draws: dict[str, list[np.ndarray]] = {name: [] for name in names}
    fns = headline_functions(convention)
    finite = bool(np.isfinite(matrix).all())

    def totals_of(start: int) -> np.ndarray:
        """Replicates start… of the ONE seeded stream default_rng(seed) would give (PCG64 draws one 64-bit
        output per uniform, so the block starts `start · n` draws in): each thread draws its own block's
        uniforms and runs the kernel (which releases the GIL), the same numbers whatever the thread count.
        Drawing the blocks one after the other on the calling thread took ~40 % of the bootstrap."""
        stream = np.random.Generator(np.random.PCG64(seed).advance(start * n))
        return bootstrap_kernels.poisson_totals(stream.random((min(chunk, replicates - start), n)), matrix, POISSON1_CDF,
                                      finite)

    for block in ordered_map(totals_of, range(0, replicates, chunk)):
        totals = dict(zip(keys, block.T, strict=True))
        with np.errstate(divide="ignore", invalid="ignore"):
            for name in names:
                draws[name].append(np.asarray(fns[name](totals), dtype=np.float64))
    alpha = (1 - level) / 2
    out = {}
    for name in names:
        values = np.concatenate(draws[name])
        values = values[np.isfinite(values)]
        if values.size < 2:
            out[name] = {"low": float("nan"), "high": float("nan"), "se": float("nan")}
            continue
        low, high = np.quantile(values, [alpha, 1 - alpha])
        out[name] = {"low": float(low), "high": float(high), "se": float(values.std(ddof=1))}
    return out
