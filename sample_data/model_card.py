"""Measure the trained sample model on held-out prompts (accuracy, well-formed rate, entropy) and write its card."""
from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from rcdiag.score.sample import is_well_formed, reward


@torch.no_grad()
def generate(model: Qwen2ForCausalLM, tok: PreTrainedTokenizerBase, prompts: list[str], *, sample: bool,
             seed: int, batch: int = 64, max_new: int = 256) -> tuple[list[str], list[float], list[float]]:
    """Responses for `prompts` (greedy or temperature-1 sampling, no top-k/top-p), with, per generated token
    (the <|im_end|> included), the entropy of the full next-token distribution and the chosen token's log-prob."""
    torch.manual_seed(seed)
    texts, ents, lps = [], [], []
    for s in range(0, len(prompts), batch):
        chats = [[{"role": "user", "content": p}] for p in prompts[s:s + batch]]
        enc = tok.apply_chat_template(chats, add_generation_prompt=True, return_dict=True, return_tensors="pt",
                                      padding=True)
        out = model.generate(**enc, max_new_tokens=max_new, do_sample=sample, temperature=1.0 if sample else None,
                             top_k=0 if sample else None, top_p=1.0 if sample else None, output_logits=True,
                             return_dict_in_generate=True)
        new = out.sequences[:, enc["input_ids"].shape[1]:]
        logp = torch.stack(out.logits, 1).float().log_softmax(-1)           # [B, T_new, V]
        ent = -(logp.exp() * logp).sum(-1)
        chosen = logp.gather(-1, new[..., None])[..., 0]
        for b in range(new.shape[0]):
            ids = new[b].tolist()
            n = ids.index(tok.eos_token_id) + 1 if tok.eos_token_id in ids else len(ids)
            texts.append(tok.decode(ids[:n], skip_special_tokens=True))
            ents += ent[b, :n].tolist()
            lps += chosen[b, :n].tolist()
    return texts, ents, lps


def evaluate(model: Qwen2ForCausalLM, tok: PreTrainedTokenizerBase, examples: list, seed: int) -> dict[str, float]:
    """Greedy accuracy / well-formed rate and temperature-1 entropy statistics on `examples`, measured with the
    weights rounded to bf16 (what is shipped) and computed in float32."""
    model.to(torch.bfloat16).to(torch.float32).eval()
    prompts, answers = [e.prompt for e in examples], [str(e.answer) for e in examples]
    greedy, _, _ = generate(model, tok, prompts, sample=False, seed=seed)
    sampled, ents, lps = generate(model, tok, prompts, sample=True, seed=seed)
    n_tok = [len(tok(t, add_special_tokens=False)["input_ids"]) + 1 for t in sampled]
    mean = lambda xs: sum(xs) / max(1, len(xs))  # noqa: E731
    return {
        "n_prompts": len(prompts),
        "greedy_accuracy": mean([reward(t, a) for t, a in zip(greedy, answers, strict=True)]),
        "greedy_well_formed": mean([float(is_well_formed(t)) for t in greedy]),
        "sampled_accuracy": mean([reward(t, a) for t, a in zip(sampled, answers, strict=True)]),
        "sampled_well_formed": mean([float(is_well_formed(t)) for t in sampled]),
        "sampled_tokens": len(ents),
        "mean_entropy": mean(ents),
        "log_vocab": math.log(len(tok)),
        "frac_entropy_below_0.1": mean([float(e < 0.1) for e in ents]),
        "frac_entropy_above_1": mean([float(e > 1.0) for e in ents]),
        "frac_sampled_p_below_0.1": mean([float(lp < math.log(0.1)) for lp in lps]),
        "mean_response_tokens": mean(n_tok),
        "max_response_tokens": max(n_tok, default=0),
    }


def write_card(path: Path, *, args: dict, n_params: int, vocab: int, curve: list[tuple[int, float]],
               stats: dict[str, float], train_s: float, total_s: float, load: float) -> None:
    """The model card README.md: task, training recipe, size, measured numbers, rebuild command."""
    size_mb = sum(f.stat().st_size for f in path.parent.iterdir() if f.is_file()) / 1e6
    tokens = args["steps"] * args["rows"] * args["row_len"]
    shown = curve[:: max(1, len(curve) // 12)]
    loss = ", ".join(f"{s}: {v:.3f}" for s, v in shown + ([curve[-1]] if curve and shown[-1] != curve[-1] else []))
    text = f"""# rcdiag sample model: tiny Qwen2 arithmetic word-problem policy

A {n_params / 1e6:.2f} M-parameter `Qwen2ForCausalLM` trained from scratch by `sample_data/build_model.py` on
synthetic arithmetic word problems (addition, subtraction, one-digit multiplication, two-step, temperatures with
negative results). Responses are 20–200-token worked solutions (column-by-column arithmetic) ending in a line
`Answer: <integer>`; `rcdiag.score.sample.reward(response, answer)` scores them 1.0/0.0. It exists so that rcdiag's
pipeline runs offline on a model whose next-token distributions are peaked with a long tail, like a real policy.

## Files
`config.json`, `model.safetensors` (bf16), `generation_config.json` (eos = `<|im_end|>`), `tokenizer.json`,
`tokenizer_config.json`, `chat_template.jinja`. Total {size_mb:.1f} MB. Loads offline with
`AutoModelForCausalLM` / `AutoTokenizer` (class `Qwen2Tokenizer`) and with `vllm.LLM(dtype="bfloat16")`.

## Tokenizer
Byte-level BPE, vocab {vocab} (`tokenizers`), trained with Qwen2's own pipeline (NFC, Qwen2 split regex — one
digit per token —, `ByteLevel(use_regex=False)`), so `AutoTokenizer`'s rebuilt `Qwen2Tokenizer` gives the same
ids. Specials: `<|pad|>` (pad), `<|im_start|>`, `<|im_end|>` (eos). No BOS. ChatML template:
`<|im_start|>user\\n…<|im_end|>\\n<|im_start|>assistant\\n`.

## Architecture and training
hidden {args['hidden']}, {args['layers']} layers, {args['heads']} heads ({args['kv_heads']} KV heads), MLP
{args['intermediate']}, untied embeddings, max_position_embeddings {args['max_pos']}. Float32 training with
AdamW (β 0.9/0.95, weight decay {args['weight_decay']}, grad clip 1.0), peak lr {args['lr']}, {args['warmup']}
warm-up steps then cosine to {args['min_lr_frac']}× peak; {args['steps']} steps of {args['rows']} packed rows ×
{args['row_len']} tokens ({tokens / 1e6:.1f} M tokens; position ids restart per example; loss on response tokens
only). Seeds fixed (`--seed {args['seed']}`). Training took {train_s / 60:.1f} min ({total_s / 60:.1f} min in all)
with {args['threads']} torch thread(s) on a shared 2-core CPU whose 1-minute load average was {load:.1f} on average
while it trained (other jobs; on free cores it runs several times faster). Saved in bf16.

Loss curve (step: loss): {loss}.

## Measured on {stats['n_prompts']} held-out prompts (`sample_data/prompts.jsonl`, never trained on)
Shipped bf16 weights, computed in float32 with transformers.

| metric | value |
|---|---|
| greedy accuracy (reward = 1) | {stats['greedy_accuracy']:.3f} |
| greedy well-formed rate (has an `Answer:` line) | {stats['greedy_well_formed']:.3f} |
| temperature-1 accuracy | {stats['sampled_accuracy']:.3f} |
| temperature-1 well-formed rate | {stats['sampled_well_formed']:.3f} |
| mean per-token entropy of its own temperature-1 responses | {stats['mean_entropy']:.3f} nats (log vocab = {stats['log_vocab']:.2f}) |
| tokens with entropy < 0.1 / > 1 nat | {stats['frac_entropy_below_0.1']:.3f} / {stats['frac_entropy_above_1']:.3f} |
| sampled tokens with p < 0.1 (the long tail) | {stats['frac_sampled_p_below_0.1']:.4f} |
| response length, mean / max tokens | {stats['mean_response_tokens']:.1f} / {stats['max_response_tokens']} |

## Rebuild
```
python sample_data/build_model.py --out sample_data/tiny-model
```
(rewrites `sample_data/prompts.jsonl` identically; `--help` lists every option).
"""
    path.write_text(text, encoding="utf-8")
