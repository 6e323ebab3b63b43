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
import tempfile
from pathlib import Path

from rcdiag import __version__
from rcdiag.errors import ConfigError
from rcdiag.store.outdir import exclusive, resolve_target, swap_in

MARKER = ".rcdiag-report"
"""File every report directory carries: {"rcdiag_version": ..., "files": [relative paths the report wrote]}."""


def check_out_dir(target: str | os.PathLike) -> None:
    """Refuse a target that exists and is not a previous report holding only its own files (ConfigError)."""
    target = Path(target)
    resolve_target(target)
    if not os.path.lexists(target):
        return
    if target.is_symlink() or not target.is_dir():
        raise ConfigError(f"{target}: exists and is not a directory; choose another --out")
    if not any(target.iterdir()):
        return
    written = _marker_files(target)
    if written is None:
        raise ConfigError(f"{target}: exists and is not an rcdiag report directory (no {MARKER} marker); choose "
                          "a new or empty --out (only a previous report there is replaced)")
    foreign = _foreign(target, "", written | {MARKER})
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ConfigError(f"{target}: holds files the previous report did not write ({shown}); move them out or "
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
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        try:
            for name, payload in {**files, MARKER: (json.dumps(marker, indent=1) + "\n").encode()}.items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_bytes(payload)
            swap_in(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


def _marker_files(target: Path) -> set[str] | None:
    """The relative paths a previous report listed in its marker; None without a readable marker."""
    try:
        data = json.loads((target / MARKER).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return set(files)


def _foreign(folder: Path, prefix: str, written: set[str]) -> list[str]:
    """Entries under `folder` (relative names, folders with a trailing /) that no written path accounts for."""
    out = []
    for entry in sorted(folder.iterdir()):
        rel = prefix + entry.name
        if entry.is_dir() and not entry.is_symlink():
            if any(w.startswith(rel + "/") for w in written):
                out += _foreign(entry, rel + "/", written)
            else:
                out.append(rel + "/")
        elif rel not in written:
            out.append(rel)
    return out
