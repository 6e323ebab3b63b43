"""Checkpoints made here from the sample model A (sample_data/tiny-model, bf16 weights):

- B: A after three AdamW steps (lr 1e-3) on the LM loss of a few sample prompts, on CPU, saved in float32 — a
  real update, the next policy version;
- B_sub: A plus a perturbation below half of bf16's ulp at every weight (|δ| = ulp/4), saved in float32 — an fp32
  trainer's update too small for a bf16 engine: loaded in bf16 it *is* A, bit for bit (martingale's finding).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rcdiag.score.sample import SAMPLE_MODEL, SAMPLE_PROMPTS


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                 "chat_template.jinja"):
        if (src / name).is_file():
            (dst / name).write_bytes((src / name).read_bytes())


def prompt_ids(tokenizer, count: int = 8) -> list[list[int]]:
    import json

    rows = [json.loads(line) for line in Path(SAMPLE_PROMPTS).read_text().splitlines()[:count]]
    return [tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=True,
                                          return_dict=False) for r in rows]


def make_b(path: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(SAMPLE_MODEL)
    model = AutoModelForCausalLM.from_pretrained(SAMPLE_MODEL, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = [torch.tensor([ids]) for ids in prompt_ids(tokenizer, 4)]
    for _ in range(3):
        for ids in batch:
            model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(path, safe_serialization=True)
    _copy_tokenizer(Path(SAMPLE_MODEL), path)
    return path


def make_sub_ulp(path: Path) -> Path:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(SAMPLE_MODEL, dtype=torch.float32)
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for p in model.parameters():
            original = p.detach().clone()
            w = original.numpy()
            exponent = np.floor(np.log2(np.abs(w), where=w != 0, out=np.zeros_like(w)))
            ulp = np.where(w != 0, np.exp2(exponent - 7), 0.0)  # bf16: 8 significant bits
            p.add_(torch.from_numpy((ulp / 4 * rng.choice([-1.0, 1.0], w.shape)).astype(np.float32)))
            assert torch.equal(p.to(torch.bfloat16), original.to(torch.bfloat16))  # bf16 cannot see the update
            assert not torch.equal(p, original) or not original.any()  # float32 can
    model.save_pretrained(path, safe_serialization=True)
    _copy_tokenizer(Path(SAMPLE_MODEL), path)
    return path


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {"A": Path(SAMPLE_MODEL), "B": make_b(root / "B"), "B_sub": make_sub_ulp(root / "B_sub")}
