"""Replacing an output directory safely, for every command that writes one (`import --out`, `report --out`).

Three rules, because the output path is typed by a user and may hold anything:

- one writer at a time: an exclusive `flock` on a lock file beside the target, taken without waiting, so a second
  writer fails at once with a clear error instead of interleaving renames with the first (which used to end in
  "Directory not empty", a FileNotFoundError or a hidden `.OUT.old-<pid>` left behind);
- the new content is built in a temporary sibling and swapped in by rename (an interrupted write never looks done);
- the caller decides, under the lock, whether what is there is its own (a run, a report) before anything is removed.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from rcdiag.errors import RunDirError


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
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
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
