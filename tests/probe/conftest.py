"""A small real run for the probe tests: the sample model (or, while it is not committed, a config-built tiny
Qwen2) and token rows whose rollout log-probs are the float32 trainer's plus seeded noise (trainer-side tests)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rcdiag.store.manifest import new_manifest
from rcdiag.store.run import Run, open_run
from rcdiag.store.writer import write_run
from tests.fixtures.engine import sample_model_dir

TEMPERATURE = 0.8


def tiny_model(directory: Path) -> Path:
    """The sample model when present, else a seeded config-built Qwen2 (float32 safetensors, no tokenizer)."""
    sample = sample_model_dir()
    if (sample / "config.json").is_file():
        return sample
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)  # sharper distributions, as a trained policy has
    model.save_pretrained(directory)
    return directory


def token_frames(vocab: int, n_seq: int = 12, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Random prompts (4–20 tokens) and responses (1–40 tokens); rollout log-probs are placeholders (−1.0),
    filled in by `probe_run` from the trainer."""
    rng = np.random.default_rng(seed)
    seqs, toks = [], []
    for i in range(n_seq):
        prompt = rng.integers(1, vocab, int(rng.integers(4, 21))).tolist()
        response = rng.integers(1, vocab, int(rng.integers(1, 41))).tolist()
        seqs.append({"seq_id": i, "prompt_id": f"p{i}", "sample_index": 0, "prompt_len": len(prompt),
                     "response_len": len(response), "prompt_token_ids": prompt})
        toks += [{"seq_id": i, "pos": t, "token_id": tok, "rollout_logprob": -1.0, "train_logprob": -1.0,
                  "mask": True} for t, tok in enumerate(response)]
    return pd.DataFrame(toks), pd.DataFrame(seqs)


@pytest.fixture(scope="session")
def probe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("probe_model"))


@pytest.fixture(scope="session")
def probe_run(probe_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """12 sequences; rollout = float32 trainer (one at a time) + N(0, 0.05²) noise, so the observed gap is known."""
    from rcdiag.score.scoring import load_config, load_model, model_limits, score_sequences

    vocab, _ = model_limits(load_config(probe_model))
    tokens, sequences = token_frames(vocab)
    model = load_model(probe_model, dtype="float32")
    pairs = [(p, tokens.token_id[tokens.seq_id == i].tolist()) for i, p in enumerate(sequences.prompt_token_ids)]
    exact = score_sequences(model, pairs, temperature=TEMPERATURE).logprobs
    noise = np.random.default_rng(1).normal(0, 0.05, exact.size)
    tokens["train_logprob"] = exact
    tokens["rollout_logprob"] = np.minimum(exact + noise, 0.0).astype(np.float32)
    path = tmp_path_factory.mktemp("probe_runs") / "run"
    manifest = new_manifest("generated", engine={"model": str(probe_model), "temperature": TEMPERATURE,
                                                 "engine_dtype": "float32", "enable_prefix_caching": True})
    write_run(path, tokens, sequences, manifest=manifest)
    return open_run(path)
