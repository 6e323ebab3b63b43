"""Benchmark of padding-free rescoring against the usual ways of computing trainer log-probs, in one run.

Same model (a Qwen2 built from a config, vocab 32k, random weights) and same data (64 sequences, lengths spread
32…1024) for every variant:

  (a) packed      rcdiag.score.scoring.score_sequences: rows ≤ 4096 tokens, sdpa_varlen, chunked LM head
  (a') packed_compiled  the same with the torch.compile'd epilogue (rescore uses it from COMPILE_MIN_ELEMENTS)
  (a") packed_before    the same with the eager epilogue rescoring used before (logsumexp, then exp(log p) for
                  the entropy): the before → after of the log-prob step, in the same run
  (b) padded      one padded batch [64, L_max] + attention mask, logits of every padded position + float32
                  log_softmax (LM head and softmax taken ≤ 4096 positions' rows at a time so the shared 24 GB
                  machine survives — same FLOPs; the memory of the unsliced version is reported as computed)
  (c) per_seq     one sequence at a time, batch 1, full logits + log_softmax
  (d) sorted      length-sorted padded micro-batches of ≤ 4096 padded tokens, full logits + log_softmax

Timing: the variants run interleaved, `--rounds` times, in one process; the minimum is kept (the machine is shared).
CPU seconds per thread are recorded too: on a contended machine they, not wall time, compare with the matmul rate.
A plain float32 matmul is timed in the same rounds as the achievable GFLOP/s. FLOPs are counted exactly for the
matmuls the model must do: 2·(body parameters)·(input tokens) + causal attention 2·layers·hidden·Σ L² (QKᵀ and PV
over the lower triangle) + 2·hidden·vocab·(response tokens); element-wise work counts nothing. Where the packed
path's time goes (body matmuls and element-wise ops, attention, LM head, epilogue) is timed in a separate pass.
Peak memory: the growth of VmHWM during each variant in the timing process (reset before each), optionally each
variant again in a fresh subprocess, and the log-prob step alone vs chunk size.

    .venv/bin/python benchmarks/bench_rescore.py            # ≈ 5 min on 2 cores
    .venv/bin/python benchmarks/bench_rescore.py --rounds 1 --sequences 16   # quick look
    .venv/bin/python benchmarks/bench_rescore.py --real --mix grpo --sequences 6 --min-len 128 --max-len 4096 \
        --rounds 1 --no-memory
        # SmolLM2-135M-Instruct itself (vocab 49,152, 30 layers; rcdiag.score.realmodel), prompts of 64–384
        # tokens and a GRPO length mix: responses log-uniform over [min, max] (most end early, a few reason
        # for thousands of tokens), capped at the model's 8,192-token context
"""
from __future__ import annotations

import argparse
import json
import os
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


def make_pairs(n: int, low: int, high: int, vocab: int, mix: str = "spread",
               context: int = 8192) -> list[tuple[list[int], list[int]]]:
    """`spread`: prompts of PROMPT tokens, sequences evenly spread over [low, high]; `grpo`: prompts of 64–384
    tokens (a chat prompt), responses log-uniform over [low, high] — GRPO groups where most answers end early
    and a few reason for thousands of tokens — with prompt + response within `context` positions."""
    rng = np.random.default_rng(0)
    if mix == "grpo":
        lengths = np.geomspace(low, high, n).astype(int)
        rng.shuffle(lengths)
        prompts = [int(rng.integers(64, 385)) for _ in lengths]
        return [(rng.integers(0, vocab, P).tolist(), rng.integers(0, vocab, int(min(L, context - P + 1))).tolist())
                for P, L in zip(prompts, lengths, strict=True)]
    lengths = np.linspace(low, high, n).astype(int)  # evenly spread, shuffled
    rng.shuffle(lengths)
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
def epilogue_before(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager epilogue rescoring used before this benchmark's round (logsumexp; log p in place; exp(log p)·log p
    for the entropy), kept here as the baseline."""
    lse = torch.logsumexp(logits, dim=-1)
    logits.sub_(lse[:, None])
    logp = logits.gather(-1, targets[:, None])[:, 0]
    return logp, -(logits.exp().mul_(logits)).sum(-1)


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
    step = max(1, BUDGET // width) if rows_per_softmax is None else rows_per_softmax
    logp = torch.cat([_full_logprobs(model.lm_head(hidden[i:i + step]), targets[i:i + step])[0]
                      for i in range(0, len(seqs), step)])
    return [logp[i, len(p) - 1:len(p) - 1 + len(r)].numpy() for i, (p, r) in enumerate(pairs)]


def variant_packed(models, pairs, epilogue=epilogue_inplace):
    scored = score_sequences(models["varlen"], pairs, token_budget=BUDGET, chunk_tokens=1024, epilogue=epilogue)
    return [lp for lp, _ in scored.per_sequence()]


def variant_packed_compiled(models, pairs):
    return variant_packed(models, pairs, compiled_epilogue())


def variant_packed_before(models, pairs):
    return variant_packed(models, pairs, epilogue_before)


def variant_padded(models, pairs):
    return _padded_batch(models["sdpa"], pairs, rows_per_softmax=None)


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
        for i, lp in zip(batch, _padded_batch(models["sdpa"], [pairs[i] for i in batch], len(batch)), strict=True):
            out[i] = lp
        start = stop
    return out


VARIANTS: dict[str, Callable] = {"packed": variant_packed, "packed_compiled": variant_packed_compiled,
                                 "packed_before": variant_packed_before, "padded": variant_padded,
                                 "per_seq": variant_per_seq, "sorted": variant_sorted}


def matmul_rate(n: int = 2048, repeats: int = 3) -> tuple[float, float]:
    """(CPU seconds per thread, GFLOP/s) of the best of `repeats` float32 n×n @ n×n matmuls — CPU time, like the
    variants' rates, so that a loaded machine's waiting counts in neither."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        c = time.process_time()
        a @ b
        best = min(best, (time.process_time() - c) / torch.get_num_threads())
    return best, 2 * n**3 / best / 1e9


def model_flops(model, pairs) -> float:
    """2·P_body·N_input + causal attention (2·2·L²/2·d per layer) + 2·H·V·N_response."""
    cfg = model.config
    body = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)
    lengths = np.array([len(p) + len(r) - 1 for p, r in pairs], dtype=np.float64)
    attention = 2 * cfg.num_hidden_layers * cfg.hidden_size * (lengths**2).sum()
    responses = sum(len(r) for _, r in pairs)
    return {"body": 2 * body * lengths.sum(), "attention": attention,
            "lm_head": 2 * cfg.hidden_size * cfg.vocab_size * responses}


def breakdown(model, pairs, epilogue) -> dict[str, float]:
    """CPU seconds per thread of the packed path's parts, from one more `score_sequences` call: the attention
    kernel (sdpa_varlen, timed through a wrapper registered under its name), the LM head (forward hooks), the
    epilogue (a wrapper), and the rest of the body (matmuls and element-wise ops: total minus those)."""
    from transformers import AttentionInterface

    from rcdiag.score.attention import sdpa_varlen_forward
    from rcdiag.score.config import SDPA_VARLEN

    spent = {"attention": 0.0, "lm_head": 0.0, "epilogue": 0.0}
    threads = torch.get_num_threads()

    def timed(part, fn):
        def call(*args, **kwargs):
            c = time.process_time()
            out = fn(*args, **kwargs)
            spent[part] += (time.process_time() - c) / threads
            return out
        return call

    head = model.get_output_embeddings()
    clock = {}
    hooks = [head.register_forward_pre_hook(lambda *_: clock.__setitem__("t", time.process_time())),
             head.register_forward_hook(lambda *_: spent.__setitem__(
                 "lm_head", spent["lm_head"] + (time.process_time() - clock["t"]) / threads))]
    AttentionInterface.register(SDPA_VARLEN, timed("attention", sdpa_varlen_forward))
    try:
        c = time.process_time()
        score_sequences(model, pairs, token_budget=BUDGET, chunk_tokens=1024, epilogue=timed("epilogue", epilogue))
        total = (time.process_time() - c) / threads
    finally:
        AttentionInterface.register(SDPA_VARLEN, sdpa_varlen_forward)
        for hook in hooks:
            hook.remove()
    return {"total": total, "body_rest": total - sum(spent.values()), **spent}


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
    peaks: dict[str, float] = {}
    results = {}
    with torch.inference_mode():
        t = time.perf_counter()
        compiled_epilogue()(torch.zeros(2, args.vocab), torch.zeros(2, dtype=torch.int64))
        compile_seconds = time.perf_counter() - t
        shortest = [min(pairs, key=lambda pair: len(pair[0]) + len(pair[1]))]
        for fn in VARIANTS.values():  # first-call costs (thread pools, kernel selection) outside the timings
            fn(models, shortest)
        for _ in range(args.rounds):
            for name, fn in VARIANTS.items():
                base = rss_now_mb()
                rss_reset()
                t, c = time.perf_counter(), time.process_time()
                results[name] = fn(models, pairs)
                times[name].append(time.perf_counter() - t)
                cpu[name].append((time.process_time() - c) / args.threads)
                peaks[name] = max(peaks.get(name, 0.0), rss_peak_mb() - base)
                print(f"  {name}: {times[name][-1]:.2f} s wall, {cpu[name][-1]:.2f} CPU s/thread, load "
                      f"{os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
            times["matmul"].append(matmul_rate()[1])
        parts = breakdown(models["varlen"], pairs, epilogue_inplace)
    agree = max(float(np.abs(np.concatenate(results[n]) - np.concatenate(results["packed"])).max()) for n in VARIANTS)
    flops_by_part = model_flops(models["varlen"], pairs)
    flops = sum(flops_by_part.values())
    n_tokens = sum(len(p) + len(r) - 1 for p, r in pairs)
    width = max(len(p) + len(r) - 1 for p, r in pairs)
    return {"sequences": len(pairs), "input_tokens": n_tokens, "padded_tokens": len(pairs) * width,
            "response_tokens": sum(len(r) for _, r in pairs), "gflop": flops / 1e9,
            "matmul_gflops": max(times["matmul"]), "max_abs_diff_vs_packed": agree,
            "epilogue_compile_seconds": compile_seconds, "gflop_by_part": {k: v / 1e9 for k, v in flops_by_part.items()},
            "parts_cpu_seconds_per_thread": parts, "peak_rss_over_base_mb": peaks,
            "load_average": os.getloadavg()[0], "seconds": {n: min(times[n]) for n in VARIANTS},
            "cpu_seconds_per_thread": {n: min(cpu[n]) for n in VARIANTS}}


def parts_before_epilogue(timing: dict) -> float:
    cpu = timing["cpu_seconds_per_thread"]
    return timing["parts_cpu_seconds_per_thread"]["epilogue"] + cpu["packed_before"] - cpu["packed"]


def report(timing: dict, memory: list[dict], chunks: list[dict], vocab: int) -> str:
    sec = timing["seconds"]
    lines = [f"{timing['sequences']} sequences, {timing['input_tokens']} input tokens "
             f"({timing['padded_tokens']} as one padded batch), vocab {vocab}, {timing['gflop']:.0f} GFLOP useful; "
             f"plain float32 matmul {timing['matmul_gflops']:.0f} GFLOP/s; variants agree to "
             f"{timing['max_abs_diff_vs_packed']:.2g}; compiling the epilogue took "
             f"{timing['epilogue_compile_seconds']:.1f} s (not in the timings)", "",
             "| variant | s (min) | CPU s/thread | tokens/s | × packed speed (CPU) | GFLOP/s (CPU) | % of matmul | "
             "peak RSS over base (MB) | in the timing process (MB) |", "|---|---|---|---|---|---|---|---|---|"]
    peaks = {m["variant"]: m["peak_mb"] - m["base_mb"] for m in memory}
    cpu = timing["cpu_seconds_per_thread"]
    for name, seconds in sec.items():
        rate = timing["gflop"] / cpu[name]
        lines.append(f"| {name} | {seconds:.2f} | {cpu[name]:.2f} | {timing['input_tokens'] / seconds:,.0f} | "
                     f"{cpu['packed'] / cpu[name]:.2f} | {rate:.1f} | {100 * rate / timing['matmul_gflops']:.0f}% | "
                     f"{peaks.get(name, float('nan')):,.0f} | {timing['peak_rss_over_base_mb'][name]:,.0f} |")
    full_padded = 3 * timing["padded_tokens"] * vocab * 4 / 2**20
    lines.append("")
    for label, key in (("CPU", "cpu"), ("wall", "wall")):
        t = cpu if key == "cpu" else sec
        best = min(t["packed"], t["packed_compiled"])
        lines.append(f"packed speed-up ({label}; the faster of packed and packed_compiled): "
                     f"{t['padded'] / best:.2f}× padded (target ≥ 2.5), {t['sorted'] / best:.2f}× sorted "
                     f"micro-batches (≥ 1.2), {t['per_seq'] / best:.2f}× one-at-a-time (≥ 1.0); before (packed_before): "
                     f"{t['padded'] / t['packed_before']:.2f}×, {t['sorted'] / t['packed_before']:.2f}×, "
                     f"{t['per_seq'] / t['packed_before']:.2f}×")
    gf, mm = timing["gflop_by_part"], timing["matmul_gflops"]
    lines += ["", "| packed, where the CPU goes | s/thread | GFLOP | % of matmul |", "|---|---|---|---|"]
    part_flops = {"body_rest": gf["body"], "attention": gf["attention"], "lm_head": gf["lm_head"], "epilogue": 0.0,
                  "total": timing["gflop"]}
    for part, flop in part_flops.items():
        seconds = timing["parts_cpu_seconds_per_thread"][part]
        share = f"{100 * flop / seconds / mm:.0f}%" if flop else "—"
        lines.append(f"| {part} | {seconds:.2f} | {flop:.0f} | {share} |")
    lines.append(f"(the epilogue before, eager logsumexp: ≈ {parts_before_epilogue(timing):.2f} s/thread — "
                 "packed_before's CPU minus packed's, plus the epilogue above)")
    lines += [f"load average at the end {timing['load_average']:.1f} on {os.cpu_count()} cores",
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
