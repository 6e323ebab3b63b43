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

from rcdiag.analysis.chunks import DEFAULT_BATCH_ROWS, TokenChunk, stream
from rcdiag.analysis.correction import ISAccumulator, get_mode
from rcdiag.analysis.defaults import DEFAULT_THRESHOLD
from rcdiag.analysis.metrics import COUNT_NAMES, MetricsAccumulator
from rcdiag.analysis.rejection import Rejection
from rcdiag.analysis.trend import subset
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


def group_columns(data: Any, sequences: Any, columns: Sequence[str]) -> dict[str, np.ndarray]:
    """{"seq_id": int64 [B] sorted, column: int64 [B]} from the sequences table (a Run's or `sequences`) or, for
    token rows without one, from the token rows (one value per seq_id). A missing column, a null, a non-integer or
    a sequence with two values raises InputError naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rcdiag.store.run import Run
    from rcdiag.store.schema import as_table

    if sequences is None and isinstance(data, Run):
        have = set.intersection(*(set(pq.read_schema(f).names) for f in data.sequence_files)) if \
            data.sequence_files else set()
        lacking = [c for c in columns if c not in have]
        if lacking:
            raise InputError(f"the run's sequences table has no column {lacking[0]!r}; pass sequences= a frame "
                             "with seq_id and the group columns", file=str(data.path / "sequences"),
                             field=lacking[0])
        table, source = data.sequence_table(["seq_id", *columns]), "sequences"
    else:
        table = as_table(data if sequences is None else sequences, source="sequences")
        source = "tokens" if sequences is None else "sequences"
        for name in ("seq_id", *columns):
            if name not in table.column_names:
                raise InputError(f"missing group column {name!r}", file=source, field=name)
        table = table.select(["seq_id", *columns])
    frame = table.to_pandas()
    for name in columns:
        column = table.column(name)
        if column.null_count:
            row = int(np.flatnonzero(np.asarray(column.is_null()))[0]) + 1
            raise InputError(f"group column {name!r} is null (every sequence needs one)", file=source, row=row,
                             field=name)
        if not pa.types.is_integer(column.type):
            raise InputError(f"group column {name!r} must hold integers, got {column.type}", file=source,
                             field=name)
    per_seq = frame.drop_duplicates()
    if per_seq["seq_id"].duplicated().any():
        seq = int(per_seq.loc[per_seq["seq_id"].duplicated(), "seq_id"].iloc[0])
        raise InputError(f"seq_id {seq} has two values of the group columns {', '.join(columns)}", file=source,
                         field=columns[0])
    per_seq = per_seq.sort_values("seq_id")
    return {name: per_seq[name].to_numpy(np.int64) for name in ("seq_id", *columns)}


class GroupRouter:
    """Mergeable per-group state: each chunk's sequences go to their group's fresh consumers (`make()`)."""

    def __init__(self, ids: np.ndarray, labels: np.ndarray, make: Any) -> None:
        self.ids, self.labels, self.make = ids, labels, make
        self.parts: dict[int, list[Any]] = {}

    def part(self, label: int) -> list[Any]:
        if label not in self.parts:
            self.parts[label] = self.make()
        return self.parts[label]

    def update_chunk(self, chunk: TokenChunk) -> None:
        if chunk.n == 0:
            return
        labels = self.labels[np.searchsorted(self.ids, chunk.seq_ids)]  # every seq_id is known: stream checked it
        for label in np.unique(labels):
            piece = chunk if labels.size == 1 or (labels == label).all() else subset(chunk, labels == label)
            for consumer in self.part(int(label)):
                consumer.update_chunk(piece)


def logged_values(data: Any, convention: str, mode: str | None = None, threshold: float | None = DEFAULT_THRESHOLD,
                  lower: float | None = None, *, step: str | None = "step", unit: str | None = None,
                  rank: str | None = None, rejection: Iterable[Rejection | str | tuple] = (),
                  batch_normalize: bool = False, keys: str | None = None, sequences: Any = None,
                  per_group: bool = False, batch_rows: int = DEFAULT_BATCH_ROWS, silent: bool = True) -> Any:
    """One row per logged step with the numbers `convention`'s framework logs there (module docstring).

    `convention`: verl | swift | trl. `mode`, `threshold`, `lower`, `rejection`, `batch_normalize`: the IS
    correction, as in simulate (None: the off-policy metrics only). `step`, `unit`, `rank`: integer columns (of the
    sequences table, `sequences`, or the token rows) naming each sequence's logged step, micro-batch / generation
    call, and rank; None = one group (a missing `step` column also means one step, 0). verl takes `step` only (its
    decoupled-mode numbers are per step; its bypass mode is not reproducible offline, docs/framework-keys.md).
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
    step_missing = False
    try:
        columns = group_columns(data, sequences, names)
    except InputError as exc:
        if step is None or exc.field != step:
            raise
        step_missing = True  # no step column: the whole data set is one logged step
        names = [c for c in (unit, rank) if c]
        columns = group_columns(data, sequences, names)
    ids = columns["seq_id"]
    if names:
        groups, labels = np.unique(np.stack([columns[c] for c in names], axis=1), axis=0, return_inverse=True)
        labels = labels.reshape(-1)
    else:
        groups, labels = np.zeros((1, 0), np.int64), np.zeros(ids.size, np.int64)
    chosen = None if mode is None else get_mode(mode).with_bounds(math.inf if threshold is None else threshold,
                                                                  lower)

    def make() -> list[Any]:
        parts: list[Any] = [MetricsAccumulator(conv)]
        if chosen is not None:
            parts.append(ISAccumulator([chosen], conv, rejection=rejection))
        return parts

    make()  # fail fast on a mode, bound or rejection the framework lacks
    router = GroupRouter(ids, labels, make)
    stream(data, [router], sequences=sequences if sequences is not None else ids_frame(ids),
           batch_rows=batch_rows, silent=silent, desc="logged")
    records = []
    for g, key in enumerate(groups):
        size = int(np.count_nonzero(labels == g))
        parts = router.part(g)
        values: dict[str, Any] = dict(parts[0].finish(size))
        if chosen is not None:
            values.update(parts[1].finish(size, batch_normalize)[0])
        labelled = dict(zip(names, (int(k) for k in key), strict=True))
        records.append({"step": 0 if step is None or step_missing else labelled[step],
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
