"""Build rcdiag's mixture-of-experts sample policy: a tiny `Qwen3MoeForCausalLM` (8 experts, top-2) trained on the
dense sample's task with the dense sample's tokenizer.

    python sample_data/build_moe_model.py --out sample_data/tiny-moe            # ~10 min on 2 shared cores
    python sample_data/build_moe_model.py --out /tmp/m --steps 20 --eval-n 16   # smoke run

It exists so that rcdiag's routing analysis (engine vs trainer top-k experts, route replay) runs offline on a model
whose routers were trained, not random: the card measures how peaked they are and how often bf16 flips a choice.
The tokenizer, the held-out prompts (`sample_data/prompts.jsonl`, read, never rewritten) and the training stream are
the dense build's (`build_model.py`: same seeds, same packer, same schedule); seeds are fixed and the loss curve is
printed as it trains. The output folder is written under a temporary name and renamed when complete.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import task  # noqa: E402  (the generator lives next to this script)
from build_model import DEFAULTS as DENSE, Packer, train, write_prompts  # noqa: E402
from model_card import evaluate  # noqa: E402
from moe_card import router_stats, write_moe_card  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULTS = dict(hidden=192, layers=4, heads=4, kv_heads=2, experts=8, top_k=2, moe_intermediate=128, max_pos=1024,
                aux_loss=0.001, steps=400, rows=8, row_len=512, lr=3e-3, warmup=30, min_lr_frac=0.1,
                weight_decay=0.1, seed=0, eval_n=256, router_n=64, threads=1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; every default lives in DEFAULTS (the task's seeds are the dense build's)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE / "tiny-moe")
    p.add_argument("--tokenizer", type=Path, default=HERE / "tiny-model", help="the dense sample model (tokenizer)")
    p.add_argument("--prompts", type=Path, default=HERE / "prompts.jsonl")
    for k, v in DEFAULTS.items():
        p.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v)
    return p.parse_args(argv)


def check_prompts(path: Path, held: list[task.Example]) -> None:
    """The held-out prompts must be the dense build's, so both sample models are measured on the same set."""
    tmp = Path(str(path) + ".check")
    write_prompts(tmp, held)
    same = path.is_file() and tmp.read_bytes() == path.read_bytes()
    tmp.unlink()
    if not same:
        raise SystemExit(f"{path} is not the dense build's held-out set; rebuild it with build_model.py first")


def model_config(a: argparse.Namespace, tok) -> Qwen3MoeConfig:
    """Every layer sparse (decoder_sparse_step 1), renormalised top-k weights (Qwen3-MoE's norm_topk_prob), the
    load-balancing loss in the training loss (output_router_logits), untied embeddings."""
    return Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=a.hidden, intermediate_size=4 * a.moe_intermediate,
        moe_intermediate_size=a.moe_intermediate, num_hidden_layers=a.layers, num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads, head_dim=a.hidden // a.heads, num_experts=a.experts,
        num_experts_per_tok=a.top_k, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        output_router_logits=True, router_aux_loss_coef=a.aux_loss, max_position_embeddings=a.max_pos,
        tie_word_embeddings=False, rope_theta=10000.0, bos_token_id=None, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    t_start = time.time()
    held = task.held_out(DENSE["prompts_seed"], DENSE["n_prompts"])
    check_prompts(a.prompts, held)
    exclude = frozenset(ex.prompt for ex in held)
    tok = AutoTokenizer.from_pretrained(str(a.tokenizer))
    model = Qwen3MoeForCausalLM(model_config(a, tok))
    n_params = sum(p.numel() for p in model.parameters())
    active = n_params - sum(p.numel() for n, p in model.named_parameters() if ".experts." in n) * (
        1 - a.top_k / a.experts)
    print(f"model: {n_params:,} parameters ({active:,.0f} active per token); training {a.steps} steps x {a.rows} x "
          f"{a.row_len} tokens", flush=True)
    packer = Packer(tok.backend_tokenizer, task.stream(DENSE["seed"] + 2, exclude), a.row_len, tok.eos_token_id,
                    tok.pad_token_id)
    t_train = time.time()
    curve, load = train(model, packer, a)
    train_s = time.time() - t_train
    model.config.output_router_logits = False  # inference: no load-balancing loss
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    stats = evaluate(model, tok, held[: a.eval_n], seed=a.seed)
    routers = router_stats(model, tok, held[: a.router_n], a.top_k)
    print("eval:", json.dumps(stats), "\nrouters:", json.dumps(routers), flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_name(a.out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    write_moe_card(tmp / "README.md", args=vars(a), n_params=n_params, active=int(active), vocab=len(tok),
                   curve=curve, stats=stats, routers=routers, train_s=train_s, total_s=time.time() - t_start,
                   load=load)
    shutil.rmtree(a.out, ignore_errors=True)
    tmp.rename(a.out)
    print(f"saved {a.out} in {time.time() - t_start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
