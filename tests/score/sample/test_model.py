"""The shipped model: files, size, bf16 weights, offline AutoModelForCausalLM load, well-formed greedy answers,
and peaked-with-a-long-tail next-token distributions on its own temperature-1 samples."""
from __future__ import annotations

import json
import math
import struct

import pytest
import torch

from rcdiag.score.sample import is_well_formed

pytestmark = pytest.mark.model
N_PROMPTS = 12


def _safetensors_dtypes(path) -> set[str]:
    """Tensor dtypes from a safetensors header (8-byte little-endian length, then JSON), read independently."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def test_files_and_size(model_dir) -> None:
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "README.md"} <= names
    assert sum(p.stat().st_size for p in model_dir.iterdir()) <= 25 * 1024 * 1024
    assert _safetensors_dtypes(model_dir / "model.safetensors") == {"BF16"}
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert "use_cache" in config
    card = (model_dir / "README.md").read_text()
    assert "python sample_data/build_model.py --out sample_data/tiny-model" in card
    assert "greedy accuracy" in card and "mean per-token entropy" in card


def test_parameter_count(hf_model) -> None:
    n = sum(p.numel() for p in hf_model.parameters())
    assert 2_000_000 <= n <= 10_000_000


@pytest.fixture(scope="module")
def greedy(hf_model, auto_tokenizer, prompts) -> list[tuple[str, str]]:
    rows = prompts[:N_PROMPTS]
    chats = [r["messages"] for r in rows]
    enc = auto_tokenizer.apply_chat_template(chats, add_generation_prompt=True, return_dict=True,
                                             return_tensors="pt", padding=True)
    assert auto_tokenizer.padding_side == "left"
    with torch.no_grad():
        out = hf_model.generate(**enc, max_new_tokens=220, do_sample=False)
    texts = auto_tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return list(zip(texts, [r["answer"] for r in rows], strict=True))


def test_greedy_answers_mostly_well_formed(greedy) -> None:
    well_formed = sum(is_well_formed(text) for text, _ in greedy)
    assert well_formed > len(greedy) / 2, greedy


def test_trained_on_held_out_references(hf_model, auto_tokenizer, task) -> None:
    """Teacher-forced NLL of reference solutions to unseen prompts is far below an untrained model's log V."""
    import random

    rng, nll, count = random.Random(99), 0.0, 0
    for _ in range(8):
        ex = task.sample(rng)
        prompt = auto_tokenizer.apply_chat_template([{"role": "user", "content": ex.prompt}],
                                                    add_generation_prompt=True, return_dict=True)["input_ids"]
        target = auto_tokenizer(ex.response, add_special_tokens=False)["input_ids"] + [auto_tokenizer.eos_token_id]
        ids = torch.tensor([prompt + target])
        with torch.no_grad():
            logp = hf_model(ids, use_cache=False).logits[0, len(prompt) - 1:-1].double().log_softmax(-1)
        nll -= logp.gather(-1, torch.tensor(target)[:, None]).sum().item()
        count += len(target)
    assert nll / count < 0.1 * math.log(len(auto_tokenizer))


def test_greedy_stops_at_im_end(hf_model, auto_tokenizer, prompts) -> None:
    enc = auto_tokenizer.apply_chat_template(prompts[0]["messages"], add_generation_prompt=True,
                                             return_dict=True, return_tensors="pt")
    with torch.no_grad():
        out = hf_model.generate(**enc, max_new_tokens=220, do_sample=False)[0, enc["input_ids"].shape[1]:]
    assert out[-1].item() == auto_tokenizer.eos_token_id and 20 <= len(out) <= 200


def test_sampled_entropy_peaked_with_long_tail(hf_model, auto_tokenizer, prompts) -> None:
    """Temperature-1 samples: mean entropy far below log V (peaked), yet a real tail (no one-hot rows)."""
    enc = auto_tokenizer.apply_chat_template([r["messages"] for r in prompts[:6]], add_generation_prompt=True,
                                             return_dict=True, return_tensors="pt", padding=True)
    torch.manual_seed(0)
    with torch.no_grad():
        out = hf_model.generate(**enc, max_new_tokens=220, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                output_logits=True, return_dict_in_generate=True)
    new = out.sequences[:, enc["input_ids"].shape[1]:]
    logp = torch.stack(out.logits, 1).double().log_softmax(-1)               # float64 reference
    eos = auto_tokenizer.eos_token_id
    ents, tails = [], []
    for b in range(new.shape[0]):
        ids = new[b].tolist()
        n = ids.index(eos) + 1 if eos in ids else len(ids)
        p = logp[b, :n].exp()
        ents += (-(p * logp[b, :n]).sum(-1)).tolist()
        tails += (1 - p.max(-1).values).tolist()                           # mass outside the top token
    mean_entropy = sum(ents) / len(ents)
    assert mean_entropy < 0.25 * math.log(len(auto_tokenizer))
    assert max(ents) > 0.5                                                  # some real choices
    assert min(tails) > 1e-9                                                # never an exactly one-hot row
