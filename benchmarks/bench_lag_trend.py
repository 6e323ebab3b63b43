"""Benchmark: what the per-step lag columns cost the trend's pass (rcdiag.analysis.training.lag_trend), as a ratio in one run.

    python benchmarks/bench_lag_trend.py                      # 4 M tokens, 20 steps
    python benchmarks/bench_lag_trend.py --tokens 2e6 --per-token

Builds a versioned run (sequence versions with the trainer's; `--per-token`: a per-token policy_version column
too, as AReaL stores), then times `rcdiag.trend` with the lag consumer and without it (the same run, the lag
consumer switched off), best of `--repeat`, and prints both and the ratio with/without.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd


def build(path: Path, tokens: int, steps: int, per_token: bool, seed: int = 0) -> None:
    from rcdiag.store.writer import write_run

    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 1500, max(tokens // 775, steps))
    seq = np.repeat(np.arange(lengths.size), lengths)
    pos = np.concatenate([np.arange(n) for n in lengths])
    b = -rng.exponential(1.0, seq.size).astype(np.float32)
    a = (b + rng.normal(0, 0.03, seq.size)).astype(np.float32)
    step = np.sort(rng.integers(0, steps, lengths.size))
    newest = step + 4 - rng.choice([0, 0, 1, 2], lengths.size)
    frame = pd.DataFrame({"seq_id": seq, "pos": pos, "rollout_logprob": b, "train_logprob": a,
                          "mask": rng.random(seq.size) > 0.02})
    if per_token:
        frame["policy_version"] = np.repeat(newest, lengths) - (pos < np.repeat(lengths // 3, lengths))
    seqs = pd.DataFrame({"seq_id": np.arange(lengths.size), "step": step, "policy_version": newest,
                         "trainer_version": step + 4})
    write_run(path, frame, seqs, shard_tokens=1_000_000)


def best(run: Path, lag: bool, repeat: int) -> float:
    from rcdiag.analysis.training import trend as trend_module

    original = trend_module.token_lag
    if not lag:
        trend_module.token_lag = lambda *args: None
    try:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            trend_module.trend(run, replicates=20)
            times.append(time.perf_counter() - start)
    finally:
        trend_module.token_lag = original
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=4e6)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--per-token", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        build(run, int(args.tokens), args.steps, args.per_token)
        without, with_lag = best(run, False, args.repeat), best(run, True, args.repeat)
    n = int(args.tokens)
    print(f"{n:,} tokens, {args.steps} steps{', per-token versions' if args.per_token else ''}: trend without the "
          f"lag columns {without:.2f} s ({n / without / 1e6:.1f} M tok/s), with {with_lag:.2f} s "
          f"({n / with_lag / 1e6:.1f} M tok/s); ratio with/without {with_lag / without:.2f}")


if __name__ == "__main__":
    main()
