"""Benchmark of the probe's exact divergences (rcdiag.analysis.distributions.divergence.exact_divergences) against the LM head
that produces the rows they compare, in one run.

Per position the probe's trainer side already pays the LM head (a `[hidden] × [hidden, V]` matmul) and a float64
log-softmax; the exact divergences add KL both ways, TV, JS, top-k overlaps and, under the run's top-p/top-k, the
kept set and its masses. This script times, on the same realistic rows:

  head           the LM head of C positions (float32 matmul, hidden 576 as SmolLM2-135M) + float64 log_softmax:
                 the baseline each position costs anyway
  exact          exact_divergences(top_p=1): the run without truncation
  exact_top_p    exact_divergences(top_p=0.9): the kept set under nucleus sampling
  exact_top_k    exact_divergences(top_k=50, top_p=0.9)
  …_before       the same functions from `--baseline OLD_TREE`'s rcdiag/analysis/distributions/divergence.py, interleaved

The rows are realistic, not noise: trainer logits from a random head over hidden states, made peaked like an
instruction-tuned model's (median top-1 probability ~0.7, a long flat tail), and the engine's rows are those
logits perturbed by the bf16 rounding of the hidden state (the gap the probe measures). Timing: `--rounds`
interleaved rounds after one warm-up call each (numba's cached kernels load), the minimum kept (the machine is
shared), µs per position and the ratio to `head`. Memory:
peak growth of the process's VmHWM during one chunk, per method, in a fresh subprocess each (after the
warm-up call).

    .venv/bin/python benchmarks/bench_divergence.py                        # vocab 2,048 and 49,152; ≈ 1 min
    .venv/bin/python benchmarks/bench_divergence.py --baseline /tmp/base   # before → after in the same run
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from rcdiag.analysis.distributions import divergence

HIDDEN = 576
"""SmolLM2-135M's hidden size."""


def rows(vocab: int, positions: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, torch.Tensor, torch.Tensor]:
    """(engine log-probs, trainer log-probs) `[positions, vocab]` float32, and the head's inputs (hidden, weight)."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, HIDDEN, generator=gen) / HIDDEN ** 0.5
    hidden = torch.randn(positions, HIDDEN, generator=gen)
    hidden[:, 0] *= 12.0  # a direction the head reads strongly: peaked rows, as a chat model's are
    weight[:, 0] = torch.randn(vocab, generator=gen).clamp(min=0) ** 3 * 0.3
    trainer = torch.log_softmax((hidden @ weight.T).double(), -1)
    engine = torch.log_softmax((hidden.bfloat16().float() @ weight.T).double(), -1)
    return engine.float().numpy(), trainer.float().numpy(), hidden, weight


def load_baseline(tree: Path) -> ModuleType:
    """The baseline tree's divergence module, loaded from its file (it imports only numpy)."""
    spec = importlib.util.spec_from_file_location("divergence_before", tree / "rcdiag/analysis/distributions/divergence.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def methods(module: ModuleType, suffix: str) -> dict[str, Callable[[np.ndarray, np.ndarray], object]]:
    return {f"exact{suffix}": lambda a, b: module.exact_divergences(a, b),
            f"exact_top_p{suffix}": lambda a, b: module.exact_divergences(a, b, top_p=0.9),
            f"exact_top_k{suffix}": lambda a, b: module.exact_divergences(a, b, top_p=0.9, top_k=50)}


def head(hidden: torch.Tensor, weight: torch.Tensor) -> np.ndarray:
    return torch.log_softmax((hidden @ weight.T).double(), -1).numpy()


def time_all(vocab: int, positions: int, chunk: int, rounds: int, baseline: ModuleType | None) -> dict[str, float]:
    engine, trainer, hidden, weight = rows(vocab, positions)
    todo = {"head": None, **methods(divergence, "")}
    if baseline is not None:
        todo.update(methods(baseline, "_before"))
    best = dict.fromkeys(todo, float("inf"))
    for fn in todo.values():  # load the compiled kernels (numba's cache) outside the timings
        if fn is not None:
            fn(engine[:2], trainer[:2])
    for _ in range(rounds):
        for name, fn in todo.items():
            started = time.perf_counter()
            for i in range(0, positions, chunk):
                if fn is None:
                    head(hidden[i:i + chunk], weight)
                else:
                    fn(engine[i:i + chunk], trainer[i:i + chunk])
            best[name] = min(best[name], time.perf_counter() - started)
    return {name: 1e6 * s / positions for name, s in best.items()}


def peak_mib(vocab: int, chunk: int, method: str, baseline: str | None) -> float:
    """VmHWM growth of one chunk of `method` in a fresh process (MiB)."""
    code = ("import sys, json; sys.argv = ['x']; from benchmarks import bench_divergence as b;"
            f"print(json.dumps(b.one_chunk({vocab}, {chunk}, {method!r}, {baseline!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    if done.returncode:
        sys.exit(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _hwm_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))


def one_chunk(vocab: int, chunk: int, method: str, baseline: str | None) -> float:
    engine, trainer, hidden, weight = rows(vocab, chunk)
    before_tree = baseline is not None and method.endswith("_before")
    module = load_baseline(Path(baseline)) if before_tree else divergence
    fns = methods(module, "_before" if before_tree else "")
    if method != "head":  # the compiled kernels' load is not the chunk's memory
        fns[method](engine[:2], trainer[:2])
    before = _hwm_kib()
    if method == "head":
        head(hidden, weight)
    else:
        fns[method](engine, trainer)
    return (_hwm_kib() - before) / 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="+", default=[2048, 49152])
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=64, help="rows per call (the probe's chunk of positions)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="an older checkout: its exact_divergences run interleaved")
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args(argv)
    baseline = load_baseline(args.baseline) if args.baseline else None
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores, {torch.get_num_threads()} "
          f"torch threads); {args.positions} positions in chunks of {args.chunk}, best of {args.rounds}")
    for vocab in args.vocab:
        got = time_all(vocab, args.positions, args.chunk, args.rounds, baseline)
        print(f"\nvocab {vocab:,}")
        print(f"  {'method':22}{'µs/position':>13}{'× head':>9}" + ("" if args.no_memory else f"{'MiB/chunk':>11}"))
        for name, us in got.items():
            mem = "" if args.no_memory else \
                f"{peak_mib(vocab, args.chunk, name, str(args.baseline) if args.baseline else None):11.0f}"
            print(f"  {name:22}{us:13.1f}{us / got['head']:9.2f}{mem}")
        if baseline is not None:
            for name in methods(divergence, ""):
                print(f"  {name}: before → after {got[name + '_before']:.1f} → {got[name]:.1f} µs "
                      f"({got[name + '_before'] / got[name]:.2f}× faster)")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
