"""Data strings as text (#20.2), chat prompts as turns, and the windowed token strip (#20.11)."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

import rcdiag
from app import tokenstrip
from app.text import chat_turns, md, plain
from tests.dashboard.conftest import PAYLOADS, assert_clean

NASTY = ["![x](http://198.51.100.7/pixel)", "<img src=x onerror=alert(1)>", "[a](javascript:alert(1))",
         "**bold** _it_ `code` $x^2$ ~~s~~ | t |", "# heading", "- item", "1. item", ":material/home: :smile:",
         "a\\b", "www.example.com http://example.com", "line\nbreak", "train_logprob ['x']"]


@pytest.mark.parametrize("value", NASTY)
def test_md_leaves_no_markdown_construct(value):
    """Every Markdown-active character is escaped (so nothing renders as a link, image, HTML, emphasis or icon)
    and the reader still sees the original (line breaks as spaces)."""
    shown = md(value)
    assert plain(shown) == value.replace("\n", " ")
    assert not re.search(r"(?<!\\)[\[\]()<>`*_:$~|#!]", shown), shown
    assert "http://" not in shown and "www." not in shown


def test_chat_turns_of_known_templates():
    chatml = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
    assert chat_turns(chatml) == [("system", "Be brief."), ("user", "Hi?"), ("assistant", "")]
    llama = ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert chat_turns(llama) == [("user", "Hi?"), ("assistant", "")]
    assert chat_turns("<start_of_turn>user\nHi?<end_of_turn>\n<start_of_turn>model\n") == [("user", "Hi?"),
                                                                                            ("model", "")]
    assert chat_turns("Plain prompt: 2+2=") is None


def test_sequences_page_shows_payloads_as_text(make_app, heavy_run):
    """prompt_id / finish_reason carrying Markdown reach the caption escaped; the prompt shows as chat turns."""
    app = make_app(heavy_run, page="sequences")
    app.selectbox(key="seq_sort").set_value("seq_id")
    app.toggle(key="seq_desc").set_value(False).run()
    app.selectbox(key="seq_select").set_value(0).run()
    assert_clean(app)
    caption = next(c.value for c in app.caption if "prompt_id" in c.value)
    for payload in PAYLOADS.values():
        assert md(payload) in caption and payload not in caption
    assert "What is 0+0?" in [t.value for t in app.text]
    assert not any("<|im_start|>" in t.value for t in app.text)


def test_long_response_is_windowed(make_app, tmp_path):
    """A 4,000-token response is drawn WINDOW tokens at a time (one spans' worth of HTML per window), the window
    holding the largest |ℓ| first; strip_html refuses more than WINDOW rows."""
    n = 4000
    rng = np.random.default_rng(1)
    rollout = -rng.exponential(1.0, n)
    train = rollout + rng.normal(0, 0.01, n)
    train[3100] = rollout[3100] + 5.0  # the worst token sits in the third window
    tokens = pd.DataFrame({"seq_id": 0, "pos": np.arange(n), "token_id": rng.integers(0, 40, n),
                           "rollout_logprob": rollout, "train_logprob": np.minimum(train, 0.0),
                           "train_entropy": 1.0, "mask": True})
    sequences = pd.DataFrame({"seq_id": [0], "prompt_id": ["p"], "sample_index": [0], "prompt_text": ["q"],
                              "response_text": ["r"], "prompt_len": [1], "response_len": [n], "finish_reason": ["length"],
                              "reward": [0.0]})
    run = rcdiag.write_run(tmp_path / "long", tokens, sequences, manifest={"source": {"type": "manual"}})
    app = make_app(run, page="sequences")
    assert_clean(app)
    strip = next(h.proto.body for h in app.get("html") if "rcdiag-token-strip" in h.proto.body)
    assert strip.count('class="rcdiag-tok') == n - 2 * tokenstrip.WINDOW
    assert 'data-pos="3000"' in strip and 'data-pos="2999"' not in strip
    window = app.selectbox(key="seq_window_0")
    assert len(window.options) == 3 and "largest" in window.options[2]
    window.set_value(0).run()
    strip = next(h.proto.body for h in app.get("html") if "rcdiag-token-strip" in h.proto.body)
    assert 'data-pos="0"' in strip and strip.count('class="rcdiag-tok') == tokenstrip.WINDOW
    assert len(strip.encode()) < 400 * tokenstrip.WINDOW  # bounded whatever the response length
    with pytest.raises(ValueError, match="at most"):
        tokenstrip.strip_html(tokens, None, 1.0)


def test_no_page_script_has_a_bare_string_for_streamlit_to_write():
    """Streamlit's "magic" writes every bare string of a page script onto the page: the Compare page showed its
    COUNT_METRICS docstring above its title. Only the module docstring (which magic skips) may be a bare string."""
    import ast
    from pathlib import Path

    app = Path(__file__).resolve().parents[2] / "app"
    found = []
    for script in [app / "dashboard.py", *sorted((app / "views").glob("*.py"))]:
        body = ast.parse(script.read_text()).body
        found += [f"{script.name}:{node.lineno}" for node in body[1:] if isinstance(node, ast.Expr)
                  and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)]
    assert found == []
