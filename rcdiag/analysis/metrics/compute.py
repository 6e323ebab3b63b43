"""The off-policy diagnostics as mergeable accumulators over token chunks, per convention: the metrics of
analysis.metrics.metric_table, summed exactly from each chunk's per-sequence table."""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.analysis.conventions import DEFAULT_CONVENTION, LOG_RATIO_CLAMP, Convention, get_convention
from rcdiag.analysis.correction.isstats import IS_METRIC_NAMES
from rcdiag.analysis.correction.modes import MODES, CorrectionMode, ISAccumulator, get_mode
from rcdiag.analysis.correction.verlstats import VerlProbStats
from rcdiag.analysis.defaults import DEFAULT_THRESHOLD
from rcdiag.analysis.metrics import metric_table, peer_logs
from rcdiag.analysis.metrics.bootstrap import SequenceSums
from rcdiag.analysis.metrics.metric_table import Metric, Sequences, terms
from rcdiag.analysis.passes.accum import (
    ChunkConsumer,
    ExactSum,
    ExactSums,
    Extremum,
    Totals,
    add_range,
    merge_ranges,
    ratio,
)
from rcdiag.analysis.passes.chunks import DEFAULT_BATCH_ROWS, Chunker, TokenChunk, sequence_universe
from rcdiag.analysis.passes.engine import stream
from rcdiag.analysis.passes.kernels import COLUMN, SEQ_COLUMNS
from rcdiag.analysis.thresholds import as_number

METRIC_NAMES = metric_table.METRIC_NAMES
"""Every metric compute_metrics returns, in order: the rows of analysis.metrics.metric_table.METRICS."""
COUNT_NAMES = ("tokens", "sequences", "empty_sequences")


class ChunkSequences(Sequences):
    """The Sequences of one chunk's sequences with T_i > 0 (`valid`; None: all of them), each column read from the
    chunk when a term first reads it (TokenChunk.column): metrics that read only kernels.CORE_COLUMNS — every
    canonical one — never make the chunk compute its whole per-sequence table. The same values as the table's."""

    def __init__(self, chunk: TokenChunk, valid: np.ndarray | None) -> None:
        self._chunk, self._valid = chunk, valid
        super().__init__({name: self._column(name) for name in ("T", "sum_a", "sum_b", "sum_l")})

    def _column(self, name: str) -> np.ndarray:
        values = self._chunk.column(name)
        return values if self._valid is None else values[self._valid]

    def __getattr__(self, name: str) -> np.ndarray:  # only called for a column not read yet
        if name not in COLUMN:
            raise AttributeError(name)
        values = self._column(name)
        setattr(self, name, values)
        return values


class MetricsAccumulator(ChunkConsumer):
    """Mergeable state of every docs/metrics.md diagnostic for one convention.

    `update(batch)` takes a RecordBatch/Table/DataFrame of token rows (a sequence may continue in the next batch;
    its rows are carried), `update_chunk(chunk)` a TokenChunk of whole sequences; `merge(other)` adds an
    accumulator over disjoint sequences (e.g. another file); `finish(totals)` gives the metrics dict.
    State is O(1): exact sums, counts and extrema; results do not depend on the batching.
    """

    def __init__(self, convention: str | Convention = DEFAULT_CONVENTION) -> None:
        self.convention = get_convention(convention)
        self.tokens = 0
        self.seen_sequences = 0
        self.valid_sequences = 0
        self.names = tuple(m.name for m in metric_table.METRICS)  # the table as it is now (a recipe adds a row)
        self.summed = tuple(m.name for m in self.metrics if m.kind in ("token", "sequence"))
        self.sums = ExactSums(len(self.summed))  # row k: metric summed[k]; one compiled add per chunk for all
        self.extrema = {m.name: Extremum() for m in self.metrics if m.kind in ("max", "min")}
        self.abs_sum, self.abs_max = ExactSum(), Extremum()  # trl's sampling_logp_difference
        self.probs = VerlProbStats() if self.convention.framework == "verl" else None  # verl's training/ keys
        self.peer = peer_logs.accumulator(self.convention.framework)  # skyrl / nemo-rl / prime-rl / roll extras
        self.seq_ranges: list[list[int]] = []  # disjoint [first, last] seq_id intervals covered
        self._chunker: Chunker | None = None

    @property
    def metrics(self) -> tuple[Metric, ...]:
        """This accumulator's rows of analysis.metrics.metric_table (looked up by name: the state pickles — the pass cache,
        Ray — without the table's functions)."""
        rows = {m.name: m for m in metric_table.METRICS}
        return tuple(rows[name] for name in self.names)

    def fresh(self) -> MetricsAccumulator:
        """An empty accumulator of the same convention (stream's per-file copies)."""
        return MetricsAccumulator(self.convention)

    # ------------------------------------------------------------------ updates
    def update(self, batch: Any, source: str = "tokens") -> None:
        """Add a batch of token rows (validated; InputError names `source`, row and column)."""
        if self._chunker is None:
            self._chunker = Chunker()
        table = batch if isinstance(batch, (pa.RecordBatch, pa.Table)) else pa.Table.from_pandas(
            batch, preserve_index=False)
        for chunk in self._chunker.push(source, table):
            self.update_chunk(chunk)

    def _flush(self) -> None:
        if self._chunker is not None:
            chunk = self._chunker.flush()
            if chunk is not None:
                self.update_chunk(chunk)

    def update_chunk(self, chunk: TokenChunk) -> None:
        """Add whole sequences."""
        if chunk.n == 0:
            return
        conv = self.convention
        counts = chunk.counts
        self.tokens += int(counts.sum())
        self.seen_sequences += int(chunk.seq_ids.size)
        add_range(self.seq_ranges, int(chunk.seq_ids[0]), int(chunk.seq_ids[-1]))
        if conv.framework == "trl":
            self.abs_sum.add(chunk.column("sum_abs"))
            self.abs_max.add(chunk.column("max_abs"))
        if self.probs is not None:
            self.probs.update(chunk)
        if self.peer is not None:
            self.peer.update_chunk(chunk)
        valid = counts > 0
        n_valid = int(np.count_nonzero(valid))
        self.valid_sequences += n_valid
        sequences = ChunkSequences(chunk, None if n_valid == valid.size else valid)
        summed = np.empty((len(self.summed), n_valid))
        k = 0
        for metric in self.metrics:  # one exact sum (or extremum) of each metric's per-sequence terms
            values = terms(metric, sequences, conv)
            if metric.kind in ("token", "sequence"):
                summed[k] = values
                k += 1
            else:
                self.extrema[metric.name].add(values)
        self.sums.add(summed)

    def merge(self, other: MetricsAccumulator) -> MetricsAccumulator:
        """Add `other` (same convention, disjoint sequences, e.g. another file); returns self."""
        if other.convention != self.convention:
            raise ValueError(f"cannot merge {other.convention.name} into {self.convention.name} accumulator")
        self._flush()
        other._flush()
        merge_ranges(self.seq_ranges, other.seq_ranges)
        self.tokens += other.tokens
        self.seen_sequences += other.seen_sequences
        self.valid_sequences += other.valid_sequences
        self.sums.merge(other.sums)
        for name, extremum in self.extrema.items():
            extremum.merge(other.extrema[name])
        self.abs_sum.merge(other.abs_sum)
        self.abs_max.merge(other.abs_max)
        if self.probs is not None:
            self.probs.merge(other.probs)
        if self.peer is not None:
            self.peer.merge(other.peer)
        return self

    # ------------------------------------------------------------------ result
    def finish(self, totals: Totals | None = None) -> dict[str, float]:
        """The metrics dict (docs/metrics.md names, then counts). `totals.sequences` = B, the rows of the sequences table
        (None: the sequences seen in the token rows). Zero valid tokens → every metric NaN, counts 0.
        Under trl, also TRL's `sampling_logp_difference` mean and max of |ℓ| over valid tokens (unclamped) as
        abs_log_ratio_mean / abs_log_ratio_max: 0.0 without a valid token, as TRL v1.9.0 logs. Under verl, also
        verl's `training/` debug numbers (verlstats.PROBS_NAMES). Under swift, a batch with rows but no valid token
        gives what ms-swift v4.5.2 logs for such a micro-batch (its divisors are max(count, 1)): kl = k3_kl = 0,
        chi2_token = −1, PPL 1, log-PPL and differences 0, ppl_ratio 1, chi2_seq 0."""
        self._flush()
        rows = self.seen_sequences if totals is None else int(totals.sequences)
        if rows < self.seen_sequences:
            raise ValueError(f"B = {rows} sequences is less than the {self.seen_sequences} sequences with tokens")
        empty = rows - self.valid_sequences
        counts = {"tokens": self.tokens, "sequences": rows, "empty_sequences": empty}
        extra = self.probs.finish() if self.probs is not None else {}
        if self.peer is not None:
            extra = self.peer.finish()
        if self.convention.framework == "trl":
            extra = {"abs_log_ratio_mean": self.abs_sum.value() / self.tokens if self.tokens else 0.0,
                     "abs_log_ratio_max": self.abs_max.hi if self.tokens else 0.0}
        swift_no_data = self.convention.no_data == "swift" and rows > 0
        if self.tokens == 0 and not swift_no_data:
            return {**dict.fromkeys((m.name for m in self.metrics), math.nan), **extra, **counts}
        all_rows = self.convention.seq_rows == "all"
        denominator = rows if all_rows else self.valid_sequences
        values = {m.name: self._value(m, all_rows, empty, denominator) for m in self.metrics}
        return {**values, **extra, **counts}

    def _sum(self, metric: Metric) -> float:
        """The exact sum of a token or sequence metric's terms, correctly rounded."""
        return self.sums.value(self.summed.index(metric.name))

    def _value(self, metric: Metric, all_rows: bool, empty: int, denominator: int) -> float:
        """One metric from its exact sum or extremum (metric_table: the reductions; empty rows as `empty`)."""
        if metric.kind == "token":  # swift's max(N, 1) divisor: Σ/1 = 0 (χ²: −1) without a valid token
            return self._sum(metric) / self.tokens if self.tokens else metric.no_token
        if metric.kind == "sequence":
            padding = empty * metric.empty if all_rows else 0.0
            return ratio(self._sum(metric) + padding, denominator)
        extremum = self.extrema[metric.name]
        value = extremum.hi if metric.kind == "max" else extremum.lo
        if all_rows and empty:
            value = max(value, metric.empty) if metric.kind == "max" else min(value, metric.empty)
        return value


def compute_metrics(data: Any, convention: str | None = None, *, sequences: Any = None,
                    batch_rows: int = DEFAULT_BATCH_ROWS, silent: bool = True, keys: str | None = None
                    ) -> dict[str, float]:
    """Every docs/metrics.md diagnostic of `data` in one streaming pass.

    `data`: a `Run` (B = its sequences table, so empty responses count), or a DataFrame / Arrow table of token rows
    (seq_id int, pos int, rollout_logprob, train_logprob float; mask optional, default all valid; B = distinct
    seq_ids, or the rows of `sequences` when given). `convention`: canonical | swift | verl | trl (default
    canonical, or the framework named by `keys`). `keys`: "canonical" (docs/metrics.md names) or "verl" | "swift" |
    "trl": the framework's logged key names (keys.py), e.g. "rollout_corr/kl"; numbers the framework does not log
    are prefixed "rcdiag/".
    Returns {metric: float} in METRIC_NAMES order (+ trl's abs_log_ratio_mean/max under trl, verl's probs_diff_*
    and actor_probs_pearson_corr under verl) plus int counts
    `tokens` (valid), `sequences` (B) and `empty_sequences` (T_i = 0). No valid token → metrics NaN (never "no
    mismatch"), except under trl and swift, which give the framework's own logged values (finish). Bad rows
    raise InputError.
    """
    from rcdiag.analysis.keys import key_convention, rename

    accumulator = MetricsAccumulator(key_convention(keys, convention))
    rows = stream(data, [accumulator], sequences=sequences, batch_rows=batch_rows, silent=silent, desc="metrics")
    return rename(accumulator.finish(Totals(rows)), keys)


def sequence_stats(data: Any, *, sequences: Any = None, batch_rows: int = DEFAULT_BATCH_ROWS,
                   silent: bool = True) -> Any:
    """One row per sequence (pandas DataFrame, sorted by seq_id) to rank the worst sequences.

    Columns: seq_id, n_valid (T_i), sum_log_ratio (Σℓ), mean_log_ratio (ℓ̄), mean_abs_log_ratio, max_abs_log_ratio,
    training_log_ppl (−ā), rollout_log_ppl (−b̄), log_ppl_diff (b̄ − ā = −ℓ̄), seq_ratio (exp(clamp(ℓ̄, ±20)),
    canonical geometric). Sequences without valid tokens (including a Run's empty responses) have n_valid 0 and NaN.
    """
    sums = SequenceSums()
    stream(data, [sums], sequences=sequences, batch_rows=batch_rows, silent=silent, desc="sequences")
    universe = sequence_universe(data, sequences)
    return sequence_frame(*sums.table(universe))


def sequence_frame(ids: np.ndarray, sums: np.ndarray) -> Any:
    """sequence_stats's DataFrame from rows of the per-sequence table (SequenceSums.table: seq_id [n], sums
    [n, len(SEQ_COLUMNS)]): the one place its per-sequence statistics are derived — sequence_stats, the dashboard's
    sequence index (app.judged, from the report's cached table) and nothing else."""
    import pandas as pd

    c = dict(zip(SEQ_COLUMNS, sums.T, strict=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(c["T"] > 0, c["T"], np.nan)
        mean_ell = c["sum_l"] / t
        return pd.DataFrame({
            "seq_id": np.asarray(ids, np.int64), "n_valid": c["T"].astype(np.int64),
            "sum_log_ratio": np.where(np.isnan(t), np.nan, c["sum_l"]), "mean_log_ratio": mean_ell,
            "mean_abs_log_ratio": c["sum_abs"] / t,
            "max_abs_log_ratio": np.where(np.isnan(t), np.nan, c["max_abs"]),
            "training_log_ppl": -c["sum_a"] / t, "rollout_log_ppl": -c["sum_b"] / t, "log_ppl_diff": -mean_ell,
            "seq_ratio": np.exp(np.clip(mean_ell, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))})


def analyze(data: Any, convention: str = DEFAULT_CONVENTION, *, modes: Iterable[str | CorrectionMode] = tuple(MODES),
            thresholds: Iterable[float] = (DEFAULT_THRESHOLD,), sequences: Any = None,
            batch_rows: int = DEFAULT_BATCH_ROWS, silent: bool = True) -> tuple[dict[str, float], Any]:
    """compute_metrics and sweep together in ONE pass over the data: (metrics dict, sweep DataFrame)."""
    import pandas as pd

    grid = [get_mode(m).with_bounds(as_number(c, "threshold C")) for m in modes for c in thresholds]
    metrics = MetricsAccumulator(convention)
    correction = ISAccumulator(grid, convention, extras=False) if grid else None
    # the IS modes first: their token modes' kernel then also sums the per-sequence columns the metrics read
    # (isstats.update_modes) — one visit of each chunk's rows where there were two
    consumers: list[Any] = [metrics] if correction is None else [correction, metrics]
    rows = stream(data, consumers, sequences=sequences, batch_rows=batch_rows, silent=silent, desc="analyze")
    results = correction.finish(Totals(rows)) if correction is not None else []
    records = [{"mode": m.name, "threshold": m.upper, **r} for m, r in zip(grid, results, strict=True)]
    table = pd.DataFrame.from_records(records, columns=["mode", "threshold", *IS_METRIC_NAMES])
    return metrics.finish(Totals(rows)), table
