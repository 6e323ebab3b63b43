"""`rcdiag import` of realistic slime and verl dumps: the restricted loader (allow-list, bounds-checked tensors,
the file-size budget, the expansion count) against the trusted readers on the same file in the same run.

slime: `torch.save({"rollout_id", "samples": [Sample.to_dict(), …]})` with token ids, log-probs and masks as Python
lists (what Sample.to_dict gives); baseline `torch.load(weights_only=False)`. verl: RolloutSkip's gen_batch.dp
(pickle of a DataProto whose state holds the torch.save bytes of a consolidated TensorDict, written with the real
tensordict package); baseline `pickle.load` with verl's DataProto importable plus `torch.load` of the inner bytes.
Prints CPU seconds (min of --rounds) for the load alone and for the whole import (load + Parquet), and ratios.

    python benchmarks/bench_import.py [--samples 4096] [--length 1024] [--rounds 3]
"""
from __future__ import annotations

import argparse
import io
import pickle
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rcdiag.importers import ImportOptions, import_run  # noqa: E402
from rcdiag.importers.safeload import load_pickle_file  # noqa: E402

PROTOCOL = textwrap.dedent('''
    import io, pickle, torch
    class DataProto:
        def __init__(self, batch, non_tensor_batch, meta_info):
            self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info
        def __getstate__(self):
            buffer = io.BytesIO()
            torch.save(self.batch.contiguous().consolidate(), buffer)
            return buffer.getvalue(), self.non_tensor_batch, self.meta_info
        def __setstate__(self, state):
            self.batch, self.non_tensor_batch, self.meta_info = state
''')


def slime_dump(path: Path, samples: int, length: int) -> Path:
    rng = np.random.default_rng(0)
    out = []
    for i in range(samples):
        prompt = rng.integers(0, 150_000, 256).tolist()
        response = rng.integers(0, 150_000, length).tolist()
        out.append({"index": i, "group_index": i // 8, "prompt": "p" * 200, "response": "r" * 800,
                    "tokens": prompt + response, "response_length": length, "reward": float(i % 2),
                    "loss_mask": [1] * length, "rollout_log_probs": (-rng.exponential(0.5, length)).tolist(),
                    "status": "completed", "metadata": {}})
    torch.save({"rollout_id": 1, "samples": out}, path)
    return path


def verl_dump(path: Path, pkg: Path, samples: int, length: int) -> Path:
    from tensordict import TensorDict

    (pkg / "verl").mkdir(parents=True, exist_ok=True)
    (pkg / "verl" / "__init__.py").touch()
    (pkg / "verl" / "protocol.py").write_text(PROTOCOL)
    sys.path.insert(0, str(pkg))
    from verl.protocol import DataProto

    gen = torch.Generator().manual_seed(0)
    batch = TensorDict({
        "prompts": torch.randint(0, 150_000, (samples, 256), generator=gen),
        "responses": torch.randint(0, 150_000, (samples, length), generator=gen),
        "attention_mask": torch.ones(samples, 256 + length, dtype=torch.long),
        "response_mask": torch.ones(samples, length, dtype=torch.long),
        "rollout_log_probs": -torch.rand(samples, length, generator=gen),
        "old_log_probs": -torch.rand(samples, length, generator=gen)}, batch_size=[samples])
    uids = np.array([f"uid-{i // 8}" for i in range(samples)], dtype=object)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        pickle.dump(DataProto(batch, {"uid": uids}, {"temperature": 1.0}), handle)
    return path


def cpu(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-import-"))
    opts = ImportOptions(allow_pickle=True, quiet=True)
    try:
        slime = slime_dump(work / "slime.pt", args.samples, args.length)
        verl = verl_dump(work / "verl" / "gen_batch.dp", work / "pkg", args.samples, args.length)
        tokens = args.samples * args.length
        print(f"{args.samples} samples × {args.length} response tokens ({tokens / 1e6:.1f} M tokens); slime "
              f"{slime.stat().st_size / 1e6:.0f} MB, verl {verl.stat().st_size / 1e6:.0f} MB")

        def whole(fmt: str, path: Path):
            def go():
                out = work / f"run-{fmt}"
                shutil.rmtree(out, ignore_errors=True)
                import_run(fmt, path, out, opts)
            return go

        def verl_trusted():
            with open(verl, "rb") as handle:
                proto = pickle.load(handle)
            torch.load(io.BytesIO(proto.batch), weights_only=False)

        rows = [("slime load", cpu(lambda: load_pickle_file(slime), args.rounds),
                 cpu(lambda: torch.load(slime, weights_only=False), args.rounds)),
                ("slime import", cpu(whole("slime", slime), args.rounds), None),
                ("verl load", cpu(lambda: _verl_load(verl), args.rounds), cpu(verl_trusted, args.rounds)),
                ("verl import", cpu(whole("verl", verl), args.rounds), None)]
        print(f"{'':14} {'rcdiag s':>9} {'trusted s':>9} {'ratio':>6}")
        for name, ours, base in rows:
            print(f"{name:14} {ours:9.2f} {base if base is not None else float('nan'):9.2f} "
                  f"{ours / base if base else float('nan'):6.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _verl_load(path: Path) -> None:
    from rcdiag.importers.tensordicts import load_tensordict_bytes

    proto = load_pickle_file(path)
    load_tensordict_bytes(proto._state[0], path)


if __name__ == "__main__":
    main()
