"""rcdiag.Recorder's cost per training step, against the step's own tensor work measured in the same run.

    python benchmarks/bench_recorder.py [--batch 64] [--length 512] [--steps 6] [--every 1,10]

The "step" is what a GRPO trainer does with one batch at the least: the sample model's forward and backward over
the batch's prompt + response tokens, the log-softmax + gather that gives the per-token log-probs (the numbers the
recorder writes), and an optimizer step. The recorder then records the step's padded tensors (bf16 engine
log-probs, float32 trainer log-probs, long ids, int mask; every K-th step). Printed per `every`: the step's median
seconds, the recorder's median seconds on a recorded step and amortised over all steps, and their ratio; CPU
seconds too (the figure to trust on a shared machine). Interleaved: each round runs the step, then records it.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parents[1]
MODEL = HERE / "sample_data" / "tiny-model"


def make_batch(rng: np.random.Generator, batch: int, length: int, vocab: int) -> dict[str, torch.Tensor]:
    prompt = 32
    lengths = rng.integers(length // 4, length + 1, batch)
    ids = torch.from_numpy(rng.integers(3, vocab, (batch, prompt + length)))
    mask = (torch.arange(length)[None, :] < torch.from_numpy(lengths)[:, None]).long()
    return {"ids": ids, "prompt": prompt, "mask": mask, "lengths": torch.from_numpy(lengths)}


def training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> torch.Tensor:
    """Forward + backward + optimizer step; returns the trainer's per-token log-probs [B, T] (float32)."""
    ids, prompt = batch["ids"], batch["prompt"]
    logits = model(ids, use_cache=False).logits[:, prompt - 1:-1].float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, prompt:, None]).squeeze(-1)
    loss = -(logprobs * batch["mask"]).sum() / batch["mask"].sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return logprobs.detach()


def timed(fn) -> tuple[float, float, object]:
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--every", default="1,10")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    import rcdiag

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rng = np.random.default_rng(0)
    vocab = model.config.vocab_size
    print(f"batch {args.batch} × {args.length} response tokens (+32 prompt), the sample model "
          f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params), {torch.get_num_threads()} threads; "
          f"load average {os.getloadavg()[0]:.1f}")
    for every in (int(k) for k in args.every.split(",")):
        out = Path(tempfile.mkdtemp(prefix="bench-recorder-"))
        recorder = rcdiag.Recorder(out / "live", every=every)
        step_wall, step_cpu, rec_wall, rec_cpu, recorded = [], [], [], [], []
        for step in range(args.steps * every if every > 1 else args.steps):
            batch = make_batch(rng, args.batch, args.length, vocab)
            wall, cpu, train = timed(lambda b=batch: training_step(model, optimizer, b))
            step_wall.append(wall)
            step_cpu.append(cpu)
            engine = (train + torch.randn_like(train) * 0.01).to(torch.bfloat16)
            wall, cpu, wrote = timed(lambda s=step, b=batch, t=train, e=engine, r=recorder: r.add(
                s, b["ids"][:, :b["prompt"]], b["ids"][:, b["prompt"]:], e, t, b["mask"], lengths=b["lengths"]))
            rec_wall.append(wall)
            rec_cpu.append(cpu)
            recorded.append(wrote)
        on = [w for w, r in zip(rec_wall, recorded, strict=True) if r]
        on_cpu = [c for c, r in zip(rec_cpu, recorded, strict=True) if r]
        tokens = rcdiag.open_run(out / "live").num_tokens
        step_med = statistics.median(step_wall)
        print(f"every={every}: {sum(recorded)} of {len(recorded)} steps recorded ({tokens:,} tokens)")
        print(f"  step (forward+backward+optimizer)  median {step_med:.3f} s wall, "
              f"{statistics.median(step_cpu):.3f} s CPU")
        print(f"  recorder on a recorded step        median {statistics.median(on):.4f} s wall, "
              f"{statistics.median(on_cpu):.4f} s CPU  → {statistics.median(on) / step_med:.2%} of the step")
        later = rec_wall[1:]
        print(f"  recorder's first call              {rec_wall[0]:.4f} s wall (one-time: Parquet writer set-up)")
        print(f"  recorder amortised, later steps    mean {sum(later) / len(later):.4f} s wall "
              f"→ {sum(later) / sum(step_wall[1:]):.2%} of the steps' time")
        shutil.rmtree(out)


if __name__ == "__main__":
    main()
