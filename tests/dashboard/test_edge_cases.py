"""Awkward but legal runs (empty responses, fully masked sequences, missing entropy/ids, hostile token text) and the
token strip's colour scale and escaping."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

import rcdiag
from app import data, tokenstrip, ui
from tests.dashboard.conftest import assert_clean, write_tokenizer


@pytest.fixture(scope="module")
def awkward_run(tmp_path_factory):
    """seq 0: normal; seq 1: empty response (no token rows); seq 2: every token masked; seq 3: entropy and
    token ids missing (null)."""
    rng = np.random.default_rng(11)
    rows = []
    for seq, n in ((0, 12), (2, 5), (3, 7)):
        b = -rng.exponential(1.0, n)
        rows.append(pd.DataFrame({"seq_id": seq, "pos": np.arange(n), "token_id": rng.integers(0, 48, n),
                                  "rollout_logprob": b, "train_logprob": b + rng.normal(0, 0.3, n),
                                  "train_entropy": rng.random(n), "mask": seq != 2}))
    tokens = pd.concat(rows, ignore_index=True)
    tokens["token_id"] = tokens["token_id"].astype("Int32")
    tokens.loc[tokens["seq_id"] == 3, ["train_entropy"]] = np.nan
    tokens.loc[tokens["seq_id"] == 3, "token_id"] = pd.NA
    sequences = pd.DataFrame({"seq_id": [0, 1, 2, 3], "finish_reason": ["stop", "stop", None, "length"],
                              "prompt_text": ["<b>bold</b> prompt", "", "p", "p"], "response_text": ["r", "", "", ""]})
    root = tmp_path_factory.mktemp("awkward")
    return rcdiag.write_run(root / "awkward", tokens, sequences, shard_tokens=10)


def test_awkward_run_every_page(make_app, awkward_run):
    for page in ("overview", "distributions", "simulator", "sequences"):
        app = make_app(awkward_run, page=page)
        assert_clean(app)
    app = make_app(awkward_run)
    assert any("empty sequences: 2" in c.value for c in app.caption)  # seq 1 (no rows) and seq 2 (all masked)


def test_empty_and_masked_sequences_in_the_strip(make_app, awkward_run):
    app = make_app(awkward_run, page="sequences")
    assert app.selectbox(key="seq_select").options[-2:] == ["seq 1", "seq 2"]  # NaN stats sort last
    app.selectbox(key="seq_select").set_value(1).run()
    assert_clean(app)
    assert any("empty response" in h.proto.body for h in app.get("html"))
    app.selectbox(key="seq_select").set_value(2).run()
    strip = next(h.proto.body for h in app.get("html") if "rcdiag-token-strip" in h.proto.body)
    assert len(re.findall(r'class="rcdiag-tok[^"]* off"', strip)) == 5 and "(masked: not in the loss)" in strip
    app.selectbox(key="seq_select").set_value(3).run()
    assert_clean(app)
    strip = next(h.proto.body for h in app.get("html") if "rcdiag-token-strip" in h.proto.body)
    assert strip.count('class="rcdiag-tok') == 7 and "entropy = nan" in strip


def test_all_masked_run_says_so(make_app, tmp_path):
    """No valid token: the metrics are NaN ('n/a' cards), never a healthy-looking zero."""
    tokens = pd.DataFrame({"seq_id": [0, 0], "pos": [0, 1], "rollout_logprob": [-1.0, -2.0],
                           "train_logprob": [-1.1, -2.0], "mask": [False, False]})
    run = rcdiag.write_run(tmp_path / "masked", tokens)
    app = make_app(run)
    assert_clean(app)
    bodies = " ".join(h.proto.body for h in app.get("html"))
    assert ">healthy<" not in bodies and bodies.count(">n/a<") == 9  # 8 cards + the verdict: nothing to judge
    app.switch_page("views/distributions.py").run()
    assert "No valid token" in app.warning[0].value


def test_hostile_token_text_is_escaped():
    row = {"pos": 0, "token_id": 5, "train_logprob": -1.0, "rollout_logprob": -1.5, "train_entropy": 0.2,
           "mask": True}
    out = tokenstrip.strip_html(pd.DataFrame([row]), ['<img src=x onerror="alert(1)">'], 1.0)
    assert "<img" not in out and "&lt;img src=x onerror=" in out
    assert 'title="&#x27;&lt;img' in out


@pytest.mark.parametrize("lr,expected", [(0.0, "rgb(255,255,255)"), (1.0, "rgb(255,0,0)"), (-1.0, "rgb(0,0,255)"),
                                         (5.0, "rgb(255,0,0)"), (0.5, "rgb(255,128,128)"), (-0.25, "rgb(191,191,255)"),
                                         (math.nan, "#d0d0d0"), (math.inf, "#d0d0d0")])
def test_diverging_scale(lr, expected):
    """Red when the trainer gives the token more probability than the engine (ℓ > 0), blue when less; clipped."""
    assert tokenstrip.colour(lr, 1.0) == expected


def test_hover_text_values():
    row = {"pos": 3, "token_id": 9, "train_logprob": -0.5, "rollout_logprob": -1.0, "train_entropy": 1.25,
           "mask": False}
    text = tokenstrip.hover(row, " the")
    assert "ℓ = a − b = 0.5" in text and f"ratio = {math.exp(0.5):.4g}" in text and "masked" in text


def test_tokenizer_found_through_manifest(tmp_path):
    """The library's lookup (rcdiag.tokenizers: tokenizer.path, else the engine model's path) decodes the strip."""
    model = write_tokenizer(tmp_path / "m")
    manifest = {"models": {"engine": {"path": str(model), "revision": "abc"}}, "engine": {"dtype": "bf16"}}
    assert data.decode_tokens(manifest, (3, 47)) == ["w3", "w47"]
    assert data.decode_tokens({"tokenizer": {"path": str(model)}}, (5,)) == ["w5"]
    assert data.decode_tokens({"models": {"engine": {"path": str(tmp_path / "nowhere")}}}, (1,)) is None
    assert data.decode_tokens({}, (1,)) is None


def test_symlink_out_of_cwd_is_refused(tmp_path):
    (tmp_path / "cwd").mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "cwd" / "link").symlink_to(tmp_path / "secret")
    assert not ui.allowed(tmp_path / "cwd" / "link", [], cwd=tmp_path / "cwd")
    assert ui.allowed(tmp_path / "cwd" / "link", [str(tmp_path / "secret")], cwd=tmp_path / "cwd")


@pytest.mark.parametrize("value,text", [(0.0, "0"), (0.08277, "0.08277"), (3.59e-4, "3.590e-04"), (1234.5, "1234"),
                                        (2e6, "2.000e+06"), (math.nan, "—"), (None, "—"), (12345, "12,345"), (-0.5, "-0.5")])
def test_fmt(value, text):
    assert ui.fmt(value) == text
