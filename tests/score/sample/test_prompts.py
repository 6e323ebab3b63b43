"""sample_data/prompts.jsonl: well-formed, unique, answers correct, and held out from the training stream."""
from __future__ import annotations

import itertools

from rcdiag.score.sample import parse_number

# build_model.py's seeds (DEFAULTS): prompts from prompts_seed, tokenizer corpus from seed+1, training from seed+2.
PROMPTS_SEED, TRAIN_SEEDS = 1234, (1, 2)


def test_prompts_well_formed(prompts) -> None:
    assert len(prompts) >= 512
    assert len({p["prompt_id"] for p in prompts}) == len(prompts)
    for row in prompts:
        assert set(row) == {"prompt_id", "messages", "answer"}
        assert isinstance(row["prompt_id"], str) and row["prompt_id"]
        (message,) = row["messages"]
        assert message["role"] == "user" and message["content"].strip()
        assert isinstance(row["answer"], str)
        value = parse_number(row["answer"])
        assert value is not None and value == int(value)
    assert len({p["messages"][0]["content"] for p in prompts}) == len(prompts)


def test_prompts_cover_every_kind_and_negative_answers(prompts) -> None:
    texts = [p["messages"][0]["content"] for p in prompts]
    assert any("temperature" in t for t in texts) and any("bags of" in t or "rows with" in t for t in texts)
    assert any(int(p["answer"]) < 0 for p in prompts)
    assert any(int(p["answer"]) >= 100 for p in prompts)


def test_prompts_regenerate_identically(task, prompts) -> None:
    """The file is what the seeded generator produces (so the answers are the generator's exact results)."""
    held = task.held_out(PROMPTS_SEED, len(prompts))
    assert [e.prompt for e in held] == [p["messages"][0]["content"] for p in prompts]
    assert [str(e.answer) for e in held] == [p["answer"] for p in prompts]


def test_held_out_prompts_never_in_training_stream(task, prompts) -> None:
    held = frozenset(p["messages"][0]["content"] for p in prompts)
    for seed in TRAIN_SEEDS:
        drawn = [e.prompt for e in itertools.islice(task.stream(seed, held), 5000)]
        assert held.isdisjoint(drawn)
    # and the exclusion is doing real work: the unfiltered stream does hit held-out prompts
    raw = [e.prompt for e in itertools.islice(task.stream(TRAIN_SEEDS[1]), 20000)]
    assert not held.isdisjoint(raw)
