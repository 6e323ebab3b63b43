"""First `run.sequence(id)` in a fresh process (what a notebook user waits for), on a synthetic run of many shards.

    python benchmarks/sequence_view.py [--tokens 8000000] [--dir /tmp/rcdiag-bench-seq]

Builds the run once (kept in --dir), then times, each in a fresh interpreter, `import rcdiag; open_run(...)
.sequence(id)` for a sequence near the end, and prints the seconds. Compare the figure before and after a change
on the same machine (numbers from another machine say nothing).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "sample_data" / "tiny-model"


def build(path: Path, n_tokens: int) -> int:
    """A run of `n_tokens` tokens in 512-token sequences (shards of 1M tokens); returns its last seq_id."""
    import rcdiag

    length = 512
    n_seq = n_tokens // length
    rng = np.random.default_rng(0)
    seq_id = np.repeat(np.arange(n_seq, dtype=np.int64), length)
    rollout = -rng.exponential(1.0, n_seq * length).astype(np.float32)
    tokens = pd.DataFrame({"seq_id": seq_id, "pos": np.tile(np.arange(length, dtype=np.int32), n_seq),
                           "token_id": rng.integers(0, 250, n_seq * length, dtype=np.int32),
                           "rollout_logprob": rollout,
                           "train_logprob": rollout + rng.normal(0, 0.01, rollout.size).astype(np.float32)})
    rcdiag.write_run(path, tokens, manifest={"tokenizer": {"path": str(TOKENIZER)}}, shard_tokens=1_000_000,
                     overwrite=True)
    return n_seq - 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/rcdiag-bench-seq"))
    args = parser.parse_args()
    seq = build(args.dir, args.tokens) if not (args.dir / "manifest.json").exists() else args.tokens // 512 - 3
    code = (f"import time; t = time.perf_counter(); import rcdiag; view = rcdiag.open_run({str(args.dir)!r})"
            f".sequence({seq}); html = view._repr_html_(); print(time.perf_counter() - t, len(view.frame))")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    seconds, rows = out.stdout.split()
    print(f"first run.sequence({seq}) on {args.tokens:,} tokens: {float(seconds):.2f} s in-process "
          f"({time.perf_counter() - start:.2f} s with interpreter start), {rows} token rows")


if __name__ == "__main__":
    main()
