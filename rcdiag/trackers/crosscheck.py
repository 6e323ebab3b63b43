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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rcdiag.analysis.defaults import DEFAULT_THRESHOLD
from rcdiag.analysis.keys import check_keys, guess_keys, key_convention
from rcdiag.analysis.training.trend import DEFAULT_MODE, trend
from rcdiag.errors import ConfigError, InputError
from rcdiag.trackers.export import export_table
from rcdiag.trackers.read import READERS

DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-6
COLUMNS = ("step", "key", "logged", "recomputed", "abs_diff", "rel_diff", "agree")


OFFSET_TRIED = (1, -1)
"""Step offsets tried when the values disagree: verl's global_steps count from 1, a dump's steps often from 0."""
OFFSET_SHARE = 0.9
"""An offset is named when at least this share of the values agree under it (and more than without it)."""


@dataclass
class CrossCheck:
    """The comparison: `table` one row per (step, key) logged by the trainer and recomputed (COLUMNS), plus the
    steps only one side has, logged steps missing between logged ones, the key set used, the logged keys rcdiag
    cannot recompute, the step offset applied and one found to fit better."""

    table: Any
    keys: str
    only_logged: list[int]
    only_run: list[int]
    not_recomputed: list[str]
    missing: list[int] = field(default_factory=list)
    """Run steps inside the logged range at which a logged key has no value: the log lost them."""
    unversioned: list[str] = field(default_factory=list)
    """Logged staleness keys the run cannot recompute: it stores no policy versions, or not the trainer's."""
    step_offset: int = 0
    better_offset: tuple[int, float] | None = None
    """(offset, share of values agreeing under it) when another step offset fits (OFFSET_TRIED)."""

    @property
    def disagreements(self) -> Any:
        return self.table[~self.table["agree"]]

    @property
    def bad_steps(self) -> list[int]:
        return sorted({int(s) for s in self.disagreements["step"]})

    @property
    def failed(self) -> bool:
        """A disagreement, nothing compared, or logged values missing in the middle of the log."""
        return bool(self.bad_steps) or self.table.empty or bool(self.missing)

    def summary(self) -> str:
        """What the check found, in words, with what to do."""
        lines = [self._verdict()]
        if self.missing:
            lines.append(f"Missing from the log (data loss): no logged value at run step(s) {_steps(self.missing)} "
                         "between steps the log has — the log is incomplete there (a crash, a lost file, a gap in "
                         "logging), so those steps were not checked.")
        if self.better_offset is not None:
            offset, share = self.better_offset
            lines.append(f"The logged curve matches the recomputation shifted by {offset:+d} step(s) ({share:.0%} of "
                         f"the values agree at logged step = run step {offset:+d}): is the dump's step numbering off "
                         "by one? verl's global_steps count from 1, a dump's steps often from 0 — re-run with "
                         f"--step-offset {self.step_offset + offset}.")
        if self.unversioned:
            lines.append(f"Not checked: the log has staleness keys ({', '.join(self.unversioned[:4])}"
                         f"{' …' if len(self.unversioned) > 4 else ''}) but the run stores no policy versions with "
                         "the trainer's version — re-import the dumps with their versions (verl max/min_global_steps, "
                         "TRL model_version) to check them.")
        if self.only_run and not self.table.empty:
            lines.append(f"Run step(s) the log lacks (not compared): {_steps(self.only_run)}.")
        return "\n".join(lines)

    def _verdict(self) -> str:
        n_steps = self.table["step"].nunique()
        shift = f" (logged step = run step {self.step_offset:+d})" if self.step_offset else ""
        if self.table.empty and self.unversioned:
            return f"Nothing compared: every logged {self.keys} key this run could check is a staleness key."
        if self.table.empty:
            return (f"No logged {self.keys} key matches a step of the run{shift} (logged steps "
                    f"{_steps(self.only_logged)}, run steps {_steps(self.only_run)}): check the key set (--keys), "
                    "the step numbering (--step-offset) and that the run holds these steps.")
        if not self.bad_steps:
            word = "Agree (healthy)" if not self.missing else "Agree where compared, but the log is incomplete"
            return (f"{word}: {len(self.table)} logged values at {n_steps} step(s){shift} match the recomputation "
                    f"under the {key_convention(self.keys, None)} convention within tolerance.")
        worst = self.disagreements.sort_values("rel_diff", ascending=False).iloc[0]
        return (f"Disagree (alarm) at step(s) {_steps(self.bad_steps)}: {len(self.disagreements)} of "
                f"{len(self.table)} values differ beyond tolerance; worst {worst['key']} at step {int(worst['step'])}: "
                f"logged {worst['logged']:.6g}, recomputed {worst['recomputed']:.6g}. The trainer's logging at those "
                "steps does not match its tokens: check its temperature, mask and threshold settings there, or a "
                "logging bug, before trusting its curves.")


def _steps(steps: list[int], shown: int = 10) -> str:
    return ", ".join(map(str, steps[:shown])) + (f" … ({len(steps)} in all)" if len(steps) > shown else "")


def _strip(logged: Any, table: dict[str, str]) -> Any:
    """Map logged keys (possibly prefixed, e.g. actor/rollout_corr/kl) to the table's keys; others dropped."""
    wanted = set(table.values())

    def canonical(key: str) -> str | None:
        if key in wanted:
            return key
        return next((w for w in wanted if key.endswith("/" + w)), None)

    mapped = logged.assign(key=logged["key"].map(canonical))
    return mapped.dropna(subset=["key"])


def _compare(logged: Any, ours: Any, by_key: dict[str, str], offset: int, rtol: float, atol: float) -> Any:
    """One row per logged (step, key) whose run step (logged step − offset) the run has (COLUMNS; step = run's)."""
    import pandas as pd

    run_steps = set(int(s) for s in ours.index)
    rows = []
    for step, key, value in logged.itertuples(index=False):
        mine_step = int(step) - offset
        if mine_step not in run_steps:
            continue
        mine = float(ours.at[mine_step, by_key[key]])
        diff = abs(mine - value)
        agree = bool(diff <= atol + rtol * abs(value)) if math.isfinite(mine) and math.isfinite(value) else (
            mine == value or (math.isnan(mine) and math.isnan(value)))
        rel = diff / abs(value) if value else (0.0 if diff == 0 else math.inf)
        rows.append((mine_step, key, float(value), mine, diff, rel, agree))
    table = pd.DataFrame(rows, columns=list(COLUMNS)).astype({"step": "int64", "agree": bool})  # typed when empty
    return table.sort_values(["step", "key"], ignore_index=True)


def _missing(logged: Any, run_steps: set[int], offset: int) -> list[int]:
    """Run steps strictly between a key's first and last logged step (shifted) at which that key has no value."""
    out: set[int] = set()
    for _, steps in logged.groupby("key")["step"]:
        have = {int(s) - offset for s in steps}
        lo, hi = min(have), max(have)
        out |= {s for s in run_steps if lo < s < hi and s not in have}
    return sorted(out)


def _better_offset(logged: Any, ours: Any, by_key: dict[str, str], table: Any, offset: int, rtol: float,
                   atol: float) -> tuple[int, float] | None:
    """(extra offset, agreeing share) of the OFFSET_TRIED shift that makes ≥ OFFSET_SHARE of the values agree
    when the given offset does not; None otherwise."""
    share = float(table["agree"].mean()) if len(table) else 0.0
    if share >= OFFSET_SHARE:
        return None
    best = None
    for extra in OFFSET_TRIED:
        shifted = _compare(logged, ours, by_key, offset + extra, rtol, atol)
        if len(shifted) >= max(1, len(table) // 2):
            got = float(shifted["agree"].mean())
            if got >= OFFSET_SHARE and got > share and (best is None or got > best[1]):
                best = (extra, got)
    return best


def crosscheck(run: Any, source: str | Path, kind: str = "tensorboard", keys: str | None = None, *,
               mode: str = DEFAULT_MODE, threshold: float = DEFAULT_THRESHOLD, lower: float | None = None,
               rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL, step_offset: int = 0,
               silent: bool = True) -> CrossCheck:
    """Compare the trainer's logged scalars in `source` (`kind`: tensorboard | wandb | csv) with the run's per-step
    recomputation under the convention of `keys` (verl | swift | trl | canonical; None: guessed from the logged
    names). `mode`/`threshold`/`lower` must be the trainer's IS setting; `step_offset`: logged step = run step +
    offset. A key logged twice at a step keeps the last value (the tracker's own rule). A damaged log is an
    InputError (rcdiag.trackers.records), never a comparison of what came before the damage."""
    if kind not in READERS:
        raise ConfigError(f"unknown source kind {kind!r}; choose one of {', '.join(READERS)}")
    if not (rtol >= 0 and atol >= 0):
        raise ConfigError("--rtol and --atol must be ≥ 0")
    if type(step_offset) is not int:
        raise ConfigError(f"step_offset must be a whole number, got {step_offset!r}")
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
    unversioned = sorted(set(logged["key"]) - set(export_table(chosen, frame.columns).values()))
    logged = logged[~logged["key"].isin(unversioned)]
    by_key = {v: k for k, v in table.items()}
    ours = frame.set_index("step")
    run_steps = {int(s) for s in ours.index}
    log_steps = {int(s) - step_offset for s in logged["step"]}
    result = _compare(logged, ours, by_key, step_offset, rtol, atol)
    better = _better_offset(logged, ours, by_key, result, step_offset, rtol, atol)
    return CrossCheck(result, chosen, sorted(s + step_offset for s in log_steps - run_steps),
                      sorted(run_steps - log_steps), unmatched, _missing(logged, run_steps, step_offset), unversioned,
                      step_offset, better)
