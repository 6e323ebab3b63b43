"""Fixtures of the Ray tests: one local Ray cluster per test module (2 CPUs), and a model with a tokenizer —
the shipped sample model when present, else a seeded tiny Qwen2 built from config with a byte-level BPE trained
on the sample prompts (docs/design.md, "Padding-free rescoring")."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.engine import sample_model_dir

ray = pytest.importorskip("ray")
PROMPTS = Path(__file__).resolve().parents[2] / "sample_data" / "prompts.jsonl"


def build_tiny_model(directory: Path) -> Path:
    """A 2-layer Qwen2 (head_dim 64: vLLM's CPU attention needs it) with the sample model's tokenizer recipe
    (sample_data/build_model.build_tokenizer: Qwen2's pipeline, ChatML template) trained on the sample prompts."""
    import sys

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(PROMPTS.parent))
    from build_model import IM_END, PAD, build_tokenizer

    texts = [json.loads(line)["messages"][0]["content"] for line in PROMPTS.read_text().splitlines()[:400]]
    tokenizer = build_tokenizer(texts, 600)
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
                         pad_token_id=tokenizer.convert_tokens_to_ids(PAD))
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharper distributions, as a trained policy has
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sample = sample_model_dir()
    if (sample / "config.json").is_file():
        return sample
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A local 2-CPU Ray cluster for the module, shut down after it."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
