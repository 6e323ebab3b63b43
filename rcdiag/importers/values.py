"""JSON values of a dump checked one by one: token-id lists, per-token number lists, whole numbers and numbers.

JSON (and Python's `json`) lets a dump say things numpy would silently reinterpret: `true`/`false` inside an id list
become 1/0, `5.5` as a step used to vanish, a reward of `"good"` was dropped, `1e300` as a token id overflowed int64
and was printed as -9223372036854775808. Every importer that reads JSON values goes through these functions, which
raise InputError naming the file, row and field, and show the value as it was written.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rcdiag.errors import InputError

MAX_TOKEN_ID = int(np.iinfo(np.int32).max)
"""Token ids are stored as int32 (TOKEN_SCHEMA.token_id, prompt_token_ids)."""

Where = tuple[str, int | None]


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool | np.bool_)


def as_list(value: Any, where: Where, name: str) -> Sequence[Any]:
    """A list-valued field as a Python sequence (a numpy array from Parquet as a list), else InputError."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, list | tuple):
        raise InputError(f"expected a list, got {type(value).__name__}", file=where[0], row=where[1], field=name)
    return value


def token_id_list(value: Any, where: Where, name: str) -> np.ndarray:
    """Token ids as int64: whole numbers in [0, 2³¹) only — never a boolean, a fraction, a missing entry or a
    value past int32 (shown as written: `1e+300`, not its int64 overflow). A negative id is refused later by
    `check_token_ids`, with the padding hint (the usual -100 / -1 markers)."""
    items = as_list(value, where, name)
    flags = [_is_bool(v) for v in items]
    if any(flags):
        i = flags.index(True)
        raise InputError(f"token id {items[i]!r} (item {i + 1} of the list) is a boolean, not a vocabulary id",
                         file=where[0], row=where[1], field=name,
                         hint="export token ids as integers (a mask column belongs in --mask-field)")
    try:
        array = np.asarray([np.nan if v is None else v for v in items], dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        array = None
    if array is None or array.ndim != 1:
        bad = next((v for v in items if not isinstance(v, int | float)), items[0] if items else None)
        raise InputError(f"not a flat list of token ids (item {bad!r})", file=where[0], row=where[1], field=name)
    bad = np.flatnonzero(~np.isfinite(array) | (array != np.round(array)) | (array > MAX_TOKEN_ID))
    if bad.size:
        i = int(bad[0])
        why = "is larger than any vocabulary id (ids are stored as int32)" if np.isfinite(array[i]) and \
            array[i] == np.round(array[i]) else "is not a whole number"
        raise InputError(f"token id {items[i]!r} (item {i + 1} of the list) {why} ({bad.size} such id(s) in this "
                         "row)", file=where[0], row=where[1], field=name,
                         hint="token ids are vocabulary indices: export them as integers")
    return array.astype(np.int64)


def number_list(value: Any, where: Where, name: str) -> np.ndarray:
    """Per-token numbers (log-probs, a 0/1 mask, advantages) as float64; JSON null → NaN (vLLM and prime-rl write
    null for a missing or non-finite value). A boolean is accepted only where every entry is one (a mask)."""
    items = as_list(value, where, name)
    flags = [_is_bool(v) for v in items]
    if any(flags) and not all(flags):
        i = flags.index(True)
        raise InputError(f"item {i + 1} of the list is the boolean {items[i]!r} among numbers", file=where[0],
                         row=where[1], field=name)
    try:
        array = np.asarray([np.nan if v is None else v for v in items], dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        array = None
    if array is None or array.ndim != 1:
        bad = next((v for v in items if v is not None and not isinstance(v, int | float)), items[0])
        raise InputError(f"not a flat list of numbers (item {bad!r})", file=where[0], row=where[1], field=name)
    return array


def whole_number(value: Any, where: Where, name: str, *, bits: int = 64) -> int | None:
    """A step, index or version: an integer, a whole float (5.0) or a digit string, within a signed `bits`-bit
    integer (the column's type: int64, sample_index int32); None stays None. A fraction, a boolean, any other text
    or a value past the column's range (1e300, a 5,000-digit string) is an InputError (they used to be dropped
    silently, or overflow inside Arrow with a traceback)."""
    if value is None:
        return None
    hint = "steps, indices and versions count in whole numbers"
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        text = value.strip()
        if len(text) > 20:
            raise InputError(f"{text[:24]}… ({len(text)} digits) is past any {bits}-bit integer", file=where[0],
                             row=where[1], field=name, hint=hint)
        value = int(text)
    if isinstance(value, int | float | np.integer | np.floating) and not _is_bool(value):
        if not isinstance(value, int | np.integer) and not (math.isfinite(value) and float(value) == round(value)):
            raise InputError(f"{value!r} is not a whole number", file=where[0], row=where[1], field=name, hint=hint)
        whole = int(value)
        if not -(1 << (bits - 1)) <= whole < 1 << (bits - 1):
            raise InputError(f"{_shown(value)} is past any {bits}-bit integer", file=where[0], row=where[1],
                             field=name, hint=hint)
        return whole
    raise InputError(f"{_shown(value)} ({type(value).__name__}) is not a whole number", file=where[0],
                     row=where[1], field=name, hint=hint)


def number(value: Any, where: Where, name: str) -> float | None:
    """A reward or an advantage as float (NaN and ±inf kept as written: JSON's 1e400 reads as inf); None stays
    None. A boolean, text, a list or an integer past float64 (10**400) is an InputError (a non-numeric reward used
    to be dropped silently)."""
    if value is None:
        return None
    if isinstance(value, int | float | np.integer | np.floating) and not _is_bool(value):
        try:
            return float(value)
        except OverflowError:
            raise InputError(f"{_shown(value)} is past any float64", file=where[0], row=where[1], field=name,
                             hint="export it as a number") from None
    raise InputError(f"{_shown(value)} ({type(value).__name__}) is not a number", file=where[0], row=where[1],
                     field=name, hint="export it as a number (a boolean outcome as 1.0 / 0.0)")


def as_text(value: Any) -> str | None:
    """A text column's value: text as it is, None as None, anything else (a number, an object) as its JSON."""
    if value is None or isinstance(value, str):
        return value
    import json

    return json.dumps(value, default=str)


def _shown(value: Any) -> str:
    """A value as written, cut short (a 5,000-digit integer is not printed whole: str() refuses it anyway)."""
    if isinstance(value, int | np.integer) and abs(int(value)) >= 10 ** 40:
        return f"an integer of {int(int(value).bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:40] + "…"
