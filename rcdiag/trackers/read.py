"""Read a trainer's logged scalars back: TensorBoard event files, an offline W&B run, or a CSV of its history.

Every reader returns the same long pandas DataFrame — step (int64), key (str), value (float64) — so the cross-check
does not care where the curves came from. TensorBoard files are read with TensorBoard's own EventAccumulator.
wandb ≥ 0.2x has no Python reader of its `.wandb` transaction log any more (the public API needs a server), so the
log is read here: W&B's documented LevelDB-log framing (32 KiB blocks, 7-byte record headers: crc32c, length, type
FULL/FIRST/MIDDLE/LAST, after a 7-byte `:W&B` file header), each record parsed with wandb's own protobuf `Record`.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rcdiag.errors import ConfigError, InputError

STEP_COLUMNS = ("step", "_step", "global_step", "train/global_step", "trainer/global_step")
"""Step columns a history CSV may have (W&B's export calls it _step, HF Trainer train/global_step)."""
_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_WANDB_MAGIC = b":W&B"
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
    files = [path] if path.is_file() else sorted(path.rglob("events.out.tfevents*"))
    if not files:
        raise InputError("no TensorBoard event files (events.out.tfevents*) here", file=str(path))
    records = []
    for file in files:
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


def wandb_records(file: Path) -> Iterator[bytes]:
    """The raw record payloads of a `.wandb` LevelDB-style log (fragments joined)."""
    data = file.read_bytes()
    if data[:4] != _WANDB_MAGIC:
        raise InputError("not a W&B run log (no :W&B header)", file=str(file))
    offset, pending = _HEADER, b""
    while offset + _HEADER <= len(data):
        left = _BLOCK - offset % _BLOCK
        if left < _HEADER:
            offset += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset:offset + _HEADER])
        if offset + _HEADER + length > len(data):
            break  # a record still being written (the run is live): stop at the last complete one
        body = data[offset + _HEADER:offset + _HEADER + length]
        offset += _HEADER + length
        if kind == 0 and length == 0:
            continue
        if kind == _FULL:
            yield body
        elif kind == _FIRST:
            pending = body
        elif kind == _MIDDLE:
            pending += body
        elif kind == _LAST:
            yield pending + body
            pending = b""
        else:
            raise InputError(f"corrupt W&B log: record type {kind} at byte {offset}", file=str(file))


def read_wandb(path: str | Path) -> Any:
    """Every numeric history value of an offline W&B run (see wandb_file), at its `_step`."""
    wandb_internal_pb2 = need_tracker("wandb.proto.wandb_internal_pb2")
    file = wandb_file(path)
    records = []
    for payload in wandb_records(file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") != "history":
            continue
        items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
        step = int(items.get("_step", record.history.step.num))
        records += [(step, k, float(v)) for k, v in items.items()
                    if not k.startswith("_") and isinstance(v, int | float) and not isinstance(v, bool)]
    return _frame(records)


# ----------------------------------------------------------------------------------------------- CSV
def read_history_csv(path: str | Path) -> Any:
    """A wide history table (one row per logging step, one column per key; step column from STEP_COLUMNS), e.g.
    W&B's 'Export CSV' or the trainer's log_history, as the long frame."""
    import pandas as pd

    file = Path(path)
    try:
        wide = pd.read_csv(file)
    except (OSError, ValueError) as exc:
        raise InputError(f"unreadable CSV ({exc})", file=str(file)) from None
    step = next((c for c in STEP_COLUMNS if c in wide.columns), None)
    if step is None:
        raise InputError(f"no step column; name one of {', '.join(STEP_COLUMNS)}", file=str(file), field="step")
    long = wide.melt(id_vars=[step], var_name="key", value_name="value").dropna()
    long = long[pd.to_numeric(long["value"], errors="coerce").notna()]
    return _frame(list(zip(long[step].astype("int64"), long["key"].astype(str),
                           pd.to_numeric(long["value"]).astype(float), strict=True)))


READERS = {"tensorboard": read_tensorboard, "wandb": read_wandb, "csv": read_history_csv}
"""Source kind → reader."""
