"""Helpers for the rescoring tests: tiny Qwen2 models built from a config (random weights), runs, float64 references."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from rcdiag.score.packing import unpad_from_batch
from rcdiag.store.writer import write_run

VOCAB = 384
MAX_POSITIONS = 160


def build_model_dir(path: Path, *, vocab_size: int = VOCAB, seed: int = 0, tokenizer: bool = False,
                    hidden_size: int = 64, layers: int = 2, max_positions: int = MAX_POSITIONS) -> Path:
    """Save a random Qwen2ForCausalLM (GQA 4 heads / 2 KV heads) whose lm_head is scaled ×5, so log-probs are
    spread far from −ln V; optionally with a word-level tokenizer of the same size."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(5.0)
    model.save_pretrained(path)
    if tokenizer:
        save_tokenizer(path, [f"w{i}" for i in range(vocab_size)])
    return path


def save_tokenizer(path: Path, words: list[str]) -> None:
    """A word-level fast tokenizer over `words` (id = index), saved next to a model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=words[0]).save_pretrained(path)



def random_pairs(rng: np.random.Generator, n: int, *, vocab: int = VOCAB, prompt=(1, 12), response=(0, 40),
                 ) -> list[tuple[list[int], list[int]]]:
    """n (prompt ids, response ids) pairs with lengths drawn uniformly from the given [low, high) ranges."""
    return [(rng.integers(0, vocab, int(rng.integers(*prompt))).tolist(),
             rng.integers(0, vocab, int(rng.integers(*response))).tolist()) for _ in range(n)]


def make_run(path: Path, pairs: list[tuple[list[int], list[int]]], *, engine: dict | None = None,
             shard_tokens: int = 10**6, manifest: dict | None = None):
    """A run directory holding `pairs` (rollout_logprob −1 everywhere), written through rcdiag.store.run."""
    tokens = [{"seq_id": s, "pos": p, "token_id": t, "rollout_logprob": -1.0}
              for s, (_, response) in enumerate(pairs) for p, t in enumerate(response)]
    columns = ["seq_id", "pos", "token_id", "rollout_logprob"]
    sequences = pd.DataFrame({"seq_id": np.arange(len(pairs)),
                              "prompt_token_ids": [np.asarray(p, dtype=np.int32) for p, _ in pairs]})
    full = {"engine": engine if engine is not None else {}, **(manifest or {})}
    return write_run(path, pd.DataFrame(tokens, columns=columns), sequences, full, shard_tokens=shard_tokens,
                     overwrite=True)


def reference_logprobs(model64, pairs, temperature: float = 1.0) -> list[tuple[np.ndarray, np.ndarray]]:
    """float64, one sequence at a time, full logits: (log p(response token), entropy) per pair."""
    out = []
    for prompt, response in pairs:
        if not response:
            out.append((np.zeros(0), np.zeros(0)))
            continue
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logp = torch.log_softmax(model64(ids).logits[0].double() / temperature, -1)
        rows = logp[len(prompt) - 1: len(prompt) - 1 + len(response)]
        out.append((rows.gather(-1, torch.tensor(response)[:, None])[:, 0].numpy(),
                    (-(rows.exp() * rows).sum(-1)).numpy()))
    return out


def max_diff(scored, reference) -> tuple[float, int]:
    """(largest |Δ| over log-probs and entropies, index of the sequence where it occurs)."""
    worst, where = 0.0, -1
    for i, ((lp, ent), (ref_lp, ref_ent)) in enumerate(zip(scored.per_sequence(), reference, strict=True)):
        if lp.size:
            d = max(np.abs(lp - ref_lp).max(), np.abs(ent - ref_ent).max())
            if d > worst:
                worst, where = float(d), i
    return worst, where


def one_at_a_time(model, pairs, temperature=1.0):
    """float32, batch 1, no mask: what a careful per-sequence loop computes (full logits + log_softmax)."""
    out = []
    for prompt, response in pairs:
        if not response:
            out.append((np.zeros(0, np.float32), np.zeros(0, np.float32)))
            continue
        with torch.no_grad():
            logits = model(torch.tensor([prompt + response[:-1]])).logits[0, len(prompt) - 1:] / temperature
        logp = torch.log_softmax(logits.float(), -1)
        out.append((logp.gather(-1, torch.tensor(response)[:, None])[:, 0].numpy(),
                    (-(logp.exp() * logp).sum(-1)).numpy()))
    return out


def padded_reference(model, pairs, side: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The trainer's way: one padded batch (`side` padding) + 2-D attention mask, full logits, mapped back with
    rcdiag.score.packing.unpad_from_batch. `model` must use a mask-aware attention (sdpa/eager)."""
    seqs = [p + r for p, r in pairs]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        cols = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, cols], mask[i, cols] = torch.tensor(s), 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, position_ids=position_ids).logits
    flat_logits, cu = unpad_from_batch(logits, mask)
    reference = []
    for i, (prompt, response) in enumerate(pairs):
        logp = torch.log_softmax(flat_logits[cu[i]:cu[i + 1]][len(prompt) - 1:-1].float(), -1)
        reference.append((logp.gather(-1, torch.tensor(response)[:, None])[:, 0].numpy(),
                          (-(logp.exp() * logp).sum(-1)).numpy()))
    return reference
