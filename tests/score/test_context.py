"""Context length: the engine side (config.json read without transformers) and the trainer side (a transformers
config) follow one rule, text config first for multimodal models."""
from __future__ import annotations

import json

import pytest

from rcdiag.score.engine import context_from_config, model_context_length
from rcdiag.score.scoring import model_limits


def test_engine_and_trainer_sides_agree(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, max_position_embeddings=777)
    config.save_pretrained(tmp_path)
    assert model_context_length(tmp_path) == model_limits(config)[1] == 777
    assert model_context_length(tmp_path, max_model_len=64) == 64  # --max-model-len wins


@pytest.mark.parametrize(("config", "expected"), [
    ({"max_position_embeddings": 4096}, 4096),
    ({"max_position_embeddings": 1024, "text_config": {"max_position_embeddings": 32768}}, 32768),
    ({"text_config": {"vocab_size": 5}, "max_position_embeddings": 2048}, 2048),
    ({"max_position_embeddings": True}, None), ({"max_position_embeddings": "4096"}, None), ({}, None)])
def test_dict_rule(tmp_path, config, expected):
    assert context_from_config(config) == expected
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_context_length(tmp_path) == expected


def test_object_rule_reads_the_text_config():
    class Text:
        max_position_embeddings = 32768

    class Multimodal:
        max_position_embeddings = 1024

        def get_text_config(self):
            return Text()

    assert context_from_config(Multimodal()) == 32768 == context_from_config(
        {"max_position_embeddings": 1024, "text_config": {"max_position_embeddings": 32768}})
    assert model_context_length("/nonexistent") is None
