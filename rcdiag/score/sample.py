"""The shipped sample task (sample_data/): final-answer extraction and the 0/1 reward for its responses.

A response is well-formed when it has a line ``Answer: <number>``; when several such lines exist the **last**
one wins (a model that revises itself is judged on its final word). Numbers may carry a sign (``-``, ``+``, or
the Unicode minus ``−``), thousands commas (``1,234``), a decimal part (``42.0`` equals ``42``), and trailing
text (``Answer: 42 apples.``). Markdown around the label (``**Answer:** 42``) and chat special tokens left in the
text (``<|im_end|>``) are ignored. A response without an answer line earns 0.0; no other number in the text is
taken as a fallback, because the format is part of the task.

    >>> reward("3 + 4 = 7.\\nAnswer: 7<|im_end|>", "7")
    1.0
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

# `**Answer:** -1,234.5 apples` → "-1,234.5"; the label must start a line (after optional markdown marks).
_ANSWER_LINE = re.compile(
    r"^[ \t*#>_`]*answer[ \t*_`]*[:：][ \t*_`$]*(?P<num>[-+−]?[ \t]*\d[\d,]*(?:\.\d+)?)",
    re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"^[ \t]*(?P<num>[-+−]?[ \t]*\d[\d,]*(?:\.\d+)?)[ \t]*$")
_SPECIAL = re.compile(r"<\|[a-z_]+\|>")

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "sample_data"
SAMPLE_MODEL = SAMPLE_DIR / "tiny-model"
SAMPLE_MOE = SAMPLE_DIR / "tiny-moe"
"""The mixture-of-experts sample (Qwen3-MoE, 8 experts, top-2; sample_data/build_moe_model.py)."""
SAMPLE_PROMPTS = SAMPLE_DIR / "prompts.jsonl"


def parse_number(text: str) -> Decimal | None:
    """Decimal value of a number string like ``-1,234``, ``+7``, ``−3``, ``42.50``; None if it is not one.

    Commas are accepted only as thousands separators (``1,234,567``); ``1,23`` is not a number.
    """
    match = re.fullmatch(r"([-+]?)[ \t]*((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)", text.strip().replace("−", "-"))
    if match is None:
        return None
    raw = match.group(1) + match.group(2)
    try:
        return Decimal(raw.replace(",", ""))
    except InvalidOperation:  # pragma: no cover - the pattern above admits only valid decimals
        return None


def extract_answer(response: str) -> Decimal | None:
    """The value on the last well-formed ``Answer:`` line of `response`, or None when there is none.

    An ``Answer:`` line whose number is malformed (``Answer: 1,23``) does not count; an earlier valid line
    then wins. Empty input gives None.
    """
    text = _SPECIAL.sub("\n", response)
    for match in reversed(list(_ANSWER_LINE.finditer(text))):
        num = match.group("num").rstrip(",")
        value = parse_number(num)
        if value is not None:
            return value
    return None


def is_well_formed(response: str) -> bool:
    """True when `response` has an ``Answer: <number>`` line that `extract_answer` can read."""
    return extract_answer(response) is not None


def reward(response: str, answer: str | int | float) -> float:
    """1.0 when the final ``Answer:`` value of `response` equals `answer` numerically, else 0.0.

    `answer` is the reference (``"42"``, ``"-7"``, ``"1,234"``, or an int). A reference that is not a number is
    compared as text with the text after the last ``Answer:`` label, case- and whitespace-insensitively.
    """
    gold = parse_number(str(answer))
    if gold is None:
        return 1.0 if _answer_text(response) == _norm(str(answer)) else 0.0
    got = extract_answer(response)
    return 1.0 if got is not None and got == gold else 0.0


def _norm(text: str) -> str:
    """Casefolded text with whitespace collapsed and a trailing period dropped."""
    return " ".join(text.split()).casefold().rstrip(".")


def _answer_text(response: str) -> str | None:
    """Normalised text after the last ``Answer:`` label, for non-numeric references."""
    text = _SPECIAL.sub("\n", response)
    hits = re.findall(r"^[ \t*#>_`]*answer[ \t*_`]*[:：](.*)$", text, re.IGNORECASE | re.MULTILINE)
    return _norm(hits[-1].strip(" \t*_`")) if hits else None
