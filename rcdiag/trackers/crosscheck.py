"""`rcdiag crosscheck`: recompute the trainer's own rollout-correction curves from the run, step by step, and say
where its logged values disagree beyond numeric tolerance.

A trainer's logging bug, a wrong temperature or the wrong mask makes its dashboard's rollout_corr/… curves differ
from what the same tokens give under the framework's own arithmetic (rcdiag's --convention). The logged scalars
are read from TensorBoard, an offline W&B run or a history CSV (rcdiag.trackers.read); keys may sit under a
prefix (actor/, train/). Tolerance: |recomputed − logged| ≤ atol + rtol·|logged|; the defaults absorb float32
arithmetic and summation order, not a different mask or temperature (those move the numbers by far more).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcdiag.analysis.defaults import DEFAULT_THRESHOLD
from rcdiag.analysis.keys import check_keys, guess_keys, key_convention
from rcdiag.analysis.trend import DEFAULT_MODE, trend
from rcdiag.errors import ConfigError, InputError
from rcdiag.trackers.export import export_table
from rcdiag.trackers.read import READERS

DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-6
COLUMNS = ("step", "key", "logged", "recomputed", "abs_diff", "rel_diff", "agree")


@dataclass
class CrossCheck:
    """The comparison: `table` one row per (step, key) logged by the trainer and recomputed (COLUMNS), plus the
    steps only one side has, the key set used, and the logged keys rcdiag cannot recompute."""

    table: Any
    keys: str
    only_logged: list[int]
    only_run: list[int]
    not_recomputed: list[str]

    @property
    def disagreements(self) -> Any:
        return self.table[~self.table["agree"]]

    @property
    def bad_steps(self) -> list[int]:
        return sorted({int(s) for s in self.disagreements["step"]})

    def summary(self) -> str:
        """What the check found, in words, with what to do."""
        n_steps = self.table["step"].nunique()
        if self.table.empty:
            return (f"No logged {self.keys} key matches a step of the run (logged steps {self.only_logged[:5]}…, run "
                    f"steps {self.only_run[:5]}…): check the key set (--keys) and that the run holds these steps.")
        if not self.bad_steps:
            return (f"Agree (healthy): {len(self.table)} logged values at {n_steps} step(s) match the recomputation "
                    f"under the {key_convention(self.keys, None)} convention within tolerance.")
        worst = self.disagreements.sort_values("rel_diff", ascending=False).iloc[0]
        return (f"Disagree (alarm) at step(s) {', '.join(map(str, self.bad_steps))}: {len(self.disagreements)} of "
                f"{len(self.table)} values differ beyond tolerance; worst {worst['key']} at step {int(worst['step'])}: "
                f"logged {worst['logged']:.6g}, recomputed {worst['recomputed']:.6g}. The trainer's logging at those "
                "steps does not match its tokens: check its temperature, mask and threshold settings there, or a "
                "logging bug, before trusting its curves.")


def _strip(logged: Any, table: dict[str, str]) -> Any:
    """Map logged keys (possibly prefixed, e.g. actor/rollout_corr/kl) to the table's keys; others dropped."""
    wanted = set(table.values())

    def canonical(key: str) -> str | None:
        if key in wanted:
            return key
        return next((w for w in wanted if key.endswith("/" + w)), None)

    mapped = logged.assign(key=logged["key"].map(canonical))
    return mapped.dropna(subset=["key"])


def crosscheck(run: Any, source: str | Path, kind: str = "tensorboard", keys: str | None = None, *,
               mode: str = DEFAULT_MODE, threshold: float = DEFAULT_THRESHOLD, lower: float | None = None,
               rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL, silent: bool = True) -> CrossCheck:
    """Compare the trainer's logged scalars in `source` (`kind`: tensorboard | wandb | csv) with the run's per-step
    recomputation under the convention of `keys` (verl | swift | trl | canonical; None: guessed from the logged
    names). `mode`/`threshold`/`lower` must be the trainer's IS setting. A key logged twice at a step keeps the
    last value (the tracker's own rule)."""
    if kind not in READERS:
        raise ConfigError(f"unknown source kind {kind!r}; choose one of {', '.join(READERS)}")
    if not (rtol >= 0 and atol >= 0):
        raise ConfigError("--rtol and --atol must be ≥ 0")
    logged = READERS[kind](source)
    chosen = check_keys(keys) if keys else guess_keys(logged["key"])
    if chosen is None:
        raise InputError("none of the logged keys is a known rollout-correction key (rollout_corr/…, "
                         "rollout_correction/…, sampling/…); pass --keys", file=str(source))
    table = export_table(chosen)
    prefixes = {v.rsplit("/", 1)[0] + "/" for v in table.values()}
    raw_keys = set(logged["key"])
    logged = _strip(logged, table).drop_duplicates(["step", "key"], keep="last")
    unmatched = sorted(k for k in raw_keys - set(table.values())
                       if any(p in k for p in prefixes) and not any(k.endswith("/" + v) for v in table.values()))
    frame = trend(run, key_convention(chosen, None), mode, threshold, lower, silent=silent)
    by_key = {v: k for k, v in table.items()}
    ours = frame.set_index("step")
    run_steps = {int(s) for s in ours.index}
    log_steps = {int(s) for s in logged["step"]}
    rows = []
    for step, key, value in logged.itertuples(index=False):
        if int(step) not in run_steps:
            continue
        mine = float(ours.at[step, by_key[key]])
        diff = abs(mine - value)
        agree = bool(diff <= atol + rtol * abs(value)) if math.isfinite(mine) and math.isfinite(value) else (
            mine == value or (math.isnan(mine) and math.isnan(value)))
        rel = diff / abs(value) if value else (0.0 if diff == 0 else math.inf)
        rows.append((int(step), key, float(value), mine, diff, rel, agree))
    import pandas as pd

    result = pd.DataFrame(rows, columns=list(COLUMNS)).sort_values(["step", "key"], ignore_index=True)
    return CrossCheck(result, chosen, sorted(log_steps - run_steps), sorted(run_steps - log_steps), unmatched)
