"""A per-run cache of the report's pass results (scan + library accumulators), shared by report, dashboard, notebook.

The passes are the only cost that grows with the run; everything after them (bootstrap, tables, plots) works on
O(#sequences) state. `cached_passes(run, options)` returns what `run_passes` would, from disk when a previous
call computed it for the same bytes and options.

Never stale: the key hashes, for every file of the run (manifest, token and sequence shards), its path, size,
inode, mtime_ns and ctime_ns and the last 64 KiB (the Parquet footer: row-group offsets and column statistics),
the options the passes use, and a fingerprint of rcdiag's own analysis/report/checks/store sources (so an upgraded
or edited rcdiag recomputes). The run is re-stat'ed after the pass and nothing is stored if it changed meanwhile.
The cache lives outside the run — $RCDIAG_CACHE_DIR, else $XDG_CACHE_HOME/rcdiag, else ~/.cache/rcdiag — so a
read-only run directory works; an unwritable cache directory, or RCDIAG_CACHE_DIR=off, means no cache (the
passes then simply run). Entries are pickles written atomically (temporary name, then rename); the oldest are
removed beyond MAX_ENTRIES. Pickles execute code when loaded, so an entry is read only when it and its directory
belong to the current user and nobody else may write them (the directory is created with mode 0700); anything
else is ignored and recomputed — the cache never becomes a way to run someone else's code.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process lock
    fcntl = None

from rcdiag.report.options import ReportOptions
from rcdiag.report.passes import run_passes
from rcdiag.store.files import MANIFEST_NAME
from rcdiag.store.run import Run

CACHE_ENV = "RCDIAG_CACHE_DIR"
"""Where the cache lives; "off" (or "0", "none") disables it."""
FORMAT = 1
"""Bumped when the cached objects change shape."""
MAX_ENTRIES = 64
STALE_SECONDS = 3600
"""A lock or temporary file this old without its entry is left over (a killed writer, a run that changed)."""
TAIL_BYTES = 1 << 16
PASS_OPTIONS = ("convention", "threshold", "lower", "thresholds")
"""The ReportOptions fields the passes depend on (bootstrap settings are applied after the cache)."""
_SOURCES = ("analysis", "checks", "report", "store")


def cache_dir() -> Path | None:
    """The cache directory (not created), or None when disabled."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "off", "0", "none") else Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rcdiag"


def _file_identity(path: Path) -> list[Any]:
    st = path.stat()
    with path.open("rb") as handle:
        handle.seek(max(0, st.st_size - TAIL_BYTES))
        tail = hashlib.sha256(handle.read()).hexdigest()
    return [str(path.resolve()), st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, tail]


def run_identity(run: Run) -> list[Any]:
    """The identity of every file the passes read (manifest, token and sequence shards), in a fixed order."""
    files = [Path(run.path) / MANIFEST_NAME, *run.token_files, *run.sequence_files]
    return [_file_identity(f) for f in files if f.exists()]


@cache
def _code_fingerprint() -> str:
    """Hash of the sizes and mtimes of the modules that compute the passes (computed once per process)."""
    root = Path(__file__).resolve().parents[1]
    items = sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                   for sub in _SOURCES for p in (root / sub).rglob("*.py"))
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def cache_key(run: Run, options: Any) -> str:
    """The key of (run bytes, pass options, rcdiag code); changes whenever any of them does."""
    parts = {"format": FORMAT, "code": _code_fingerprint(), "files": run_identity(run),
             "options": {name: getattr(options, name) for name in PASS_OPTIONS}}
    return hashlib.sha256(json.dumps(parts, default=repr).encode()).hexdigest()


def cache_path(run: Run, options: Any) -> Path | None:
    """Where the entry of (run, options) is or would be; None when the cache is disabled."""
    directory = cache_dir()
    return None if directory is None else directory / "passes" / f"{cache_key(run, options)}.pkl"


def is_cached(run: Run, options: Any) -> bool:
    """Whether `cached_passes(run, options)` would be a file read (e.g. to say "first load computes")."""
    path = cache_path(run, options)
    return path is not None and path.is_file()


def trusted(path: Path) -> bool:
    """Whether `path` and its directory are owned by this user and writable by nobody else (POSIX); only such
    entries are unpickled."""
    try:
        for item in (path, path.parent):
            st = item.stat()
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                return False
    except OSError:
        return False
    return True


def load(run: Run, options: Any) -> tuple[Any, Any] | None:
    """The cached (scan, library) of (run, options), or None (absent, disabled, unreadable or not trusted)."""
    return _load(cache_path(run, options))


def _load(path: Path | None) -> tuple[Any, Any] | None:
    if path is None or not path.is_file() or not trusted(path):
        return None
    try:
        with path.open("rb") as handle:
            return pickle.load(handle)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
        return None  # a truncated or foreign file: recompute (and overwrite it)


def store(run: Run, options: Any, key: str, result: tuple[Any, Any]) -> Path | None:
    """Write `result` under `key` if the run still has that key (it was not rewritten during the pass); returns
    the file, or None when not stored (disabled, unwritable, or the run changed)."""
    directory = cache_dir()
    if directory is None or cache_key(run, options) != key:
        return None
    target = directory / "passes" / f"{key}.pkl"
    tmp = target.with_name(f".{key}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tmp.open("wb") as handle:
            pickle.dump(result, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, target)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return None
    _prune(target.parent)
    return target


def _prune(directory: Path) -> None:
    """Keep the MAX_ENTRIES newest entries; drop what a computation left behind: the lock file of a key whose
    entry is gone and that nobody holds, a temporary file of a writer killed before its rename (both once
    older than STALE_SECONDS)."""
    try:
        entries = sorted(directory.glob("*.pkl"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-MAX_ENTRIES]:
            old.unlink(missing_ok=True)
        horizon = time.time() - STALE_SECONDS
        for tmp in directory.glob(".*.tmp"):
            if tmp.stat().st_mtime < horizon:
                tmp.unlink(missing_ok=True)
        for lock in directory.glob(".*.lock"):
            if lock.stat().st_mtime < horizon and not (directory / f"{lock.name[1:-5]}.pkl").exists():
                _unlink_unheld(lock)
    except OSError:
        pass


def open_lock(lock: Path) -> int | None:
    """A file descriptor on the lock file `lock`, never through a symlink (O_NOFOLLOW: a lock planted as a link to
    another file must not make rcdiag create or open that file); None when it cannot be opened so."""
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError:
        return None


def _unlink_unheld(lock: Path) -> None:
    """Remove a lock file unless a computation holds it (then it stays until a later prune); a symlink planted
    there is removed, never followed."""
    if fcntl is None:
        return
    if lock.is_symlink():
        lock.unlink(missing_ok=True)
        return
    fd = open_lock(lock)
    if fd is None:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return
        lock.unlink(missing_ok=True)
    finally:
        os.close(fd)


def cached_passes(run: Run, options: Any, map_files: Any = None) -> tuple[Any, Any]:
    """`rcdiag.report.passes.run_passes(run, options, map_files)`, served from the cache when the run's bytes,
    the pass options and rcdiag's code are unchanged since it was stored. Computing an entry holds a lock on its
    key, so processes and threads that want the same entry at once (the dashboard's start-up pass and its first
    page, a report and a notebook) compute it once: the others wait and read it."""
    directory = cache_dir()
    key = cache_key(run, options) if directory is not None else ""  # hashes every file's tail: once per call
    entry = directory / "passes" / f"{key}.pkl" if key else None
    hit = _load(entry)
    if hit is not None:
        return hit
    with _computing(key):
        hit = _load(entry)  # computed by whoever held the lock meanwhile
        if hit is not None:
            return hit
        result = run_passes(run, options, map_files)
        if key:
            store(run, options, key, result)  # re-keys the run: nothing is stored if it changed meanwhile
    return result


@contextmanager
def _computing(key: str) -> Iterator[None]:
    """An exclusive lock (flock) on `key`'s lock file while its entry is computed; no lock without a cache, a
    writable cache directory or POSIX locks (then two callers may both compute, as before)."""
    directory = cache_dir()
    if not key or directory is None or fcntl is None:
        yield
        return
    try:
        (directory / "passes").mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        yield
        return
    fd = open_lock(directory / "passes" / f".{key}.lock")
    if fd is None:  # not a plain file we may open (a planted symlink): compute without the lock
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def prepare(paths: list[str], options: Any = None) -> None:
    """Fill the cache for each run directory in `paths` (the dashboard's start-up: its pages then read the entry
    instead of making the pass). Best effort: a run that cannot be read is left for its page to report."""
    if cache_dir() is None:
        return
    for path in paths:
        try:
            cached_passes(Run(path), options or ReportOptions())
        except Exception:  # noqa: BLE001  (the page shows the run's error; a warm-up never fails the dashboard)
            continue


def clear_cache() -> int:
    """Delete every cached entry; returns how many."""
    directory = cache_dir()
    if directory is None or not (directory / "passes").is_dir():
        return 0
    entries = list((directory / "passes").glob("*.pkl"))
    for entry in entries:
        entry.unlink(missing_ok=True)
    return len(entries)


def main(argv: list[str] | None = None) -> None:
    """`python -m rcdiag.report.cache RUN…`: prepare(RUN…) (the dashboard's start-up warm-up process)."""
    import sys

    prepare(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
