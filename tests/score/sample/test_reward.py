"""rcdiag.score.sample.reward / extract_answer on tricky responses, and against an independent reference on random ones."""
from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rcdiag.score.sample import extract_answer, is_well_formed, parse_number, reward

CASES = [
    # (response, answer, expected reward)
    ("Answer: 42", "42", 1.0),
    ("Answer: 42", "43", 0.0),
    ("  \n\tAnswer:   42   \n\n", "42", 1.0),                   # whitespace everywhere
    ("answer:42", "42", 1.0),                                     # case, no space
    ("ANSWER : 42", "42", 1.0),                                   # space before the colon
    ("We add.\n7 + 5 = 12.\nAnswer: 12 apples.", "12", 1.0),      # units and a period after the number
    ("Answer: 12.", "12", 1.0),
    ("Answer: 12, I think", "12", 1.0),                          # a comma after the number is not a separator
    ("Answer: 1,234", "1234", 1.0),                               # thousands commas in the response
    ("Answer: 1234", "1,234", 1.0),                               # ... or in the reference
    ("Answer: 1,234,567", "1234567", 1.0),
    ("Answer: 1,23", "123", 0.0),                                 # a malformed comma group is not a number
    ("Answer: -7", "-7", 1.0),                                    # negative numbers
    ("Answer: -7", "7", 0.0),
    ("Answer: − 7", "-7", 1.0),                                   # Unicode minus, space after the sign
    ("Answer: +7", "7", 1.0),
    ("Answer: 42.0", "42", 1.0),                                  # numeric, not textual, equality
    ("Answer: 42.5", "42", 0.0),
    ("Answer: 042", "42", 1.0),
    ("Answer: 42<|im_end|>", "42", 1.0),                          # special token glued to the number
    ("Answer: 4<|im_end|>2", "42", 0.0),                          # ... and it ends the line
    ("<|im_start|>assistant\nAnswer: 42<|im_end|>\n", "42", 1.0),
    ("**Answer:** 42", "42", 1.0),                                # markdown
    ("### Answer: 42", "42", 1.0),
    ("Answer: $42", "42", 1.0),
    ("Answer: 41\nWait, recount.\nAnswer: 42", "42", 1.0),       # the last Answer line wins
    ("Answer: 41\nWait, recount.\nAnswer: 42", "41", 0.0),
    ("Answer: 42\nAnswer: none", "42", 1.0),                      # ... among the lines that hold a number
    ("The answer is 42.", "42", 0.0),                             # no Answer line: no fallback to other numbers
    ("So 40 + 2 = 42.", "42", 0.0),
    ("", "42", 0.0),
    ("Answer:", "42", 0.0),
    ("The final Answer: 42", "42", 0.0),                          # the label must start a line
    ("Answer: 42", 42, 1.0),                                      # an int reference
    ("Answer: -3", -3, 1.0),
    ("Answer: Paris.", "paris", 1.0),                             # non-numeric references compare as text
    ("Answer:  New   York", "new york", 1.0),
    ("Answer: Paris", "London", 0.0),
    ("no label", "Paris", 0.0),
]


@pytest.mark.parametrize(("response", "answer", "expected"), CASES)
def test_reward_tricky(response: str, answer: str, expected: float) -> None:
    assert reward(response, answer) == expected


def test_extract_answer_values() -> None:
    assert extract_answer("Answer: -1,234.5 kg") == Decimal("-1234.5")
    assert extract_answer("nothing here") is None
    assert extract_answer("") is None
    assert is_well_formed("x\nAnswer: 3") and not is_well_formed("x\nAnswer: three")


@pytest.mark.parametrize("text", ["", "-", "1,23", "12,3456", "1.2.3", "abc", "4 2", ",123", "1_000"])
def test_parse_number_rejects(text: str) -> None:
    assert parse_number(text) is None


def _fmt(n: int, commas: bool, sign_plus: bool) -> str:
    body = f"{abs(n):,}" if commas else str(abs(n))
    return ("-" if n < 0 else "+" if sign_plus else "") + body


@given(n=st.integers(-10**9, 10**9), m=st.integers(-10**9, 10**9), commas=st.booleans(), plus=st.booleans(),
       before=st.sampled_from(["", "Work.\n", "a = 5\n", "Answer: 99999999999\n"]),
       after=st.sampled_from(["", ".", " items", "<|im_end|>", "\nThanks!", "  \n"]),
       lead=st.sampled_from(["", "  ", "**", "\t"]))
def test_reward_matches_integer_reference(n, m, commas, plus, before, after, lead) -> None:
    response = f"{before}{lead}Answer: {_fmt(n, commas, plus)}{after}"
    assert reward(response, str(n)) == 1.0
    assert reward(response, f"{n:,}") == 1.0
    assert reward(response, str(m)) == (1.0 if m == n else 0.0)
    assert extract_answer(response) == n
