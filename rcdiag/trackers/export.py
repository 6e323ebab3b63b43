"""`rcdiag export`: a run's per-step numbers to the trackers users already watch — TensorBoard event files, an
offline W&B run, or a flat CSV / JSONL table — under a framework's own key names (rcdiag.analysis.keys, the table metrics.json and `--keys` use).

Scalars go at global_step = step (a run without steps is step 0); a NaN value (nothing scored) is left out rather
than drawn as a gap-less zero. TensorBoard and W&B are optional dependencies (`pip install 'rcdiag[trackers]'`).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcdiag.analysis.correction.trainer_defaults import TrainerSetting, choose_correction
from rcdiag.analysis.keys import KEY_STYLES, key_convention, tracker_table
from rcdiag.analysis.training.lag_trend import LAG_NAMES
from rcdiag.analysis.training.trend import INTERVAL_NAMES, TREND_COLUMNS, trend
from rcdiag.errors import ConfigError, InputError, RcdiagError
from rcdiag.store.names import safe_name
from rcdiag.store.outdir import check_outside_runs
from rcdiag.trackers.read import need_tracker, read_wandb

TARGETS = ("tensorboard", "wandb", "csv", "jsonl")
WANDB_FLUSH_SECONDS = 60.0
"""How long an export waits for wandb-core to finish writing the offline run's log."""
EXPORTED = (*(c for c in TREND_COLUMNS if c != "step"), *(f"{n}_{b}" for n in INTERVAL_NAMES for b in ("low", "high")),
            *LAG_NAMES)
"""The trend columns a tracker gets (a framework's key style keeps those it logs; canonical all, under rcdiag/);
the lag columns only where the run has them (rcdiag.analysis.training.lag_trend)."""


def export_table(keys: str | None, columns: Any = None) -> dict[str, str]:
    """{trend column: tracker key} of an export (and of a cross-check) under `keys`; ConfigError if unknown.
    `columns`: only those of a given trend frame (a run without versions has no lag columns)."""
    table = tracker_table(keys, EXPORTED)
    return table if columns is None else {c: k for c, k in table.items() if c in set(columns)}


@dataclass(frozen=True)
class ExportResult:
    """What was written: the path (event file, W&B run directory or table file), steps and scalars written, and
    the IS setting of the IS keys (the trainer's recorded one unless given: rcdiag.analysis.correction.trainer_defaults)."""

    path: Path
    steps: int
    scalars: int
    keys: list[str]
    setting: TrainerSetting | None = None


def tracker_rows(frame: Any, keys: str) -> list[tuple[int, dict[str, float]]]:
    """(step, {tracker key: value}) per step of a trend frame, finite values only."""
    table = export_table(keys, frame.columns)
    rows = []
    for record in frame.to_dict(orient="records"):
        values = {key: float(record[col]) for col, key in table.items()
                  if record[col] is not None and math.isfinite(float(record[col]))}
        rows.append((int(record["step"]), values))
    return rows


EVENT_SUFFIX = ".rcdiag"
"""Suffix of the event files rcdiag writes (TensorBoard reads any events.out.tfevents* file): a re-export replaces
the files with this suffix in its run's folder and no others."""


def write_tensorboard(rows: list[tuple[int, dict[str, float]]], dest: Path, name: str) -> Path:
    """One TensorBoard event file for `rows` in `dest`/`name`/ (so TensorBoard lists it as run `name` next to the
    trainer's runs in the same log directory): written in a temporary directory beside the log directory (not in
    it, where a watching TensorBoard would list it as a run) and moved in when complete; the event files an earlier
    export left there (EVENT_SUFFIX) are removed then, so the run does not show two copies of every curve.
    `name` is made directory-safe (a run called `..` never exports into the parent). Returns the file's path."""
    need_tracker("tensorboard")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    _check_dir(dest, "tensorboard")
    folder = dest / safe_name(name)
    if os.path.lexists(folder) and (folder.is_symlink() or not folder.is_dir()):
        raise ConfigError(f"DEST {os.fspath(dest)!r}: {folder.name} there is not a directory; the run's event file "
                          "goes into the folder named after the run")
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".rcdiag-export-", dir=Path(os.path.abspath(dest)).parent))
    try:
        writer = EventFileWriter(str(tmp), filename_suffix=EVENT_SUFFIX)
        wall = time.time()
        for step, values in rows:
            summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
            writer.add_event(Event(wall_time=wall, step=step, summary=summary))
        writer.close()
        (event,) = tmp.iterdir()
        target = folder / event.name
        os.replace(event, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in folder.glob(f"events.out.tfevents.*{EVENT_SUFFIX}"):
        if old != target and old.is_file() and not old.is_symlink():
            old.unlink()
    return target


def _check_dir(dest: Path, to: str) -> None:
    """A --to tensorboard|wandb destination: a directory (or a new one), outside any run's data."""
    check_outside_runs(dest, "DEST")
    if os.path.lexists(dest) and not dest.is_dir():
        raise ConfigError(f"DEST {os.fspath(dest)!r}: exists and is not a directory; --to {to} writes into a "
                          "directory (a log directory for TensorBoard, the folder that gets wandb/ for W&B)")


def write_wandb(rows: list[tuple[int, dict[str, float]]], dest: Path, name: str, config: dict[str, Any]) -> Path:
    """An offline W&B run under `dest`/wandb/ (no network; `wandb sync` uploads it later). Returns its directory."""
    need_tracker("wandb")
    import wandb

    _check_dir(dest, "wandb")
    dest.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_SILENT", "true")
    settings = wandb.Settings(mode="offline", silent=True, console="off", save_code=False, x_disable_stats=True)
    # an absolute dir: wandb-core, started by the process's first init, resolves a relative one against ITS working
    # directory, so after an os.chdir (a notebook, a second export) the log went nowhere and the export timed out
    run = wandb.init(dir=str(dest.resolve()), project="rcdiag", name=safe_name(name), config=config,
                     settings=settings, reinit="create_new")
    try:
        for step, values in rows:
            run.log(values, step=step)
    finally:
        run.finish()
    directory = Path(run.dir).parent
    _await_history(directory, {step for step, values in rows if values})
    return directory


def _await_history(directory: Path, steps: set[int], timeout: float = WANDB_FLUSH_SECONDS) -> None:
    """Wait until the run's .wandb log holds every logged step: wandb-core may still be writing it when finish()
    returns on a busy machine (seen in the tests), and an export must not look complete before it is."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            written = set(read_wandb(directory)["step"])
        except InputError:
            written = set()
        if steps <= written:
            return
        if time.monotonic() > deadline:
            raise RcdiagError(f"{directory}: wandb wrote {len(written)} of {len(steps)} steps within {timeout:g} s; "
                              "the offline run is incomplete — re-run the export")
        time.sleep(0.2)


def _write_table(rows: list[tuple[int, dict[str, float]]], dest: Path, fmt: str) -> Path:
    """The table as CSV or JSONL at `dest` (temporary name, then rename). An existing file is replaced only when it
    is an earlier rcdiag export (exported_by_rcdiag); a file inside a run's data, never."""
    import pandas as pd

    check_table_dest(dest, fmt)
    frame = pd.DataFrame([{"step": step, **values} for step, values in rows])
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    if fmt == "csv":
        frame.to_csv(tmp, index=False)
    else:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in frame.to_dict(orient="records")))
    os.replace(tmp, dest)
    return dest


def check_table_dest(dest: Path, fmt: str, columns: tuple[str, ...] | None = None, option: str = "DEST") -> None:
    """ConfigError unless `dest` may receive a table: outside any run's data, and new or an earlier rcdiag table
    of the same kind (exported_by_rcdiag) — rcdiag never silently replaces a file it did not write."""
    check_outside_runs(dest, option)
    if os.path.lexists(dest):
        if dest.is_symlink() or not dest.is_file():
            raise ConfigError(f"{option} {os.fspath(dest)!r}: exists and is not a plain file; a {fmt} table is one file")
        if not exported_by_rcdiag(dest, fmt, columns):
            raise ConfigError(f"{option} {os.fspath(dest)!r}: exists and is not a table rcdiag wrote; rcdiag does not "
                              "overwrite files it did not write — choose another file name or remove it first")


def _known_keys() -> set[str]:
    return {key for style in KEY_STYLES for key in export_table(style).values()}


def exported_by_rcdiag(path: Path, fmt: str, columns: tuple[str, ...] | None = None) -> bool:
    """Whether the file at `path` is a table rcdiag wrote: its first line (read up to 1 MiB) names `step` then only
    tracker keys of some key style (or exactly `columns`, for another of rcdiag's tables) — a user's file never
    looks like that by accident, and an unreadable one is not ours."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(1 << 20).split(b"\n", 1)[0].decode()
        names = list(json.loads(head)) if fmt == "jsonl" else head.rstrip("\r").split(",")
    except (OSError, UnicodeDecodeError, ValueError, TypeError, RecursionError):
        return False
    if columns is not None:
        return tuple(names) == columns
    return bool(names) and names[0] == "step" and set(names[1:]) <= _known_keys()


def export_run(run: Any, to: str, dest: str | os.PathLike, keys: str = "canonical", *, mode: str | None = None,
               threshold: float | None = None, lower: float | None = None, silent: bool = True) -> ExportResult:
    """Export the per-step trend of `run` (computed under the convention of `keys`) to `to` at `dest`.

    `to`: tensorboard (dest = log directory; the file goes to dest/<run name>/) | wandb (dest = the directory that
    gets wandb/offline-run-*) | csv | jsonl (dest = the file). `keys`: one of KEY_STYLES (export_table). The IS
    keys are computed at `mode` / `threshold` / `lower`; each one not given is the run's recorded trainer
    setting (`trainer.correction`: record_grpo writes TRL's), else the `keys` framework's default (TRL:
    sequence_mask at C=3), else rcdiag's (token_truncate at C=2) — `ExportResult.setting` says which and why.
    """
    if to not in TARGETS:
        raise ConfigError(f"unknown --to {to!r}; choose one of {', '.join(TARGETS)}")
    convention = key_convention(keys, None)
    if to in ("tensorboard", "wandb"):
        need_tracker(to)  # before the pass over the tokens
    from rcdiag.store.run import Run, open_run

    path = Path(dest)
    if to in ("tensorboard", "wandb"):  # the destination is checked before the pass over the tokens
        _check_dir(path, to)
    else:
        check_table_dest(path, to)
    opened = run if isinstance(run, Run) else open_run(run)
    setting = choose_correction(opened, keys, mode=mode, threshold=threshold, lower=lower, convention=convention)
    frame = trend(opened, convention, setting.mode, setting.threshold, setting.lower, silent=silent)
    rows = tracker_rows(frame, keys)
    name = Path(os.path.abspath(opened.path)).name
    config = {"rcdiag_run": str(opened.path), "keys": keys, "convention": convention, "mode": setting.mode,
              "threshold": setting.threshold, "lower": setting.lower, "is_setting": setting.sentence()}
    if to == "tensorboard":
        written = write_tensorboard(rows, path, name)
    elif to == "wandb":
        written = write_wandb(rows, path, name, config)
    else:
        written = _write_table(rows, path, to)
    names = sorted({k for _, values in rows for k in values})
    return ExportResult(written, len(rows), sum(len(v) for _, v in rows), names, setting)
