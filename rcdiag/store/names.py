"""The one rule that names runs side by side (the comparison report's runs/<name>/ directories, the notebook's
`compare` columns, the dashboard's Compare page): unique, readable and safe as a directory name.

A run directory's name can be anything the file system allows — `..`, `.hidden`, names with spaces or shell
characters — and two runs compared are often both called `run`. The comparison report writes each run under
runs/<name>/, so a name must never climb out of that directory or land on another run's files.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

MAX_NAME = 80
"""Longest name kept (file systems allow 255 bytes; a report's paths add to it)."""
_UNSAFE = re.compile(r"[^\w.+-]+")


def safe_name(name: str) -> str:
    """`name` as one harmless path component: runs of characters other than letters, digits, `_ . + -` become `_`,
    leading dots and dashes go (no `..`, no hidden or option-like names); empty → 'run'."""
    cleaned = _UNSAFE.sub("_", name).lstrip(".-")[:MAX_NAME]
    return cleaned or "run"


def unique_run_names(paths: Sequence[str | os.PathLike], names: Sequence[str] | None = None) -> list[str]:
    """One name per run, in order: `names` (default: each directory's name) made safe (`safe_name`); a name that
    several runs share gets its parent directory's name (`run-exp1`), and a numeric suffix (`run-2`) if that
    still clashes. Unique ignoring case, for case-insensitive file systems."""
    wanted = [safe_name(n) for n in (names if names is not None else [Path(p).name for p in paths])]
    shared = {n.casefold() for n in wanted if sum(w.casefold() == n.casefold() for w in wanted) > 1}
    taken: set[str] = set()
    out = []
    for name, path in zip(wanted, paths, strict=True):
        if name.casefold() in shared:
            parent = Path(os.path.abspath(path)).parent.name
            name = safe_name(f"{name}-{parent}") if parent else name
        candidate, k = name, 1
        while candidate.casefold() in taken:
            k += 1
            candidate = f"{name}-{k}"
        taken.add(candidate.casefold())
        out.append(candidate)
    return out
