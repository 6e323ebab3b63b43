"""The report's output directory: written atomically under a writer lock, and replaced only when it holds nothing
but a previous report.

A report directory is recognised by the marker file it carries (MARKER: the rcdiag version and the list of files
that report wrote), never by the mere presence of a `metrics.json` — a directory of checkpoints and notes that
happens to hold one used to be swapped away whole. Anything in the directory that the marker does not list makes
it foreign, and a foreign directory is refused, so a file the report did not write is never removed.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from rcdiag import __version__
from rcdiag.errors import ConfigError
from rcdiag.store.files import REPORT_MARKER as MARKER
from rcdiag.store.outdir import (
    check_outside_runs,
    exclusive,
    make_temp_dir,
    report_files,
    resolve_target,
    shown,
    swap_in,
    unlisted,
)


def check_out_dir(target: str | os.PathLike) -> None:
    """Refuse a target that exists and is not a previous report holding only its own files (ConfigError)."""
    target = Path(target)
    resolve_target(target)
    check_outside_runs(target, "--out")
    writable = next(p for p in (target, *target.parents) if os.path.lexists(p))
    if not os.access(writable if writable.is_dir() else writable.parent, os.W_OK):
        raise ConfigError(f"--out {target}: {writable} is not writable (a read-only run or file system?); nothing "
                          "was computed — choose a writable --out, e.g. --out ~/reports/NAME")
    if not os.path.lexists(target):
        return
    if target.is_symlink() or not target.is_dir():
        raise ConfigError(f"{target}: exists and is not a directory; choose another --out")
    if not any(target.iterdir()):
        return
    written = report_files(target)
    if written is None:
        raise ConfigError(f"{target}: exists and is not an rcdiag report directory (no {MARKER} marker); choose "
                          "a new or empty --out (only a previous report there is replaced)")
    foreign = unlisted(target, "", written | {MARKER})
    if foreign:
        raise ConfigError(f"{target}: holds files the previous report did not write ({shown(foreign)}); move them out or "
                          "choose another --out — a report replaces its directory only when nothing else is in it")


def write_files(out: str | os.PathLike, files: dict[str, bytes]) -> Path:
    """Write `files` (relative names) plus the marker into `out` atomically, under the writer lock, and return it.

    Everything goes to a temporary sibling directory first, which replaces `out` by rename; a previous report at
    `out` is removed only after the new one is complete, and a directory that is not (only) a report is refused.
    """
    out = Path(out)
    marker = {"rcdiag_version": __version__, "files": sorted(files)}
    with exclusive(resolve_target(out)):
        check_out_dir(out)
        tmp = make_temp_dir(out.parent, f".{out.name}.")
        try:
            for name, payload in {**files, MARKER: (json.dumps(marker, indent=1) + "\n").encode()}.items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_bytes(payload)
            swap_in(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out
