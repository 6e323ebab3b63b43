"""The report's figures drawn by a helper process while the report's own process reads the tokens.

Drawing the figures is GIL-bound Python in matplotlib (~0.5 s for a run's four, whatever the run's size), and
importing matplotlib and loading its fonts costs another ~0.4 s: on a 2,000-token run that was half the report,
and on a large one it competed with the bootstrap for the GIL (issue #15). A child interpreter imports matplotlib
while the parent imports the rest and runs the passes, then draws what the parent sends, on a core of its own.

The channel is a private pipe between the parent and the child it started: the parent sends the plot functions'
names and arguments (pickled: plain data, numpy arrays, the tails accumulator, the sweep frame) and reads back
only named PNG bytes in a length-prefixed frame, never a pickle. Anything that goes wrong with the child (it
cannot start, dies, answers garbage, or a figure raises) makes the parent draw the same figures itself, with the
same bytes; so does a process with one worker thread, or RCDIAG_FIGURE_PROCESS=0 (checked at every request).
"""
from __future__ import annotations

import atexit
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from rcdiag.analysis.passes.threads import workers

FigureSpec = tuple[str, tuple[Any, ...]]
"""(name of a figure function of rcdiag.report.plots, its positional arguments)."""

ENV_SWITCH = "RCDIAG_FIGURE_PROCESS"
ANSWER_TIMEOUT = 120.0
"""Seconds the parent waits for an answer to begin (a report's figures take ~1 s) before it draws them itself."""
_LENGTH = struct.Struct("<Q")
_OK, _FAILED = b"\x00", b"\x01"


def draw(specs: Mapping[str, FigureSpec]) -> dict[str, bytes]:
    """PNG bytes of every figure, drawn in this process."""
    from rcdiag.report import plots

    return {name: plots.png_bytes(getattr(plots, function)(*args)) for name, (function, args) in specs.items()}


def records(frame: Any) -> Any:
    """A DataFrame as a numpy record array (its columns and boolean rows read as the frame's): what the report
    sends of its sweep, so the child unpickles it without importing pandas (~0.3 s of the child's start, which a
    small run's report waits for; issue #15)."""
    return frame.to_records(index=False)


def _read_exact(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError(f"figure process: expected {size} bytes, got {len(data)}")
    return data


def _write_frame(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_LENGTH.pack(len(payload)))
    stream.write(payload)


def _read_frame(stream: IO[bytes]) -> bytes:
    return _read_exact(stream, _LENGTH.unpack(_read_exact(stream, _LENGTH.size))[0])


def encode(images: Mapping[str, bytes]) -> bytes:
    """Named bytes as one frame body: count, then per image its UTF-8 name and its bytes, each length-prefixed."""
    parts = [_LENGTH.pack(len(images))]
    for name, data in images.items():
        key = name.encode()
        parts += [_LENGTH.pack(len(key)), key, _LENGTH.pack(len(data)), data]
    return b"".join(parts)


def decode(body: bytes) -> dict[str, bytes]:
    """encode's inverse; ValueError on a malformed body."""
    out, at = {}, 0

    def take(size: int) -> bytes:
        nonlocal at
        if at + size > len(body):
            raise ValueError("figure process: truncated answer")
        at += size
        return body[at - size:at]

    for _ in range(_LENGTH.unpack(take(_LENGTH.size))[0]):
        name = take(_LENGTH.unpack(take(_LENGTH.size))[0]).decode()
        out[name] = take(_LENGTH.unpack(take(_LENGTH.size))[0])
    if at != len(body):
        raise ValueError("figure process: trailing bytes in its answer")
    return out


class FigureProcess:
    """One child interpreter (`python -m rcdiag.report.figproc`) answering requests in the order they were sent.
    `request` sends figures and gives a ticket; `answer(ticket)` waits for that request's PNG bytes (reading any
    earlier answer first). Either gives None once the child is unusable, or for a request whose drawing failed."""

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])  # the child imports this very rcdiag
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}
        self.child = subprocess.Popen([sys.executable, "-m", "rcdiag.report.figproc"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.lock = threading.Lock()
        self.sent = self.read = 0
        self.answers: dict[int, dict[str, bytes] | None] = {}
        self.alive = True
        # requests are written by a daemon thread, in order: a request larger than the pipe's buffer would
        # otherwise block the report until the child reads it, forever if the child hangs
        self.outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        threading.Thread(target=self._write_requests, name="rcdiag-figproc-writer", daemon=True).start()

    def request(self, specs: Mapping[str, FigureSpec]) -> int | None:
        with self.lock:
            if not self.alive:
                return None
            try:
                payload = pickle.dumps(dict(specs), protocol=pickle.HIGHEST_PROTOCOL)
            except (pickle.PicklingError, TypeError, AttributeError):
                self._fail()
                return None
            self.outbox.put(payload)
            self.sent += 1
            return self.sent - 1

    def _write_requests(self) -> None:
        while True:
            payload = self.outbox.get()
            try:
                _write_frame(self.child.stdin, payload)
                self.child.stdin.flush()
            except (OSError, ValueError):  # the child is gone (or closed): its answers will not come
                return

    def answer(self, ticket: int) -> dict[str, bytes] | None:
        with self.lock:
            while self.alive and self.read <= ticket:
                try:
                    if not select.select([self.child.stdout], [], [], ANSWER_TIMEOUT)[0]:
                        raise EOFError("figure process: no answer")  # hung: the parent draws instead
                    body = _read_frame(self.child.stdout)
                    self.answers[self.read] = decode(body[1:]) if body[:1] == _OK else None
                except (OSError, EOFError, ValueError, struct.error):
                    self._fail()
                    break
                self.read += 1
            return self.answers.pop(ticket, None)

    def _fail(self) -> None:
        """Stop using the child (every later request is drawn in the parent)."""
        self.alive = False
        self.close()

    def close(self) -> None:
        """Stop the child now: it holds nothing but figures already answered (a usage error that follows a
        prestart must not wait for its imports)."""
        if self.child.poll() is None:
            self.child.kill()  # first: a write blocked on a full pipe holds the pipe's lock until the child goes
        self.child.wait()
        try:
            self.child.stdin.close()
        except (OSError, ValueError):
            pass


_PROCESS: FigureProcess | None = None
_START = threading.Lock()


def enabled() -> bool:
    """A helper process pays only with a second core (threads.workers(): RCDIAG_THREADS=1 means none), can be
    switched off (RCDIAG_FIGURE_PROCESS=0), and needs sys.executable to be a Python interpreter (not so in an
    embedding host such as uWSGI)."""
    interpreter = os.path.basename(sys.executable or "").lower().startswith("python")
    return interpreter and os.environ.get(ENV_SWITCH, "1") != "0" and workers() > 1


def prestart() -> None:
    """Start this process's figure process now, so its imports run beside the caller's work (no-op when it runs,
    is disabled, or cannot start)."""
    global _PROCESS
    with _START:
        if _PROCESS is None and enabled():
            try:
                _PROCESS = FigureProcess()
            except OSError:
                return
            atexit.register(_PROCESS.close)


def submit(specs: Mapping[str, FigureSpec]) -> Callable[[], dict[str, bytes]]:
    """Send the figures to the figure process (started if need be); the returned callable gives their PNG bytes,
    drawn here instead whenever the process is unavailable."""
    prestart()
    process = _PROCESS if enabled() else None  # a switch set after the process started is honoured too
    ticket = None if process is None else process.request(specs)

    def result() -> dict[str, bytes]:
        answer = None if ticket is None else process.answer(ticket)
        return answer if answer is not None and answer.keys() == specs.keys() else draw(specs)

    return result


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """The child's loop: one answer per request until the parent closes the pipe."""
    from rcdiag.report import plots

    # before the first request: matplotlib's imports, its font load, and a first log axis (the mathtext parser
    # of its 10ⁿ tick labels), legend, rotated labels and grid — ~0.13 s, of which the first real request used
    # to wait for ~0.06 (issue #15)
    plots.png_bytes(plots.log_ratio_vs_rollout([{"bucket": "p", "mean_abs": 0.01, "rms": 0.1, "max_abs": 1.0}]))
    while True:
        try:
            request = _read_frame(stdin)
        except EOFError:
            return
        try:
            body = _OK + encode(draw(pickle.loads(request)))  # noqa: S301  (the parent's own request)
        except Exception:  # the parent draws this request itself and meets the error there
            body = _FAILED
        _write_frame(stdout, body)
        stdout.flush()


if __name__ == "__main__":
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print in a library cannot corrupt the answers
    serve(sys.stdin.buffer, answers)
