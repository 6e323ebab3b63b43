"""The shipped MoE sample model (sample_data/tiny-moe): its files, its architecture, the dense sample's tokenizer,
and a card whose router numbers are what the shipped weights measure."""
from __future__ import annotations

import importlib.util
import json
import re
import struct
import sys

import pytest

from rcdiag.score.sample import SAMPLE_DIR, SAMPLE_MODEL, SAMPLE_MOE

pytestmark = pytest.mark.model


def _header_dtypes(path) -> set[str]:
    """Tensor dtypes from the safetensors header (8-byte length, then JSON), read independently of safetensors."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def _script(name: str):
    """A sample_data script (a folder of scripts, not a package) imported under its own name."""
    sys.path.insert(0, str(SAMPLE_DIR))
    try:
        spec = importlib.util.spec_from_file_location(f"rcdiag_sample_{name}", SAMPLE_DIR / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(SAMPLE_DIR))


def test_files_architecture_and_tokenizer() -> None:
    """Guards a sample that is not what the card says: a few MB of bf16, Qwen3-MoE with 8 experts top-2 in every
    layer, and exactly the dense sample's vocabulary and merges (both samples must tokenize prompts alike)."""
    names = {p.name for p in SAMPLE_MOE.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "README.md"} <= names
    assert sum(p.stat().st_size for p in SAMPLE_MOE.iterdir()) < 12e6
    assert _header_dtypes(SAMPLE_MOE / "model.safetensors") == {"BF16"}
    config = json.loads((SAMPLE_MOE / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert config["num_experts_per_tok"] == 2 and config.get("num_local_experts", config.get("num_experts")) == 8
    assert config["decoder_sparse_step"] == 1 and config["mlp_only_layers"] == []
    moe, dense = (json.loads((d / "tokenizer.json").read_text())["model"] for d in (SAMPLE_MOE, SAMPLE_MODEL))
    assert moe["vocab"] == dense["vocab"] and moe["merges"] == dense["merges"]


def test_card_router_numbers_are_measured() -> None:
    """Guards a stale card: the router table (selected-expert mass, margins, bf16 flips) is re-measured on the
    shipped weights with the card's own procedure and must read the same to the printed digits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    card = (SAMPLE_MOE / "README.md").read_text()
    assert "python sample_data/build_moe_model.py --out sample_data/tiny-moe" in card
    task, build, moe_card = _script("task"), _script("build_moe_model"), _script("moe_card")
    n = int(re.search(r"reference solutions of (\d+) held-out prompts", card).group(1))
    held = task.held_out(build.DENSE["prompts_seed"], build.DENSE["n_prompts"])[:n]
    model = AutoModelForCausalLM.from_pretrained(str(SAMPLE_MOE), dtype=torch.float32).eval()
    stats = moe_card.router_stats(model, AutoTokenizer.from_pretrained(str(SAMPLE_MOE)), held, top_k=2)
    assert f"| {stats['mean_selected_mass']:.3f} (uniform routers: 0.250) |" in card
    assert f"| {stats['median_margin']:.3f} / {stats['p10_margin']:.3f} |" in card
    assert f"| {stats['bf16_exact_rate']:.4f} of (token, layer) pairs |" in card
    assert 0.25 < stats["mean_selected_mass"] < 1 and stats["bf16_exact_rate"] < 1, stats
