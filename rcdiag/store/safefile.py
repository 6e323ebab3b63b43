"""Reading files rcdiag did not write — a run's manifest, a probe summary, a dump, a tokenizer, JSON lines — without
hanging, without reading what is not there, and with JSON's own traps turned into errors that name the place.

Why each rule:

- a FIFO blocks whoever opens it until a writer comes (forever, for a planted one), `/dev/zero` never ends, a
  directory fails deep inside a reader with a traceback: a file is opened with O_NONBLOCK (opening a FIFO then
  returns at once) and checked with `fstat` on the open descriptor — no window for a rename between the check
  and the read — before one byte is read; every whole-file read has a size bound;
- Python's `json` raises ValueError for an integer of more than 4,300 digits and RecursionError past ~1,000
  levels of nesting, and accepts lone surrogates (`"\\ud800"`) that no UTF-8 writer can store later (the import
  or report then failed at write time without saying where the text came from): each is an InputError naming
  the file, the row and, for a surrogate, the field.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from rcdiag.errors import InputError

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
"""A JSON escape of a UTF-16 surrogate: the only way a lone surrogate gets into json.loads's output (UTF-8 bytes
cannot encode one), so text without it needs no walk."""
MAX_ROW_BYTES = 256 << 20
"""Longest JSON line read (a row of a 128k-token response with log-probs is a few MB): a stream without line
breaks fails plainly instead of filling memory."""


def open_regular(path: str | os.PathLike, what: str, *, max_bytes: int | None = None,
                 pipes: bool = False) -> BinaryIO:
    """`path` opened for binary reading, refused (InputError naming it) unless it is a regular file of at most
    `max_bytes` — or, with `pipes`, a pipe or FIFO (`rcdiag import jsonl <(zcat x.jsonl.gz)`), which a FIFO
    without a writer reads as empty instead of blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"cannot read the {what} ({exc.strerror})", file=str(path)) from None
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) or pipes and stat.S_ISFIFO(info.st_mode)):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) else \
                "a device or socket"
            raise InputError(f"is {kind}, not a regular file; a {what} is a file", file=str(path))
        if max_bytes is not None and stat.S_ISREG(info.st_mode) and info.st_size > max_bytes:
            raise InputError(f"is {info.st_size:,} bytes, more than the {max_bytes >> 20:,} MiB rcdiag reads as a "
                             f"{what}", file=str(path), hint=f"is it a {what}?")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes` (open_regular's rules)."""
    with open_regular(path, what, max_bytes=max_bytes) as handle:
        return handle.read(max_bytes + 1)


def loads(text: str | bytes, file: str, row: int | None = None) -> Any:
    """json.loads, every way it fails (or lets a lone surrogate through) an InputError naming `file` and `row`."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        value = json.loads(text)
    except UnicodeDecodeError as exc:
        raise InputError(f"is not UTF-8 text (byte {exc.start + 1} is {text[exc.start:exc.start + 1]!r})",
                         file=file, row=row, hint="JSON is UTF-8: convert the file (iconv -t UTF-8)") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})" if row is None else
                         f"invalid JSON ({exc.msg} at column {exc.colno})", file=file, row=row) from None
    except RecursionError:
        raise InputError("unreadable JSON: nested deeper than rcdiag reads (thousands of levels of [ or {)",
                         file=file, row=row) from None
    except ValueError:  # int('9' * 5000): Python refuses integers of more than 4300 digits
        raise InputError(f"unreadable JSON: an integer of more than {sys.get_int_max_str_digits()} digits, which no "
                         "real value has", file=file, row=row) from None
    if _SURROGATE_ESCAPE.search(text):
        found = lone_surrogate(value)
        if found is not None:
            field, char = found
            raise InputError(f"the text holds a lone surrogate {ascii(char)} (half of a UTF-16 pair, which UTF-8 "
                             "cannot store)", file=file, row=row, field=field,
                             hint="fix the text in the input: it was cut in the middle of a character, or "
                                  "escaped by a broken writer")
    return value


def lone_surrogate(value: Any) -> tuple[str, str] | None:
    """(field path, the character) of the first string — key or value — holding a lone surrogate, else None.
    Iterative: the value may be as deep as json allows."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            bad = _bad_char(item)
            if bad is not None:
                return path or "(the value)", bad
        elif isinstance(item, dict):
            for key, sub in reversed(list(item.items())):
                bad = _bad_char(key)
                name = f"{path}.{ascii(key)[1:-1]}" if path else ascii(key)[1:-1]
                if bad is not None:
                    return name, bad
                stack.append((name, sub))
        elif isinstance(item, list):
            stack += [(f"{path}[{i}]", sub) for i, sub in reversed(list(enumerate(item)))]
    return None


def _bad_char(text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


def read_json(path: str | os.PathLike, what: str, max_bytes: int) -> Any:
    """A JSON file (a manifest, a probe summary, a meta.json) parsed under open_regular's and loads' rules."""
    return loads(read_bounded(path, what, max_bytes), str(path))


def json_lines(file: Path, what: str = "JSON-lines file") -> Iterator[tuple[int, Any]]:
    """(line number from 1, value) for each non-blank line of a JSON-lines file or pipe, each line at most
    MAX_ROW_BYTES; InputError naming the file and the line for anything unreadable."""
    with open_regular(file, what, pipes=True) as handle:
        for i, raw in enumerate(iter(lambda: handle.readline(MAX_ROW_BYTES + 1), b""), 1):
            if len(raw) > MAX_ROW_BYTES:
                raise InputError(f"line longer than {MAX_ROW_BYTES >> 20} MiB: not one JSON row", file=str(file),
                                 row=i, hint="is it a JSON-lines file (one object per line)?")
            if raw.strip():
                yield i, loads(raw, str(file), i)
