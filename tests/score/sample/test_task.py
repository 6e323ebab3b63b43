"""The task generator (sample_data/task.py): every worked step is true arithmetic, and lengths fit 20–200 tokens."""
from __future__ import annotations

import random
import re

import pytest

from rcdiag.score.sample import extract_answer, reward

EQUATION = re.compile(r"(-?\d+(?: [-+×] -?\d+)+) = (-?\d+)")


def _eval(expr: str) -> int:
    """Independent evaluation of a left-to-right chain like '7 + 5 + 1' or '6 × 40' (no operator precedence
    needed: the task never mixes × with + or - in one chain)."""
    parts = expr.split(" ")
    total = int(parts[0])
    for op, num in zip(parts[1::2], parts[2::2], strict=True):
        total = total + int(num) if op == "+" else total - int(num) if op == "-" else total * int(num)
    return total


@pytest.mark.parametrize("kind", ["add", "sub", "mul", "two_step", "temperature"])
def test_every_equation_in_solutions_is_true(task, kind: str) -> None:
    rng = random.Random(kind)
    for _ in range(400):
        ex = task.KINDS[kind](rng)
        equations = EQUATION.findall(ex.response)
        assert equations, ex.response
        for expr, result in equations:
            if " × " in expr and (" + " in expr or " - " in expr):
                pytest.fail(f"mixed operators in {expr!r}")
            assert _eval(expr) == int(result), (expr, result, ex.response)
        assert ex.response.endswith(f"\nAnswer: {ex.answer}")
        assert reward(ex.response, str(ex.answer)) == 1.0
        assert extract_answer(ex.response) == ex.answer


def test_final_answer_matches_the_question(task) -> None:
    """The answer recomputed from the numbers in the prompt, per kind (independent of the worked solution)."""
    rng = random.Random(3)
    for kind, fn in task.KINDS.items():
        for _ in range(200):
            ex = fn(rng)
            nums = [int(n) for n in re.findall(r"-?\d+", ex.prompt)]
            expected = {"add": lambda n: n[0] + n[1], "sub": lambda n: n[0] - n[1], "mul": lambda n: n[0] * n[1],
                        "two_step": lambda n: n[0] + n[1] - n[2], "temperature": lambda n: n[0] - n[1]}[kind]
            assert ex.answer == expected(nums), (kind, ex.prompt)


def test_response_lengths_in_tokens(task, raw_tokenizer) -> None:
    rng = random.Random(11)
    responses = [task.sample(rng).response for _ in range(1000)]
    lengths = [len(e.ids) + 1 for e in raw_tokenizer.encode_batch(responses, add_special_tokens=False)]
    assert 20 <= min(lengths) and max(lengths) <= 200


def test_stream_is_deterministic_and_excludes(task) -> None:
    a = [e.prompt for e, _ in zip(task.stream(5), range(50), strict=False)]
    b = [e.prompt for e, _ in zip(task.stream(5), range(50), strict=False)]
    assert a == b
    banned = frozenset(a[:10])
    c = [e.prompt for e, _ in zip(task.stream(5, banned), range(50), strict=False)]
    assert banned.isdisjoint(c) and c[:40] == a[10:50]
