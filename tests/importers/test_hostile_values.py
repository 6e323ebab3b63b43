"""Hostile values in JSON rows are an InputError naming the file, the row and the field (issue #34 item 6) — they
were tracebacks out of Arrow (a step of 1e300, a version past int64, a sample index past int32, a reward of 10**400,
an OpenAI `choices` that is not a list, a `token_id:x` token), or an error that named no file or row (a lone
surrogate, bytes that are not UTF-8) raised only when the run was written."""
from __future__ import annotations

import json

import pytest

from rcdiag.errors import InputError
from rcdiag.importers import ImportOptions, import_run
from tests.fixtures.cli import assert_user_error, run_cli

Q = ImportOptions(quiet=True)
BASE = {"response_ids": [1, 2], "rollout_logprobs": [-0.1, -0.2], "prompt": "p"}
CHOICE = {"index": 0, "token_ids": [1, 2],
          "logprobs": {"content": [{"token": "a", "logprob": -0.1}, {"token": "b", "logprob": -0.2}]}}


ROWS = {  # name: (the JSON line, the field named, words of the message)
    "step_1e300": (json.dumps({**BASE, "step": 1e300}), "step", "past any 64-bit integer"),
    "step_2_70": (json.dumps({**BASE, "step": 2 ** 70}), "step", "past any 64-bit integer"),
    "version_digits": (json.dumps({**BASE, "policy_version": "9" * 25}), "policy_version", "past any 64-bit"),
    "trainer_version_2_63": (json.dumps({**BASE, "trainer_version": 2 ** 63}), "trainer_version", "64-bit"),
    "sample_index_2_40": (json.dumps({**BASE, "sample_index": 2 ** 40}), "sample_index", "past any 32-bit"),
    "reward_10_400": (json.dumps({**BASE, "reward": 10 ** 400}), "reward", "past any float64"),
    "surrogate_prompt": (json.dumps({**BASE, "prompt": "\ud800x"}), "prompt", "lone surrogate"),
    "surrogate_key": (json.dumps({**BASE, "meta": {"\udc00": 1}}), "meta.\\udc00", "lone surrogate"),
    "surrogate_deep": (json.dumps({**BASE, "extra": [{"a": ["ok", "\udfff"]}]}), "extra[0].a[1]", "lone surrogate"),
    "openai_choices_text": (json.dumps({"choices": "x"}), "choices", "expected a list"),
    "openai_choice_number": (json.dumps({"choices": [5]}), "choices[]", "expected a JSON object"),
    "openai_token_id_word": (json.dumps({"choices": [{"index": 0, "logprobs": {"content": [
        {"token": "token_id:x", "logprob": -0.1}]}}]}), "choices.token_ids", "not a flat list of token ids"),
    "openai_prompt_ids_words": (json.dumps({"prompt_token_ids": ["a"], "choices": [CHOICE]}), "prompt_ids",
                                "not a flat list of token ids"),
    "openai_prompt_ids_bools": (json.dumps({"prompt_token_ids": [True], "choices": [CHOICE]}), "prompt_ids",
                                "boolean"),
    "openai_index_fraction": (json.dumps({"choices": [{**CHOICE, "index": 1.5}]}), "sample_index",
                              "not a whole number"),
}


@pytest.mark.parametrize("case", sorted(ROWS))
def test_hostile_value_names_file_row_and_field(tmp_path, case):
    line, field, words = ROWS[case]
    file = tmp_path / "rows.jsonl"
    first = {"choices": [CHOICE]} if case.startswith("openai") else BASE  # the first row sets the row shape
    file.write_text(json.dumps(first) + "\n" + line + "\n")
    with pytest.raises(InputError, match=words) as info:
        import_run("jsonl", file, tmp_path / "run", Q)
    assert (info.value.file, info.value.row, info.value.field) == (str(file), 2, field)
    assert not (tmp_path / "run").exists()


def test_bytes_that_are_not_utf8_name_the_row(tmp_path):
    file = tmp_path / "rows.jsonl"
    file.write_bytes(json.dumps(BASE).encode() + b"\n" + b'{"response_ids": [1], "prompt": "\xff"}\n')
    with pytest.raises(InputError, match="not UTF-8") as info:
        import_run("jsonl", file, tmp_path / "run", Q)
    assert (info.value.file, info.value.row) == (str(file), 2)


def test_infinite_and_text_numbers_are_a_documented_accept(tmp_path):
    """JSON's 1e400 reads as inf and a digit string as its number: kept as written (values.number, whole_number)."""
    file = tmp_path / "rows.jsonl"
    file.write_text('{"response_ids": [1, 2], "rollout_logprobs": [-0.1, -0.2], "reward": 1e400, "step": "3"}\n')
    run, _ = import_run("jsonl", file, tmp_path / "run", Q)
    row = run.sequences().iloc[0]
    assert row["reward"] == float("inf") and row["step"] == 3


def test_cli_says_error_for_an_overflowing_step_and_a_surrogate(tmp_path):
    for i, line in enumerate([ROWS["step_1e300"][0], ROWS["surrogate_prompt"][0]]):
        file = tmp_path / f"rows{i}.jsonl"
        file.write_text(line + "\n")
        result = run_cli(["import", "jsonl", str(file), "--out", str(tmp_path / f"run{i}"), "-q"])
        assert_user_error(result, f"{file} row 1 field")
