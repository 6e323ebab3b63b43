"""The shipped tokenizer: round-trip, AutoTokenizer (Qwen2Tokenizer) == raw tokenizers ids, specials, chat template."""
from __future__ import annotations

import json
import random
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

VARIED = [
    "Tom has 17 apples and buys 25 more. How many apples does he have now?",
    "12345 + 67890 = 80235\nAnswer: 80,235",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\n\nmany",
    "Zoë's café — naïve façade; Ångström; ﬁ ligature",
    "e\u0301 (decomposed é) and Å vs A\u030a",                  # NFC changes these
    "日本語のテキスト、中文，한국어 🙂👍🏽 and emoji",
    "Ελληνικά, русский, العربية, עברית",
    "−5 × 3 ÷ 2 ≈ −7.5; 10⁻³; ½",
    "def f(x):\n    return x ** 2  # code\n",
    "<|im_start|> in text is still a special token",
    "",
    " ",
    "0000000001",
    "Answer: -42",
]


def test_vocab_and_specials(auto_tokenizer, raw_tokenizer, model_dir) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    assert 2000 <= raw_tokenizer.get_vocab_size() <= 8192
    assert len(auto_tokenizer) == raw_tokenizer.get_vocab_size() == config["vocab_size"]
    assert type(auto_tokenizer).__name__ == "Qwen2Tokenizer"
    assert auto_tokenizer.eos_token == "<|im_end|>" and auto_tokenizer.pad_token == "<|pad|>"
    assert auto_tokenizer.bos_token is None
    assert auto_tokenizer.eos_token_id == config["eos_token_id"]
    assert auto_tokenizer.pad_token_id != auto_tokenizer.eos_token_id
    for special in ("<|pad|>", "<|im_start|>", "<|im_end|>"):
        assert raw_tokenizer.encode(special, add_special_tokens=False).ids == [raw_tokenizer.token_to_id(special)]
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == auto_tokenizer.eos_token_id


@pytest.mark.parametrize("text", VARIED)
def test_round_trip_varied(raw_tokenizer, auto_tokenizer, text: str) -> None:
    ids = raw_tokenizer.encode(text, add_special_tokens=False).ids
    assert raw_tokenizer.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)
    assert auto_tokenizer(text, add_special_tokens=False)["input_ids"] == ids


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_round_trip_random_unicode(raw_tokenizer, auto_tokenizer, text: str) -> None:
    ids = raw_tokenizer.encode(text, add_special_tokens=False).ids
    assert raw_tokenizer.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)
    assert auto_tokenizer(text, add_special_tokens=False)["input_ids"] == ids


def test_digits_are_single_tokens(raw_tokenizer) -> None:
    """Qwen2's split regex isolates every digit; the arithmetic task relies on it."""
    tokens = raw_tokenizer.encode("In 2026 there were 1234567 of them", add_special_tokens=False).tokens
    digits = [t for t in tokens if any(c.isdigit() for c in t)]
    assert digits == list("20261234567")


def test_auto_equals_raw_on_task_corpus(raw_tokenizer, auto_tokenizer, task, prompts) -> None:
    """Same ids from AutoTokenizer and the raw tokenizer on held-out prompts and generated responses."""
    rng = random.Random(7)
    texts = [p["messages"][0]["content"] for p in prompts[:200]]
    texts += [task.sample(rng).response for _ in range(200)]
    raw_ids = [e.ids for e in raw_tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert auto_tokenizer(texts, add_special_tokens=False)["input_ids"] == raw_ids


def test_chat_template(auto_tokenizer) -> None:
    messages = [{"role": "user", "content": "Tom has 3 pens. How many?"}]
    text = auto_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nTom has 3 pens. How many?<|im_end|>\n<|im_start|>assistant\n"
    full = messages + [{"role": "assistant", "content": "Answer: 3"}]
    assert auto_tokenizer.apply_chat_template(full, tokenize=False) == (
        "<|im_start|>user\nTom has 3 pens. How many?<|im_end|>\n<|im_start|>assistant\nAnswer: 3<|im_end|>\n")
    assert auto_tokenizer.apply_chat_template(messages, tokenize=False) == (
        "<|im_start|>user\nTom has 3 pens. How many?<|im_end|>\n")


def test_chat_template_ids_match_training_prompt(auto_tokenizer, raw_tokenizer) -> None:
    """apply_chat_template ids == the raw tokenizer's ids of the rendered prompt (what the model was trained on)."""
    user = "Ana has 12 apples and buys 30 more at the market. How many apples does she have now?"
    ids = auto_tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                             return_dict=True)["input_ids"]
    rendered = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    assert ids == raw_tokenizer.encode(rendered, add_special_tokens=False).ids
    im_start, im_end = (auto_tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>"))
    assert ids[0] == im_start and ids.count(im_start) == 2 and ids.count(im_end) == 1
