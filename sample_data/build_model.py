"""Build rcdiag's sample policy: held-out prompts, a Qwen2-style BPE tokenizer and a tiny trained Qwen2 causal LM.

    python sample_data/build_model.py --out sample_data/tiny-model          # ~10-15 min on 2 free cores (45 min at load ~12)
    python sample_data/build_model.py --out /tmp/m --steps 20 --eval-n 16   # smoke run

Writes `--prompts` (held-out task prompts, never trained on) and `--out` (bf16 safetensors, tokenizer, generation
config, model card with measured accuracy and entropy). Seeds are fixed; the loss curve is printed as it trains.
The output folder is written under a temporary name and renamed when complete.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

sys.path.insert(0, str(Path(__file__).resolve().parent))
import task  # noqa: E402  (the generator lives next to this script)
from model_card import evaluate, write_card  # noqa: E402

PAD, IM_START, IM_END = "<|pad|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
DEFAULTS = dict(vocab_size=2048, hidden=256, layers=4, heads=4, kv_heads=2, intermediate=704, max_pos=1024,
                steps=360, rows=8, row_len=512, lr=3e-3, warmup=30, min_lr_frac=0.1, weight_decay=0.1,
                seed=0, prompts_seed=1234, n_prompts=1024, tok_corpus=20000, eval_n=256, threads=1)


def chat_prompt(user: str) -> str:
    """The chat-template rendering of one user turn plus the assistant header (what the model is prompted with)."""
    return f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n"


def build_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with exactly Qwen2's normalizer and pre-tokenizer, so AutoTokenizer's rebuild matches it."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[PAD, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, unk_token=None,
                                 bos_token=None, additional_special_tokens=[IM_START], model_max_length=1024,
                                 padding_side="left")
    hf.chat_template = CHAT_TEMPLATE
    return hf


def encode_example(tok: Tokenizer, ex: task.Example, im_end: int) -> tuple[list[int], int]:
    """Token ids of prompt + response + <|im_end|>, and the prompt length (the loss covers the rest)."""
    p = tok.encode(chat_prompt(ex.prompt), add_special_tokens=False).ids
    r = tok.encode(ex.response, add_special_tokens=False).ids
    return p + r + [im_end], len(p)


class Packer:
    """Packs examples into rows of `row_len` tokens with position ids restarting per example (padding-free)."""

    def __init__(self, tok: Tokenizer, examples, row_len: int, im_end: int, pad: int) -> None:
        self.tok, self.examples, self.row_len, self.im_end, self.pad = tok, examples, row_len, im_end, pad
        self.pending: tuple[list[int], int] | None = None

    def row(self) -> tuple[list[int], list[int], list[int]]:
        """One row: ids, position ids, labels (-100 on prompts and padding; padding is its own position run)."""
        ids: list[int] = []
        pos: list[int] = []
        lab: list[int] = []
        while True:
            doc = self.pending or encode_example(self.tok, next(self.examples), self.im_end)
            self.pending = None
            seq, n_prompt = doc
            if len(ids) + len(seq) > self.row_len:
                self.pending = doc
                break
            ids += seq
            pos += range(len(seq))
            lab += [-100] * n_prompt + seq[n_prompt:]
        fill = self.row_len - len(ids)
        return ids + [self.pad] * fill, pos + list(range(fill)), lab + [-100] * fill

    def batch(self, rows: int) -> dict[str, torch.Tensor]:
        """A [rows, row_len] batch of input_ids / position_ids / labels (int64)."""
        cols = list(zip(*(self.row() for _ in range(rows)), strict=True))
        return {k: torch.tensor(v) for k, v in zip(("input_ids", "position_ids", "labels"), cols, strict=True)}


def lr_at(step: int, a: argparse.Namespace) -> float:
    """Linear warm-up then cosine decay to `min_lr_frac` × peak."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def train(model: Qwen2ForCausalLM, packer: Packer, a: argparse.Namespace) -> tuple[list[tuple[int, float]], float]:
    """Plain AdamW loop in float32 on packed rows; prints the loss curve and returns it [(step, loss)] with the
    machine's mean 1-minute load average over the run (training time depends on it on shared machines)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": other, "weight_decay": 0}],
                            lr=a.lr, betas=(0.9, 0.95))
    model.train()
    curve, loads, run, t0 = [], [], 0.0, time.time()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        loss = model(**packer.batch(a.rows), use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run = loss.item() if step == 0 else 0.9 * run + 0.1 * loss.item()
        if step % 10 == 0 or step == a.steps - 1:
            curve.append((step, round(loss.item(), 4)))
            loads.append(os.getloadavg()[0])
            print(f"step {step:5d}  loss {loss.item():.4f}  (ema {run:.4f})  lr {lr_at(step, a):.2e}  "
                  f"{time.time() - t0:6.0f}s", flush=True)
    model.eval()
    return curve, sum(loads) / max(1, len(loads))


def write_prompts(path: Path, examples: list[task.Example]) -> None:
    """Held-out prompts as JSON lines {prompt_id, messages, answer}, written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for i, ex in enumerate(examples):
            row = {"prompt_id": f"arith-{i:05d}", "messages": [{"role": "user", "content": ex.prompt}],
                   "answer": str(ex.answer)}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; every default lives in DEFAULTS."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "tiny-model")
    p.add_argument("--prompts", type=Path, default=Path(__file__).resolve().parent / "prompts.jsonl")
    for k, v in DEFAULTS.items():
        p.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    t_start = time.time()
    held = task.held_out(a.prompts_seed, a.n_prompts)
    write_prompts(a.prompts, held)
    exclude = frozenset(ex.prompt for ex in held)
    corpus_stream = task.stream(a.seed + 1, exclude)
    texts = [f"{ex.prompt}\n{ex.response}" for ex, _ in zip(corpus_stream, range(a.tok_corpus), strict=False)]
    hf_tok = build_tokenizer(texts, a.vocab_size)
    raw = hf_tok.backend_tokenizer
    print(f"tokenizer: vocab {len(hf_tok)}; {len(held)} held-out prompts -> {a.prompts}", flush=True)
    cfg = Qwen2Config(vocab_size=len(hf_tok), hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      max_position_embeddings=a.max_pos, tie_word_embeddings=False, rope_theta=10000.0,
                      bos_token_id=None, eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id)
    model = Qwen2ForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters; training {a.steps} steps x {a.rows} x {a.row_len} tokens", flush=True)
    packer = Packer(raw, task.stream(a.seed + 2, exclude), a.row_len, hf_tok.eos_token_id, hf_tok.pad_token_id)
    t_train = time.time()
    curve, load = train(model, packer, a)
    train_s = time.time() - t_train
    model.generation_config = GenerationConfig(eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id)
    stats = evaluate(model, hf_tok, held[: a.eval_n], seed=a.seed)
    print("eval:", json.dumps(stats), flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_name(a.out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp)
    hf_tok.save_pretrained(tmp)
    write_card(tmp / "README.md", args=vars(a), n_params=n_params, vocab=len(hf_tok), curve=curve, stats=stats,
               train_s=train_s, total_s=time.time() - t_start, load=load)
    shutil.rmtree(a.out, ignore_errors=True)
    tmp.rename(a.out)
    print(f"saved {a.out} in {time.time() - t_start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
