"""Per-step trends: every metric, the IS metrics of one mode and bootstrap intervals, one row per training step.

    frame = rcdiag.trend(run, convention="verl", mode="token_truncate", threshold=2.0)
    frame[["step", "kl", "k3_kl", "k3_kl_low", "k3_kl_high", "ess", "clipped_frac"]]

The mismatch is not a constant across training (it grows as the policy sharpens, jumps after a weight-sync or kernel
change), so a run whose sequences table carries `step` is measured step by step. ONE pass over the token rows feeds
a `TrendAccumulator`, which routes each chunk's sequences to their step's accumulators (metrics, the IS mode,
per-sequence sums for the bootstrap); it merges over disjoint files like every other accumulator. Drift detection on
the resulting frame is rcdiag.analysis.training.drift.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from rcdiag.analysis.conventions import DEFAULT_CONVENTION
from rcdiag.analysis.correction.isstats import IS_METRIC_NAMES
from rcdiag.analysis.correction.modes import ISAccumulator, get_mode
from rcdiag.analysis.defaults import DEFAULT_LEVEL, DEFAULT_REPLICATES, DEFAULT_THRESHOLD
from rcdiag.analysis.metrics.bootstrap import SequenceSums, bootstrap
from rcdiag.analysis.metrics.compute import COUNT_NAMES, METRIC_NAMES, MetricsAccumulator
from rcdiag.analysis.metrics.floor import NOISE_NAMES, NoiseEvidence
from rcdiag.analysis.passes.accum import ChunkConsumer, Totals, merge_keyed
from rcdiag.analysis.passes.chunks import DEFAULT_BATCH_ROWS, TokenChunk
from rcdiag.analysis.passes.engine import stream
from rcdiag.analysis.training.lag_trend import token_lag
from rcdiag.errors import InputError

DEFAULT_MODE = "token_truncate"
"""The IS mode of a trend (the usual TIS; ESS and clipped share are read from it)."""
ABS_NAMES = ("abs_log_ratio_mean", "abs_log_ratio_max")
"""mean and max |ℓ| per step (TRL's sampling_logp_difference/{mean,max}), from the per-sequence sums."""
INTERVAL_NAMES = ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_abs_diff", "abs_log_ratio_mean", "ess")
"""Metrics with bootstrap columns NAME_low, NAME_high, NAME_se (`ess` is token_truncate at the threshold, as in
rcdiag.analysis.metrics.bootstrap)."""
TREND_COLUMNS = ("step", *COUNT_NAMES, *METRIC_NAMES, *ABS_NAMES, *IS_METRIC_NAMES, *NOISE_NAMES)


# ----------------------------------------------------------------------------------------------- steps
def step_index(run: Any) -> tuple[np.ndarray, np.ndarray]:
    """(seq_id int64 [B] sorted, step int64 [B]) from a Run's sequences table.

    A run without a step column, or with every step null, is one step, 0 (so the trend and an export of any run have
    one row). Some steps null and others not raise InputError naming the file and the first such seq_id.
    """
    ids, steps = [], []
    for file in run.sequence_files:
        parquet = pq.ParquetFile(file)
        has_step = "step" in parquet.schema_arrow.names
        table = parquet.read(columns=["seq_id", "step"] if has_step else ["seq_id"])
        seq = np.asarray(table.column("seq_id"), dtype=np.int64)
        if has_step and table.column("step").null_count < table.num_rows:
            column = table.column("step")
            if column.null_count:
                first = int(seq[np.asarray(column.is_null())][0])
                raise InputError(f"seq {first} has no step while other sequences do; give every sequence its "
                                 "step (or none) — re-import the per-step dumps", file=str(file), field="step")
            steps.append(np.asarray(column, dtype=np.int64))
        else:
            steps.append(np.full(seq.size, -1, dtype=np.int64))
        ids.append(seq)
    seq_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    step = np.concatenate(steps) if steps else np.zeros(0, np.int64)
    if (step == -1).any() and (step != -1).any():
        raise InputError("some sequence files have a step column and others not; re-import the run",
                         file=str(run.path / "sequences"), field="step")
    step[step == -1] = 0
    order = np.argsort(seq_ids, kind="stable")
    return seq_ids[order], step[order]


def has_steps(run: Any) -> bool:
    """Whether the run spans more than one step (what makes a trend worth drawing)."""
    return np.unique(step_index(run)[1]).size > 1


def subset(chunk: TokenChunk, keep: np.ndarray) -> TokenChunk:
    """The chunk restricted to the sequences where `keep` (bool [S]) holds, rows in the same order."""
    rows = np.repeat(keep, chunk.lengths)
    lengths = chunk.lengths[keep]
    starts = np.r_[0, np.cumsum(lengths)[:-1]].astype(chunk.starts.dtype) if lengths.size else lengths
    return TokenChunk(chunk.seq_ids[keep], starts, lengths, chunk.pos[rows], chunk.train[rows],
                      chunk.rollout[rows], chunk.mask[rows], chunk.all_valid)


# ----------------------------------------------------------------------------------------------- accumulator
@dataclass
class StepParts:
    """One step's accumulators: every metric, the one IS mode, the per-sequence sums for the bootstrap and the
    noise floor's evidence (rcdiag.analysis.metrics.floor: the robust per-step level the step-change test reads)."""

    metrics: MetricsAccumulator
    correction: ISAccumulator
    sums: SequenceSums
    noise: NoiseEvidence = field(default_factory=lambda: NoiseEvidence(temperature=False))

    def update_chunk(self, chunk: TokenChunk) -> None:
        self.metrics.update_chunk(chunk)
        self.correction.update_chunk(chunk)
        self.noise.update(chunk.train, chunk.rollout, chunk.mask)
        self.sums.update_chunk(chunk)

    def merge(self, other: StepParts) -> StepParts:
        self.metrics.merge(other.metrics)
        self.correction.merge(other.correction)
        self.sums.merge(other.sums)
        self.noise.merge(other.noise)
        return self


@dataclass
class TrendAccumulator(ChunkConsumer):
    """Mergeable per-step state: `update_chunk` routes sequences to their step (seq_ids → step via `ids`/`steps`,
    sorted by seq_id), `merge` adds another file's state, `finish` gives the trend frame (bootstrap intervals of
    `replicates` replicates at `level`, seeded `seed + step`)."""

    ids: np.ndarray
    steps: np.ndarray
    convention: str = DEFAULT_CONVENTION
    mode: str = DEFAULT_MODE
    threshold: float = DEFAULT_THRESHOLD
    lower: float | None = None
    replicates: int = DEFAULT_REPLICATES
    level: float = DEFAULT_LEVEL
    seed: int = 0
    parts: dict[int, StepParts] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._mode = get_mode(self.mode).with_bounds(self.threshold, self.lower)
        ISAccumulator([self._mode], self.convention)  # fails fast on a mode the convention lacks

    def _part(self, step: int) -> StepParts:
        if step not in self.parts:
            self.parts[step] = StepParts(MetricsAccumulator(self.convention),
                                         ISAccumulator([self._mode], self.convention),
                                         SequenceSums(self.threshold, self.lower))
        return self.parts[step]

    def update_chunk(self, chunk: TokenChunk) -> None:
        if chunk.n == 0:
            return
        at = np.searchsorted(self.ids, chunk.seq_ids)
        found = (at < self.ids.size) & (self.ids[np.minimum(at, self.ids.size - 1)] == chunk.seq_ids)
        if not found.all():
            raise InputError(f"seq {int(chunk.seq_ids[~found][0])} has token rows but no row in the sequences "
                             "table, so its step is unknown", field="seq_id")
        step = self.steps[at]
        first = int(step[0])
        if (step == first).all():
            self._part(first).update_chunk(chunk)
            return
        for s in np.unique(step):
            self._part(int(s)).update_chunk(subset(chunk, step == s))

    def fresh(self) -> TrendAccumulator:
        """An empty accumulator of the same steps and mode (stream's per-file copies)."""
        return replace(self, parts={})

    def merge(self, other: TrendAccumulator) -> TrendAccumulator:
        merge_keyed(self.parts, other.parts)
        return self

    def finish(self, totals: Totals) -> Any:
        """DataFrame, one row per step in order (TREND_COLUMNS, then INTERVAL_NAMES' _low/_high/_se); a step whose
        sequences have no token rows still has its row (metrics NaN, counts from the sequences table: each step's
        B is its own rows, `totals` the whole run's)."""
        import pandas as pd

        replicates, level, seed = self.replicates, self.level, self.seed
        records = []
        for step in np.unique(self.steps):
            in_step = self.ids[self.steps == step]
            part = self._part(int(step))
            step_totals = Totals(int(in_step.size))
            row: dict[str, Any] = {"step": int(step), **part.metrics.finish(step_totals)}
            row.update(part.correction.finish(step_totals)[0])
            _, sums = part.sums.table(in_step)
            tokens = sums[:, 0].sum()
            row["abs_log_ratio_mean"] = float(sums[:, 4].sum() / tokens) if tokens else float("nan")
            row["abs_log_ratio_max"] = float(sums[sums[:, 0] > 0, 5].max()) if tokens else float("nan")
            row.update(part.noise.finish().values())
            intervals = bootstrap(sums, self.convention, replicates=replicates, level=level, seed=seed + int(step))
            for name in INTERVAL_NAMES:
                for bound in ("low", "high", "se"):
                    row[f"{name}_{bound}"] = intervals[name][bound]
            records.append(row)
        frame = pd.DataFrame.from_records(records, columns=[*TREND_COLUMNS, *interval_columns()])
        frame.attrs.update(convention=self.convention, mode=self._mode.name, threshold=self.threshold,
                           lower=self.lower, level=level, replicates=replicates)
        return frame


def interval_columns() -> list[str]:
    return [f"{n}_{b}" for n in INTERVAL_NAMES for b in ("low", "high", "se")]


def trend_accumulator(run: Any, convention: str = DEFAULT_CONVENTION, mode: str = DEFAULT_MODE,
                      threshold: float = DEFAULT_THRESHOLD, lower: float | None = None) -> TrendAccumulator:
    """A fresh TrendAccumulator for `run`'s steps (reads only the sequences table)."""
    ids, steps = step_index(run)
    return TrendAccumulator(ids, steps, convention, mode, threshold, lower)


def trend(run: Any, convention: str = DEFAULT_CONVENTION, mode: str = DEFAULT_MODE,
          threshold: float = DEFAULT_THRESHOLD, lower: float | None = None, *, replicates: int = DEFAULT_REPLICATES,
          level: float = DEFAULT_LEVEL, seed: int = 0, batch_rows: int = DEFAULT_BATCH_ROWS,
          silent: bool = True) -> Any:
    """Every metric per training step of a Run, in one pass over its token rows.

    Returns a pandas DataFrame, one row per `step` of the sequences table, sorted: step, the counts tokens /
    sequences / empty_sequences, every metric under `convention`, abs_log_ratio_mean/max (mean and max
    |ℓ| over valid tokens), the noise floor's evidence (rcdiag.analysis.metrics.floor.NOISE_NAMES), the IS metrics of `mode` at `threshold` (and `lower`), and percentile bootstrap
    intervals at `level` (NAME_low, NAME_high, NAME_se for INTERVAL_NAMES; Poisson bootstrap over the step's
    sequences, seeded `seed + step`; NaN with fewer than 2 sequences). A run without steps is one row, step 0.
    A run with policy versions also gets the lag columns (rcdiag.analysis.training.lag_trend.LAG_NAMES: token lag, stale
    share, the floor's and the stale tokens' mean |ℓ|, and the frameworks' per-sequence staleness where the
    trainer's version is recorded), from the same pass. `frame.attrs` records convention, mode, threshold, lower,
    level and replicates (and `lag_reference` with the lag columns).
    """
    from rcdiag.store.run import Run, open_run

    opened = run if isinstance(run, Run) else open_run(run)
    accumulator = replace(trend_accumulator(opened, convention, mode, threshold, lower), replicates=replicates,
                          level=level, seed=seed)
    lag = token_lag(opened, accumulator.ids, accumulator.steps)
    rows = stream(opened, [accumulator] if lag is None else [accumulator, lag], batch_rows=batch_rows,
                  silent=silent, desc="trend")
    frame = accumulator.finish(Totals(rows))
    if lag is not None:  # the same steps in the same order (both np.unique of the run's steps)
        lags = lag.finish(Totals(rows))
        for name in lags.columns[1:]:
            frame[name] = lags[name].to_numpy()
        frame.attrs.update(lags.attrs)
    return frame
