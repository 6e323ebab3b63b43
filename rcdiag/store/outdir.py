"""Replacing an output directory safely, for every command that writes one (`import --out`, `score --out`,
`report --out`, `export`), and the one test of what in a directory rcdiag wrote.

Rules, because the output path is typed by a user and may hold anything:

- only rcdiag's own content is ever replaced: a run is a directory whose manifest (or an interrupted score's
  pending file) parses as rcdiag's and that holds nothing but a run's files (`replaceable_run`); a directory
  that merely holds a file named `manifest.json` — a web project, a model directory — is refused, however it is
  asked (`--overwrite` used to delete a project's `src/` that way);
- nothing is written into a run's data: its manifest, pending file, tokens/ and sequences/ (`check_outside_runs`;
  `report --out RUN/tokens/x` used to leave a run that no longer opened);

- one writer at a time: an exclusive `flock` on a lock file beside the target, taken without waiting, so a second
  writer fails at once with a clear error instead of interleaving renames with the first (which used to end in
  "Directory not empty", a FileNotFoundError or a hidden `.OUT.old-<pid>` left behind);
- the new content is built in a temporary sibling and swapped in by rename (an interrupted write never looks done);
- the caller decides, under the lock, whether what is there is its own (a run, a report) before anything is removed.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from rcdiag.errors import ConfigError, InputError, RunDirError
from rcdiag.store.files import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    PENDING_NAME,
    PROBES_DIR,
    REPORT_DIR,
    REPORT_MARKER,
    SEQUENCES_DIR,
    TOKENS_DIR,
)
from rcdiag.store.manifest import load_manifest
from rcdiag.store.safefile import read_json

RUN_DATA = (MANIFEST_NAME, PENDING_NAME, TOKENS_DIR, SEQUENCES_DIR)
"""A run's data: nothing but rcdiag's writers of the run itself may write there."""
_SHARD = re.compile(r"(part-\d{5,}\.parquet|\.part-\d{5,}\.parquet\.tmp)")
_PROBE = re.compile(r"[^/]+\.(json|parquet)|\.[^/]+\.tmp")
_TOP_TEMP = re.compile(r"\.(manifest|pending)\.json\.tmp")
SHOWN = 5


def resolve_target(out: str | os.PathLike, *, option: str = "--out") -> Path:
    """`out` as an absolute path with a name, refusing the working directory and its parents.

    `--out .` used to fail deep inside with "has an empty name"; replacing the directory a shell sits in (or one
    above it) would leave that shell in a deleted directory, so both are refused up front.
    """
    path = Path(os.path.abspath(out))
    cwd = Path.cwd()
    if not path.name or path == cwd or path in cwd.parents:
        raise RunDirError(f"{option} {os.fspath(out)!r}: is the current directory or one above it; name a new "
                          f"directory instead (e.g. {option} runs/NAME)")
    return path


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lock"


@contextlib.contextmanager
def exclusive(target: Path) -> Iterator[None]:
    """Hold the writer lock of `target` (created beside it, removed on release); RunDirError if another process
    holds it. The lock file is unlinked while still locked, and a lock taken on a file that was unlinked meanwhile
    is dropped and retried, so two processes can never both believe they hold it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_path(target)
    while True:
        try:  # O_NOFOLLOW: a lock planted as a symlink would make rcdiag create (and lock) the file it points at
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise RunDirError(f"{lock}: is a symbolic link where rcdiag keeps the writer lock of {target}; rcdiag "
                              "never follows it — remove it (nobody should have put it there), or choose another "
                              "--out") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirError(f"{target}: another rcdiag process is writing there right now (it holds {lock}); "
                              "wait for it to finish, or choose another --out") from None
        try:
            current = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status), else by setting
    and restoring it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A temporary sibling directory for building an output, with the mode a plain mkdir would give it (mkdtemp
    makes 0700, which a swapped-in report kept whatever the umask: colleagues could not read it)."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=parent))
    tmp.chmod(0o777 & ~current_umask())
    return tmp


def swap_in(new: Path, target: Path) -> None:
    """Move the finished directory `new` to `target`, replacing what is there. Call it holding `exclusive(target)`,
    after checking that the old content is the caller's own: it is removed. On a failure the old content stays."""
    if not os.path.lexists(target):
        os.replace(new, target)
        return
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------------------------- what is rcdiag's
def looks_like_run(path: Path) -> bool:
    """`path` holds a manifest or pending file (by name only: whether it is rcdiag's is replaceable_run's test)."""
    return (path / MANIFEST_NAME).is_file() or (path / PENDING_NAME).is_file()


def run_holding(path: str | os.PathLike) -> tuple[Path, str] | None:
    """(run directory, relative path) when `path` is or lies in a run's data (RUN_DATA) — a manifest, a pending
    file, tokens/ or sequences/ of a directory that looks like a run; None otherwise."""
    path = Path(os.path.abspath(path))
    for parent in path.parents:
        parts = path.relative_to(parent).parts
        if parts and parts[0] in RUN_DATA and looks_like_run(parent):
            return parent, "/".join(parts)
    return None


def check_outside_runs(path: str | os.PathLike, option: str) -> None:
    """ConfigError when `path` (an output) is or lies inside a run's data: writing there would break the run."""
    held = run_holding(path)
    if held is not None:
        run, rel = held
        raise ConfigError(f"{option} {os.fspath(path)!r}: is {rel} of the run {run} — rcdiag never writes into a "
                          f"run's data (its manifest, tokens/ and sequences/); choose a path outside them, e.g. "
                          f"{run / REPORT_DIR}")


def report_files(folder: Path) -> set[str] | None:
    """The relative paths a report directory's marker lists; None without a readable marker."""
    try:  # a FIFO planted as the marker used to block `report --out` forever
        data = read_json(folder / REPORT_MARKER, "report marker", MAX_MANIFEST_BYTES)
    except InputError:
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return set(files)


def unlisted(folder: Path, prefix: str, written: set[str]) -> list[str]:
    """Entries under `folder` (relative names, folders with a trailing /) that no written path accounts for;
    a symlink is never accounted for."""
    out = []
    for entry in sorted(folder.iterdir()):
        rel = prefix + entry.name
        if entry.is_dir() and not entry.is_symlink():
            if any(w.startswith(rel + "/") for w in written):
                out += unlisted(entry, rel + "/", written)
            else:
                out.append(rel + "/")
        elif rel not in written or entry.is_symlink():
            out.append(rel)
    return out


def _foreign_in(folder: Path, name: str, pattern: re.Pattern) -> list[str]:
    """Entries of a run's subfolder that are not regular files named as rcdiag names them there."""
    return [f"{name}/{e.name}" + ("/" if e.is_dir() else "") for e in sorted(folder.iterdir())
            if e.is_symlink() or not e.is_file() or not pattern.fullmatch(e.name)]


def foreign_run_entries(path: Path) -> list[str]:
    """What in the run directory `path` rcdiag did not write (relative names): anything but the manifest and
    pending files, shards in tokens/ and sequences/, probes in probes/, a report in report/ holding only what
    its marker lists, and rcdiag's own temporary files."""
    out = []
    for entry in sorted(path.iterdir()):
        name = entry.name
        if entry.is_symlink():
            out.append(name)
        elif name in (MANIFEST_NAME, PENDING_NAME) or _TOP_TEMP.fullmatch(name):
            out += [] if entry.is_file() else [name + "/"]
        elif name in (TOKENS_DIR, SEQUENCES_DIR, PROBES_DIR) and entry.is_dir():
            out += _foreign_in(entry, name, _PROBE if name == PROBES_DIR else _SHARD)
        elif name == REPORT_DIR and entry.is_dir():
            written = report_files(entry)
            out += [name + "/"] if written is None else [f"{name}/{r}" for r in
                                                         unlisted(entry, "", written | {REPORT_MARKER})]
        else:
            out.append(name + ("/" if entry.is_dir() else ""))
    return out


def shown(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def replaceable_run(path: Path) -> str | None:
    """None when the existing directory `path` may be replaced as a run (empty, or an rcdiag run — complete or
    interrupted — holding only rcdiag's files); else why not, in words."""
    if not any(path.iterdir()):
        return None
    if os.path.lexists(path / MANIFEST_NAME):
        try:
            load_manifest(path)
        except (RunDirError, InputError) as exc:
            return f"its {MANIFEST_NAME} is not an rcdiag manifest ({str(exc)[:200]})"
    elif os.path.lexists(path / PENDING_NAME):
        if not (path / PENDING_NAME).is_file() or not _pending_ok(path / PENDING_NAME):
            return f"its {PENDING_NAME} is not an interrupted rcdiag score's"
    else:
        return f"it is not an rcdiag run (no {MANIFEST_NAME} or {PENDING_NAME})"
    foreign = foreign_run_entries(path)
    if foreign:
        return f"it holds files rcdiag did not write ({shown(foreign)})"
    return None


def _pending_ok(file: Path) -> bool:
    try:
        data = read_json(file, "pending file", MAX_MANIFEST_BYTES)
    except InputError:
        return False
    return isinstance(data, dict) and "spec" in data and isinstance(data.get("started"), str)


def check_replaceable_run(path: Path, option: str = "--out") -> None:
    """RunDirError unless `path` is absent, empty, or an rcdiag run holding only rcdiag's files (see
    replaceable_run): the test every `--overwrite` passes before anything is removed."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        raise RunDirError(f"{path}: exists and is not a directory; choose another {option}")
    problem = replaceable_run(path)
    if problem is not None:
        raise RunDirError(f"{path}: {problem}; rcdiag replaces only its own runs, so nothing was removed — move "
                          f"those files out, or choose another {option}")


# --------------------------------------------------------------------------------------------- the resume rules
WriteMode = Literal["new", "resume", "replace"]


def write_mode(path: Path, *, overwrite: bool, spec: dict[str, Any] | None = None,
               option: str = "--out") -> WriteMode:
    """What a writer may do with the run directory `path` — the one place of the resume and overwrite rules,
    for `rcdiag score`'s writer (RunWriter) and `rcdiag import`:

    - "new": `path` is absent or empty;
    - "resume": `path` is an rcdiag run (complete or interrupted) recorded with the same `spec` (score's restart
      after an interruption keeps its complete shards; `spec=None`: the writer cannot resume — import — and an
      existing run is refused unless `overwrite`);
    - "replace": `path` is an rcdiag run holding only rcdiag's files and `overwrite` is set.

    Anything else is a RunDirError saying why and the fix, before anything is changed: an output inside a run's
    data, a file, a directory that is not one of rcdiag's runs or holds files rcdiag did not write (whatever
    `overwrite` says), a run made with other settings (without `overwrite`)."""
    check_outside_runs(path, option)
    if os.path.lexists(path) and (path.is_symlink() or not path.is_dir()):
        raise RunDirError(f"{path}: exists and is not a directory; choose another {option}")
    if not path.exists() or not any(path.iterdir()):
        return "new"
    problem = replaceable_run(path)
    if problem is not None:
        if spec is not None:  # a writer in place: score's resume or --overwrite may touch only rcdiag's own runs
            raise RunDirError(f"{path}: {problem}; rcdiag writes a run only into a new or empty directory or one "
                              f"of its own runs, so nothing was changed — choose another {option}")
        if overwrite:
            check_replaceable_run(path, option)
        raise RunDirError(f"{path}: already exists and is not empty ({problem}); choose another {option}")
    if overwrite:
        return "replace"
    if spec is None:
        raise RunDirError(f"{path}: already exists and holds a run; pass --overwrite to replace it, or choose "
                          f"another {option}")
    previous, wanted = recorded_spec(path), json.loads(json.dumps(spec, default=str))
    if previous != wanted:
        raise RunDirError(f"{path}: already holds a run made with different settings "
                          f"({spec_difference(previous, wanted)}); pass --overwrite to replace it, or choose "
                          f"another {option}")
    return "resume"


def recorded_spec(path: Path) -> Any:
    """The spec the run at `path` was written with: its pending file's (an interrupted run), else its manifest's;
    None when neither records one."""
    for name, what in ((PENDING_NAME, "pending file"), (MANIFEST_NAME, "manifest")):
        file = path / name
        if file.exists():
            try:
                data = read_json(file, what, MAX_MANIFEST_BYTES)
            except InputError:
                return None
            return data.get("spec") if isinstance(data, dict) else None
    return None


def spec_difference(old: Any, new: dict[str, Any]) -> str:
    """The first settings that differ between a recorded spec and the wanted one, in words."""
    if not isinstance(old, dict):
        return "unknown previous settings"
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} → {new.get(k)!r}" for k in keys[:4]) or "unknown"
