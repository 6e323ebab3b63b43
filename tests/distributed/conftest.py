"""Fixtures of the Ray tests: one local Ray cluster per test module (2 CPUs), and a model with a tokenizer —
the shipped sample model when present, else a seeded tiny Qwen2 built from config with a byte-level BPE trained
on the sample prompts (research/padding-free-cpu.md §1)."""
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
    """A 2-layer Qwen2 (head_dim 64: vLLM's CPU attention needs it; vocab ≈ 600) with a Qwen2-pipeline BPE tokenizer and a chat template, in float32."""
    import torch
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    texts = [json.loads(line)["messages"][0]["content"] for line in PROMPTS.read_text().splitlines()[:400]]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B",
                                                       special_tokens=[("<|bos|>", tok.token_to_id("<|bos|>"))])
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                     pad_token="<|pad|>", additional_special_tokens=specials[3:],
                                     model_max_length=512)
    hf_tok.chat_template = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    hf_tok.save_pretrained(directory)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(hf_tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
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
