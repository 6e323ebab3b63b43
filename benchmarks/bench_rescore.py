"""Benchmark of padding-free rescoring against the usual ways of computing trainer log-probs, in one run.

Same model (a Qwen2 built from a config, vocab 32k, random weights) and same data (64 sequences, lengths spread
32…1024) for every variant:

  (a) packed      rcdiag.score.scoring.score_sequences: rows ≤ 4096 tokens, sdpa_varlen, chunked LM head
  (a') packed_compiled  the same with the torch.compile'd epilogue (rescore uses it for ≥ 1e9 tokens × vocab)
  (b) padded      one padded batch [64, L_max] + attention mask, logits of every padded position + float32
                  log_softmax (LM head and softmax taken 4 rows at a time so the shared 24 GB machine survives —
                  same FLOPs; the memory of the unsliced version is reported as computed)
  (c) per_seq     one sequence at a time, batch 1, full logits + log_softmax
  (d) sorted      length-sorted padded micro-batches of ≤ 4096 padded tokens, full logits + log_softmax

Timing: the variants run interleaved, `--rounds` times, in one process; the minimum is kept (the machine is shared).
CPU seconds per thread are recorded too: on a contended machine they, not wall time, compare with the matmul rate.
A plain float32 matmul is timed in the same rounds as the achievable GFLOP/s. Peak memory: each variant again in a
fresh subprocess (VmHWM after a reset), and the log-prob step alone vs chunk size.

    .venv/bin/python benchmarks/bench_rescore.py            # ≈ 5 min on 2 cores
    .venv/bin/python benchmarks/bench_rescore.py --rounds 1 --sequences 16   # quick look
    .venv/bin/python benchmarks/bench_rescore.py --real --mix grpo --sequences 8 --min-len 2048 --max-len 8192
        # SmolLM2-135M-Instruct itself (vocab 49,152, 30 layers; rcdiag.score.realmodel), prompts of 64–384
        # tokens and responses of 2–8k: a realistic GRPO length mix
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from rcdiag.score.logprobs import chunked_logprobs, compiled_epilogue, epilogue_inplace
from rcdiag.score.scoring import load_model, score_sequences

BUDGET = 4096
PROMPT = 16


# --------------------------------------------------------------------------------------------------- set-up
def build_model(path: Path, vocab: int) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(5.0)
    model.save_pretrained(path)
    return path


def make_pairs(n: int, low: int, high: int, vocab: int, mix: str = "spread") -> list[tuple[list[int], list[int]]]:
    """`spread`: prompts of PROMPT tokens, sequences evenly spread over [low, high]; `grpo`: prompts of 64–384
    tokens (a chat prompt), responses evenly spread over [low, high] (long reasoning rollouts)."""
    rng = np.random.default_rng(0)
    lengths = np.linspace(low, high, n).astype(int)  # evenly spread, shuffled
    rng.shuffle(lengths)
    if mix == "grpo":
        return [(rng.integers(0, vocab, int(rng.integers(64, 385))).tolist(), rng.integers(0, vocab, int(L)).tolist())
                for L in lengths]
    return [(rng.integers(0, vocab, PROMPT).tolist(), rng.integers(0, vocab, int(L) - PROMPT + 1).tolist())
            for L in lengths]


def rss_reset() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_peak_mb() -> float:
    """Peak resident memory since the last rss_reset (VmHWM)."""
    return _status_mb("VmHWM")


def rss_now_mb() -> float:
    return _status_mb("VmRSS")


# --------------------------------------------------------------------------------------------------- variants
def _full_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What trainers do: float32 log_softmax over the whole logits tensor, gather, entropy."""
    logp = torch.log_softmax(logits.float(), -1)
    return logp.gather(-1, targets[..., None])[..., 0], -(logp.exp() * logp).sum(-1)


def _padded_batch(model, pairs, rows_per_softmax: int | None) -> list[np.ndarray]:
    seqs = [p + r[:-1] for p, r in pairs]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    targets = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, ((p, r), s) in enumerate(zip(pairs, seqs, strict=True)):
        ids[i, :len(s)], mask[i, :len(s)] = torch.tensor(s), 1
        targets[i, len(p) - 1:len(s)] = torch.tensor(r)
    hidden = model.model(ids, attention_mask=mask).last_hidden_state
    step = rows_per_softmax or len(seqs)
    logp = torch.cat([_full_logprobs(model.lm_head(hidden[i:i + step]), targets[i:i + step])[0]
                      for i in range(0, len(seqs), step)])
    return [logp[i, len(p) - 1:len(p) - 1 + len(r)].numpy() for i, (p, r) in enumerate(pairs)]


def variant_packed(models, pairs, epilogue=epilogue_inplace):
    scored = score_sequences(models["varlen"], pairs, token_budget=BUDGET, chunk_tokens=1024, epilogue=epilogue)
    return [lp for lp, _ in scored.per_sequence()]


def variant_packed_compiled(models, pairs):
    return variant_packed(models, pairs, compiled_epilogue())


def variant_padded(models, pairs):
    return _padded_batch(models["sdpa"], pairs, rows_per_softmax=4)


def variant_per_seq(models, pairs):
    out = []
    for p, r in pairs:
        logits = models["sdpa"](torch.tensor([p + r[:-1]])).logits[0, len(p) - 1:]
        out.append(_full_logprobs(logits, torch.tensor(r))[0].numpy())
    return out


def variant_sorted(models, pairs):
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]), reverse=True)
    out: list[np.ndarray | None] = [None] * len(pairs)
    start = 0
    while start < len(order):
        width = len(pairs[order[start]][0]) + len(pairs[order[start]][1]) - 1
        stop = start + max(1, BUDGET // width)
        batch = order[start:stop]
        for i, lp in zip(batch, _padded_batch(models["sdpa"], [pairs[i] for i in batch], None), strict=True):
            out[i] = lp
        start = stop
    return out


VARIANTS: dict[str, Callable] = {"packed": variant_packed, "packed_compiled": variant_packed_compiled,
                                 "padded": variant_padded, "per_seq": variant_per_seq, "sorted": variant_sorted}


def matmul_rate(n: int = 2048) -> tuple[float, float]:
    """(seconds, GFLOP/s) of one float32 n×n @ n×n matmul."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t = time.perf_counter()
    a @ b
    dt = time.perf_counter() - t
    return dt, 2 * n**3 / dt / 1e9


def model_flops(model, pairs) -> float:
    """2·P_body·N_input + causal attention (2·2·L²/2·d per layer) + 2·H·V·N_response."""
    cfg = model.config
    body = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)
    lengths = np.array([len(p) + len(r) - 1 for p, r in pairs], dtype=np.float64)
    attention = 2 * cfg.num_hidden_layers * cfg.hidden_size * (lengths**2).sum()
    responses = sum(len(r) for _, r in pairs)
    return 2 * body * lengths.sum() + attention + 2 * cfg.hidden_size * cfg.vocab_size * responses


# --------------------------------------------------------------------------------------------------- memory probes
def memory_variant(model_dir: Path, name: str, args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    models = {"varlen": load_model(model_dir, attn="sdpa_varlen"), "sdpa": load_model(model_dir, attn="sdpa")}
    pairs = make_pairs(args.sequences, args.min_len, args.max_len, args.vocab, args.mix)
    with torch.inference_mode():
        base = rss_now_mb()
        rss_reset()
        VARIANTS[name](models, pairs)
    return {"variant": name, "base_mb": base, "peak_mb": rss_peak_mb()}


def memory_logprobs(chunk: int, tokens: int, vocab: int) -> dict:
    torch.set_num_threads(2)
    head = torch.nn.Linear(256, vocab, bias=False)
    hidden, targets = torch.randn(tokens, 256), torch.randint(0, vocab, (tokens,))
    with torch.inference_mode():
        base = rss_now_mb()
        rss_reset()
        t = time.perf_counter()
        if chunk == 0:  # the naive way: full logits, log_softmax, gather, entropy
            _full_logprobs(head(hidden), targets)
        else:
            chunked_logprobs(hidden, head, targets, chunk_tokens=chunk)
        seconds = time.perf_counter() - t
    return {"chunk": chunk or "full", "tokens": tokens, "vocab": vocab, "base_mb": base, "peak_mb": rss_peak_mb(),
            "seconds": seconds}


def _subprocess(argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *argv], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------- main
def run_timing(model_dir: Path, args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    models = {"varlen": load_model(model_dir, attn="sdpa_varlen"), "sdpa": load_model(model_dir, attn="sdpa")}
    pairs = make_pairs(args.sequences, args.min_len, args.max_len, args.vocab, args.mix)
    times: dict[str, list[float]] = {name: [] for name in [*VARIANTS, "matmul"]}
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    results = {}
    with torch.inference_mode():
        t = time.perf_counter()
        compiled_epilogue()(torch.zeros(2, args.vocab), torch.zeros(2, dtype=torch.int64))
        compile_seconds = time.perf_counter() - t
        for _ in range(args.rounds):
            for name, fn in VARIANTS.items():
                t, c = time.perf_counter(), time.process_time()
                results[name] = fn(models, pairs)
                times[name].append(time.perf_counter() - t)
                cpu[name].append((time.process_time() - c) / args.threads)
                print(f"  {name}: {times[name][-1]:.2f} s", file=sys.stderr, flush=True)
            times["matmul"].append(matmul_rate()[1])
    agree = max(float(np.abs(np.concatenate(results[n]) - np.concatenate(results["packed"])).max()) for n in VARIANTS)
    flops = model_flops(models["varlen"], pairs)
    n_tokens = sum(len(p) + len(r) - 1 for p, r in pairs)
    width = max(len(p) + len(r) - 1 for p, r in pairs)
    return {"sequences": len(pairs), "input_tokens": n_tokens, "padded_tokens": len(pairs) * width,
            "response_tokens": sum(len(r) for _, r in pairs), "gflop": flops / 1e9,
            "matmul_gflops": max(times["matmul"]), "max_abs_diff_vs_packed": agree,
            "epilogue_compile_seconds": compile_seconds,
            "seconds": {n: min(times[n]) for n in VARIANTS},
            "cpu_seconds_per_thread": {n: min(cpu[n]) for n in VARIANTS}}


def report(timing: dict, memory: list[dict], chunks: list[dict], vocab: int) -> str:
    sec = timing["seconds"]
    lines = [f"{timing['sequences']} sequences, {timing['input_tokens']} input tokens "
             f"({timing['padded_tokens']} as one padded batch), vocab {vocab}, {timing['gflop']:.0f} GFLOP useful; "
             f"plain float32 matmul {timing['matmul_gflops']:.0f} GFLOP/s; variants agree to "
             f"{timing['max_abs_diff_vs_packed']:.2g}; compiling the epilogue took "
             f"{timing['epilogue_compile_seconds']:.1f} s (not in the timings)", "",
             "| variant | s (min) | CPU s/thread | tokens/s | × packed speed | GFLOP/s (CPU) | % of matmul | "
             "peak RSS over base (MB) |", "|---|---|---|---|---|---|---|---|"]
    peaks = {m["variant"]: m["peak_mb"] - m["base_mb"] for m in memory}
    for name, seconds in sec.items():
        cpu = timing["cpu_seconds_per_thread"][name]
        rate = timing["gflop"] / cpu
        lines.append(f"| {name} | {seconds:.2f} | {cpu:.2f} | {timing['input_tokens'] / seconds:,.0f} | "
                     f"{sec['packed'] / seconds:.2f} | {rate:.1f} | {100 * rate / timing['matmul_gflops']:.0f}% | "
                     f"{peaks.get(name, float('nan')):,.0f} |")
    full_padded = 3 * timing["padded_tokens"] * vocab * 4 / 2**20
    lines += ["", f"packed speed-up: {sec['padded'] / sec['packed']:.2f}× padded (target ≥ 2.5), "
              f"{sec['sorted'] / sec['packed']:.2f}× sorted micro-batches (≥ 1.2), "
              f"{sec['per_seq'] / sec['packed']:.2f}× one-at-a-time (≥ 1.0)",
              f"(b) with an unsliced log_softmax would hold ≈ {full_padded:,.0f} MB of float32 [B, L, V] buffers", "",
              "| log-prob step: chunk | tokens × vocab | s | peak RSS over base (MB) |", "|---|---|---|---|"]
    for c in chunks:
        lines.append(f"| {c['chunk']} | {c['tokens']} × {c['vocab']} | {c['seconds']:.2f} | "
                     f"{c['peak_mb'] - c['base_mb']:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lp-tokens", type=int, default=8192, help="tokens of the log-prob memory probe")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct (rcdiag.score.realmodel) "
                        "instead of the random Qwen2; sets --vocab 49152")
    parser.add_argument("--mix", choices=("spread", "grpo"), default="spread")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-variant memory subprocesses")
    parser.add_argument("--memory-variant", help=argparse.SUPPRESS)
    parser.add_argument("--memory-logprobs", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_variant:
        print(json.dumps(memory_variant(args.model_dir, args.memory_variant, args)))
        return
    if args.memory_logprobs is not None:
        print(json.dumps(memory_logprobs(args.memory_logprobs, args.lp_tokens, args.vocab)))
        return
    if args.real:
        args.vocab = 49152
    common = ["--sequences", str(args.sequences), "--min-len", str(args.min_len), "--max-len", str(args.max_len),
              "--vocab", str(args.vocab), "--threads", str(args.threads), "--lp-tokens", str(args.lp_tokens),
              "--mix", args.mix]
    with tempfile.TemporaryDirectory() as tmp:
        if args.real:
            from rcdiag.score.realmodel import real_model_dir

            model_dir = real_model_dir()
        else:
            model_dir = build_model(Path(tmp) / "model", args.vocab)
        timing = run_timing(model_dir, args)
        memory = [] if args.no_memory else [
            _subprocess([*common, "--model-dir", str(model_dir), "--memory-variant", name])
            for name in VARIANTS if name != "packed_compiled"]
    chunks = [_subprocess([*common, "--memory-logprobs", str(c)]) for c in (256, 1024, 4096, 0)]
    text = report(timing, memory, chunks, args.vocab)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"timing": timing, "memory": memory, "chunks": chunks}, indent=2))


if __name__ == "__main__":
    main()
