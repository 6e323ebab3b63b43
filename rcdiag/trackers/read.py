"""Read a trainer's logged scalars back: TensorBoard event files, an offline W&B run, or a CSV of its history.

Every reader returns the same long pandas DataFrame — step (int64), key (str), value (float64) — so the cross-check
does not care where the curves came from. TensorBoard files are read with TensorBoard's own EventAccumulator.
wandb ≥ 0.2x has no Python reader of its `.wandb` transaction log any more (the public API needs a server), so the
log is read here (rcdiag.trackers.records: W&B's LevelDB-log framing, every record's checksum verified), each record
parsed with wandb's own protobuf `Record`. Event files are checked record by record (crc32c) before TensorBoard's
reader sees them: that reader stops silently at the first damaged record.
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from rcdiag.errors import ConfigError, InputError
from rcdiag.trackers.records import check_event_file, read_log, wandb_records

STEP_COLUMNS = ("step", "_step", "global_step", "train/global_step", "trainer/global_step")
"""Step columns a history CSV may have (W&B's export calls it _step, HF Trainer train/global_step)."""
TRACKERS_HINT = "install the trackers extra: pip install 'rcdiag[trackers]' (tensorboard, wandb)"


def need_tracker(module: str) -> Any:
    """`module` imported, or ConfigError saying how to install it (tensorboard and wandb are optional: the
    `trackers` extra) — one message for every reader and writer of tracker files."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{module.split('.')[0]} is not installed: {TRACKERS_HINT}") from None


def _frame(records: list[tuple[int, str, float]]) -> Any:
    import pandas as pd

    frame = pd.DataFrame(records, columns=["step", "key", "value"])
    return frame.astype({"step": "int64", "key": "str", "value": "float64"})


# ----------------------------------------------------------------------------------------------- TensorBoard
def read_tensorboard(logdir: str | Path) -> Any:
    """Every scalar of every event file under `logdir` (a file or directory), with TensorBoard's own reader."""
    need_tracker("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    path = Path(logdir)
    if not path.exists():
        raise InputError("no such file or directory", file=str(path))
    files = [path] if not path.is_dir() else sorted(f for f in path.rglob("events.out.tfevents*") if f.is_file())
    if not files:
        raise InputError("no TensorBoard event files (events.out.tfevents*) here", file=str(path))
    records = []
    for file in files:
        check_event_file(file)
        accumulator = EventAccumulator(str(file), size_guidance={SCALARS: 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            records += [(int(e.step), tag, float(e.value)) for e in accumulator.Scalars(tag)]
    return _frame(records)


# ----------------------------------------------------------------------------------------------- W&B offline
def wandb_file(path: str | Path) -> Path:
    """The `.wandb` log of an offline run: the file itself, an offline-run-* directory, or a directory holding
    wandb/ (the newest run)."""
    p = Path(path)
    if p.is_file():
        return p
    found = sorted(p.glob("*.wandb")) or sorted(p.glob("wandb/offline-run-*/*.wandb")) or sorted(
        p.glob("offline-run-*/*.wandb")) or sorted(p.glob("run-*/*.wandb"))
    if not found:
        raise InputError("no W&B run log (*.wandb) here or under wandb/offline-run-*/", file=str(p))
    return found[-1]


def read_wandb(path: str | Path) -> Any:
    """Every numeric history value of an offline W&B run (see wandb_file), at its `_step`."""
    wandb_internal_pb2 = need_tracker("wandb.proto.wandb_internal_pb2")
    file = wandb_file(path)
    records = []
    for payload in wandb_records(file):
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(payload)
        except Exception:  # noqa: BLE001 — protobuf's DecodeError: a record whose checksum held but not its format
            raise InputError("a record of the W&B log is not a wandb Record", file=str(file)) from None
        if record.WhichOneof("record_type") != "history":
            continue
        try:
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            step = int(items.get("_step", record.history.step.num))
        except (ValueError, TypeError, RecursionError):
            raise InputError("a history record of the W&B log holds a value or step that is not JSON numbers",
                             file=str(file)) from None
        records += [(step, k, float(v)) for k, v in items.items()
                    if not k.startswith("_") and isinstance(v, int | float) and not isinstance(v, bool)]
    return _frame(records)


# ----------------------------------------------------------------------------------------------- CSV
def read_history_csv(path: str | Path) -> Any:
    """A wide history table (one row per logging step, one column per key; step column from STEP_COLUMNS), e.g.
    W&B's 'Export CSV' or the trainer's log_history, as the long frame."""
    import pandas as pd

    file = Path(path)
    data = read_log(file, "history CSV")
    try:
        wide = pd.read_csv(io.BytesIO(data))
    except (OSError, ValueError) as exc:
        raise InputError(f"unreadable CSV ({str(exc)[:200]})", file=str(file)) from None
    step = next((c for c in STEP_COLUMNS if c in wide.columns), None)
    if step is None:
        raise InputError(f"no step column; name one of {', '.join(STEP_COLUMNS)}", file=str(file), field="step")
    steps = pd.to_numeric(wide[step], errors="coerce")
    bad = ~(steps.notna() & (steps == steps.round()) & (steps.abs() < 2 ** 53))
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        raise InputError(f"step {str(wide[step].iloc[row])[:40]!r} is not a whole number", file=str(file),
                         row=row + 2, field=step, hint="each row's step must be the integer step it was logged at")
    long = wide.melt(id_vars=[step], var_name="key", value_name="value").dropna()
    long = long[pd.to_numeric(long["value"], errors="coerce").notna()]
    return _frame(list(zip(long[step].astype("int64"), long["key"].astype(str),
                           pd.to_numeric(long["value"]).astype(float), strict=True)))


READERS = {"tensorboard": read_tensorboard, "wandb": read_wandb, "csv": read_history_csv}
"""Source kind → reader."""
