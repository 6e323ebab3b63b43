"""The numbers a framework's dashboard shows, one per logged step: per-group evaluation, then the framework's own
averaging over micro-batches / generation calls and ranks.

    frame = rcdiag.logged_values(run, "swift", "token_truncate", 2.0, unit="micro_batch", rank="rank")
    frame[["step", "rollout_correction/kl", "rollout_correction/ess"]]

compute_metrics and simulate pool every sequence they are given; the trainers do not:
- verl v0.9.0 (`ray_trainer.py` → `compute_rollout_correction_and_add_to_batch`, decoupled mode) computes every
  `rollout_corr/` and `training/` number ONCE per step on the driver over the whole step batch: group by step only.
- ms-swift v4.5.2 (`grpo_trainer.py` `_compute_rollout_offpolicy_metrics` / `_compute_is_correction_metrics`)
  computes one value per micro-batch per rank, gathers the ranks (`gather_for_metrics(x).nanmean()`; `max()` for
  `log_ppl_diff_max`, `min()` for `log_ppl_diff_min`), appends it, and `log()` reports `sum(values) / len(values)`
  over the micro-batches since the last log (a NaN is not dropped).
- TRL v1.9.0 (`grpo_trainer.py` `_generate_and_score_completions`) computes one value per generation call per
  rank, gathers the ranks (`mean()` of the logp differences' means, `max()` of their maxima, `nanmin` / `nanmean`
  / `nanmax` of the ratio statistics), appends it, and `log()` reports the mean of the non-NaN values since the
  last log (None, here NaN, when none remains).
So a step's logged value is reproduced from the step's sequences with the columns that say which micro-batch
(generation call) and which rank each sequence was in: `unit` and `rank` (columns of the sequences table, of a
`sequences=` frame, or of the token rows). Without them each step is one group — exact for verl, and for swift/TRL
runs with one micro-batch (generation call) per logged step on one rank.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from rcdiag.analysis.correction.modes import ISAccumulator, get_mode
from rcdiag.analysis.correction.rejection import Rejection
from rcdiag.analysis.defaults import DEFAULT_THRESHOLD
from rcdiag.analysis.metrics.compute import COUNT_NAMES, MetricsAccumulator
from rcdiag.analysis.passes.accum import ChunkConsumer, Totals
from rcdiag.analysis.passes.chunks import DEFAULT_BATCH_ROWS, TokenChunk
from rcdiag.analysis.passes.engine import stream
from rcdiag.analysis.thresholds import split_band
from rcdiag.analysis.training.trend import subset
from rcdiag.errors import ConfigError, InputError

FRAMEWORKS = ("verl", "swift", "trl")
RANK_REDUCE: dict[str, dict[str, str]] = {
    "verl": {},
    "swift": {"log_ppl_diff_max": "max", "log_ppl_diff_min": "min"},
    "trl": {"abs_log_ratio_mean": "mean", "abs_log_ratio_max": "max", "is_weight_min": "nanmin",
            "is_weight_mean": "nanmean", "is_weight_max": "nanmax"},
}
"""How each framework reduces one number over its ranks (default nanmean, torch's `.nanmean()` after a gather)."""
STEP_REDUCE = {"verl": "mean", "swift": "mean", "trl": "nanmean"}
"""How `log()` averages the values appended since the last log: swift sum/len (NaN kept), TRL NaN dropped."""
_REDUCERS = {"mean": np.mean, "nanmean": np.nanmean, "max": np.max, "min": np.min, "nanmin": np.nanmin,
             "nanmax": np.nanmax}


def _reduce(how: str, values: np.ndarray) -> float:
    if how.startswith("nan") and np.isnan(values).all():
        return math.nan  # torch's nanmean of all-NaN is NaN; TRL's log() gives None
    return float(_REDUCERS[how](values))


def group_columns(data: Any, sequences: Any, columns: Sequence[str], optional: str | None = None
                  ) -> dict[str, np.ndarray]:
    """{"seq_id": int64 [B] sorted, column: int64 [B]} from the sequences table (a Run's or `sequences`) or, for
    token rows without one, from the token rows (one value per seq_id). The `optional` column may be absent or
    all-null (then every sequence gets 0: a run without steps is one step). A missing column, a null among values,
    a non-integer or a sequence with two values raises InputError naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rcdiag.store.run import Run
    from rcdiag.store.schema import SEQUENCE_SCHEMA, as_table

    if sequences is None and isinstance(data, Run):
        source = str(data.path / "sequences")
        have = set(SEQUENCE_SCHEMA.names)  # a schema column a file lacks reads as nulls
        if data.sequence_files:
            have |= set.intersection(*(set(pq.read_schema(f).names) for f in data.sequence_files))
        wanted = [c for c in columns if c in have]
        table = data.sequence_table(["seq_id", *wanted])
    else:
        source = "tokens" if sequences is None else "sequences"
        table = as_table(data if sequences is None else sequences, source=source)
        if "seq_id" not in table.column_names:
            raise InputError("missing required column 'seq_id'", file=source, field="seq_id")
    out = {"seq_id": np.asarray(table.column("seq_id").fill_null(-1), dtype=np.int64)}
    for name in columns:
        column = table.column(name) if name in table.column_names else None
        if name == optional and (column is None or column.null_count == len(column)):
            out[name] = np.zeros(len(table), np.int64)
            continue
        if column is None:
            raise InputError(f"missing group column {name!r}; pass sequences= a frame with seq_id and the group "
                             "columns", file=source, field=name)
        if column.null_count:
            row = int(np.flatnonzero(np.asarray(column.is_null()))[0]) + 1
            raise InputError(f"group column {name!r} is null (every sequence needs one)", file=source, row=row,
                             field=name)
        if not pa.types.is_integer(column.type):
            raise InputError(f"group column {name!r} must hold integers, got {column.type}", file=source,
                             field=name)
        out[name] = np.asarray(column, dtype=np.int64)
    keys = np.stack([out[c] for c in ("seq_id", *columns)], axis=1)
    unique = np.unique(keys, axis=0)
    repeated = np.flatnonzero(np.diff(unique[:, 0]) == 0)
    if repeated.size:
        raise InputError(f"seq_id {int(unique[repeated[0], 0])} has two values of the group columns "
                         f"{', '.join(columns)}", file=source, field=columns[0])
    return {name: unique[:, i] for i, name in enumerate(("seq_id", *columns))}


class GroupRouter(ChunkConsumer):
    """Mergeable per-group state: each chunk's sequences go to their group's fresh consumers (`make()`)."""

    def __init__(self, ids: np.ndarray, labels: np.ndarray, make: Any) -> None:
        self.ids, self.labels, self.make = ids, labels, make
        self.parts: dict[int, list[Any]] = {}

    def part(self, label: int) -> list[Any]:
        if label not in self.parts:
            self.parts[label] = self.make()
        return self.parts[label]

    def fresh(self) -> GroupRouter:
        return GroupRouter(self.ids, self.labels, self.make)

    def merge(self, other: GroupRouter) -> GroupRouter:
        for label, parts in other.parts.items():
            if label in self.parts:
                for mine, theirs in zip(self.parts[label], parts, strict=True):
                    mine.merge(theirs)
            else:
                self.parts[label] = parts
        return self

    def update_chunk(self, chunk: TokenChunk) -> None:
        if chunk.n == 0:
            return
        labels = self.labels[np.searchsorted(self.ids, chunk.seq_ids)]  # every seq_id is known: stream checked it
        for label in np.unique(labels):
            piece = chunk if labels.size == 1 or (labels == label).all() else subset(chunk, labels == label)
            for consumer in self.part(int(label)):
                consumer.update_chunk(piece)

    def finish(self, totals: Totals) -> dict[int, list[Any]]:
        """{group label: its consumers} (each finished by the caller over its own group's rows)."""
        return self.parts


def logged_values(data: Any, convention: str, mode: str | None = None, threshold: float | None = DEFAULT_THRESHOLD,
                  lower: float | None = None, *, step: str | None = "step", unit: str | None = None,
                  rank: str | None = None, rejection: Iterable[Rejection | str | tuple] = (),
                  batch_normalize: bool = False, keys: str | None = None, sequences: Any = None,
                  per_group: bool = False, batch_rows: int = DEFAULT_BATCH_ROWS, silent: bool = True) -> Any:
    """One row per logged step with the numbers `convention`'s framework logs there (module docstring).

    `convention`: verl | swift | trl. `mode`, `threshold`, `lower`, `rejection`, `batch_normalize`: the IS
    correction, as in simulate (None: the off-policy metrics only). `step`, `unit`, `rank`: integer columns (of the
    sequences table, `sequences`, or the token rows) naming each sequence's logged step, micro-batch / generation
    call, and rank; None = one group (a `step` column that is absent or all null also means one step, 0; one
    null among values is refused). verl takes `step` only (its decoupled-mode numbers are per step; its bypass
    mode is not reproducible offline, docs/framework-keys.md).
    `keys`: the key names (default: the framework's own). `per_group`: return the per-(step, unit, rank) values
    instead, before the framework's averaging.
    Returns a pandas DataFrame sorted by step: `step`, `groups` (micro-batches × ranks averaged), the framework's
    keys, and the summed counts tokens / sequences / empty_sequences.
    """
    import pandas as pd

    from rcdiag.analysis.keys import framework_key, key_convention

    conv = str(convention).lower()
    if conv not in FRAMEWORKS:
        raise ConfigError(f"logged_values reproduces a framework's logged values; convention must be one of "
                          f"{', '.join(FRAMEWORKS)}, got {convention!r}")
    style = conv if keys is None else keys
    key_convention(style, conv)  # a framework's key names on another framework's numbers: ConfigError
    if conv == "verl" and (unit or rank):
        raise ConfigError("verl computes its rollout_corr/ numbers once per step over the whole step batch: group "
                          "by step only (its bypass mode's per-micro-batch actor/rollout_corr/ values are not "
                          "reproducible offline; see docs/framework-keys.md)")
    names = [c for c in (step, unit, rank) if c]
    columns = group_columns(data, sequences, names, optional=step)  # no step column: one logged step, 0
    ids = columns["seq_id"]
    if names:
        groups, labels = np.unique(np.stack([columns[c] for c in names], axis=1), axis=0, return_inverse=True)
        labels = labels.reshape(-1)
    else:
        groups, labels = np.zeros((1, 0), np.int64), np.zeros(ids.size, np.int64)
    threshold, lower = split_band(threshold, lower)
    chosen = None if mode is None else get_mode(mode).with_bounds(math.inf if threshold is None else threshold,
                                                                  lower)

    def make() -> list[Any]:
        parts: list[Any] = [MetricsAccumulator(conv)]
        if chosen is not None:
            parts.append(ISAccumulator([chosen], conv, rejection=rejection, batch_normalize=batch_normalize))
        return parts

    make()  # fail fast on a mode, bound or rejection the framework lacks
    router = GroupRouter(ids, labels, make)
    stream(data, [router], sequences=sequences if sequences is not None else ids_frame(ids),
           batch_rows=batch_rows, silent=silent, desc="logged")
    records = []
    for g, key in enumerate(groups):
        size = int(np.count_nonzero(labels == g))
        parts = router.part(g)
        values: dict[str, Any] = dict(parts[0].finish(Totals(size)))
        if chosen is not None:
            values.update(parts[1].finish(Totals(size))[0])
        labelled = dict(zip(names, (int(k) for k in key), strict=True))
        records.append({"step": labelled[step] if step else 0,
                        "unit": labelled.get(unit, 0) if unit else 0, "rank": labelled.get(rank, 0) if rank else 0,
                        **values})
    frame = pd.DataFrame.from_records(records)
    metric_names = [c for c in frame.columns if c not in ("step", "unit", "rank", *COUNT_NAMES)]
    if per_group:
        return frame.rename(columns={n: framework_key(n, style) for n in metric_names})
    rows = []
    for step_value, in_step in frame.groupby("step", sort=True):
        row: dict[str, Any] = {"step": int(step_value), "groups": len(in_step)}
        per_unit = {n: [] for n in metric_names}
        for _, in_unit in in_step.groupby("unit", sort=True):
            for n in metric_names:
                per_unit[n].append(_reduce(RANK_REDUCE[conv].get(n, "nanmean"),
                                           in_unit[n].to_numpy(np.float64)))
        for n in metric_names:
            row[framework_key(n, style)] = _reduce(STEP_REDUCE[conv], np.asarray(per_unit[n], np.float64))
        for n in COUNT_NAMES:
            row[framework_key(n, style)] = int(in_step[n].sum())
        rows.append(row)
    return pd.DataFrame.from_records(rows)


def ids_frame(ids: np.ndarray) -> Any:
    """A sequences frame of just `ids` (B = every sequence that has a group, empty ones included)."""
    import pandas as pd

    return pd.DataFrame({"seq_id": ids})
