"""The working directory the README's and the `--help` examples' commands run in (tests/test_docs.py): every path
they name, built small and the way each source writes it.

- runs/sample, runs/bf16, runs/fp16, runs/verl, runs/old-vllm, runs/new-vllm: synthetic runs from exact categorical
  distributions (tests.fixtures.runs); the new engine's noise is 3× the old one's, so `--fail-if "k3_kl>2x"` trips;
- runs/steps: six steps with a flat mismatch (tests.trend.steps), so `--fail-on-drift` passes;
- runs/async: AReaL trajectories with per-token policy versions, imported;
- dumps to import: slime (`dump_dir/rollout_data/0.pt` + `train_data/0.pt`, torch.save), NeMo-RL
  (`logs/exp/train_data_step{N}.jsonl`), prime-rl (`outputs/token_exports/step_N/`), TRL completions
  (`outputs/completions/completions_*.parquet`), JSONL rows in the generic, TRL-batch and AReaL shapes;
  `model` → the shipped tiny model (its tokenizer); `generate.jsonl`: SGLang /generate responses with MoE routes,
  `moe-model` → the MoE sample (its config.json gives the routes' shape);
- tracker logs for `crosscheck`, written from the run's own numbers the way a trainer would log them:
  `outputs/tb` (TensorBoard, verl keys), `wandb/offline-run-20260101_000000-abc123` (an offline W&B run),
  `history.csv` (TRL keys, sequence_mask at C = 3).
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from tests.fixtures.runs import build_run

MODEL = Path(__file__).resolve().parents[1] / "sample_data" / "tiny-model"
VOCAB = 2048
"""The tiny model's vocabulary: ids of the rows that go with `--tokenizer ./model` stay below it."""


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _sampled(rng: np.random.Generator, n: int, noise: float = 0.05) -> tuple[list[int], list[float], list[float]]:
    """(ids, rollout, train) for n tokens: log-softmax of random logits at the sampled token, the engine's from
    perturbed logits, so both sides are true log-probs that differ as a numerical mismatch does."""
    logits = rng.normal(0, 2.5, (n, 64))
    engine = logits + rng.normal(0, noise, logits.shape)
    ids = [int(rng.integers(0, 64)) for _ in range(n)]

    def logp(z: np.ndarray) -> list[float]:
        z = z - z.max(axis=1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return [float(lp[i, t]) for i, t in enumerate(ids)]

    return [3 + i for i in ids], logp(engine), logp(logits)


def jsonl_inputs(root: Path, rng: np.random.Generator) -> None:
    """rollouts.jsonl (generic, named by flags), trl_batch.jsonl (TRL's own padded batch keys) and
    areal_trajectories.jsonl (AReaL's trajectory dicts with per-token versions)."""
    generic, trl, areal = [], [], []
    for i in range(24):
        prompt = [int(x) for x in rng.integers(3, VOCAB, int(rng.integers(2, 8)))]
        ids, rollout, train = _sampled(rng, int(rng.integers(3, 16)))
        generic.append({"prompt_ids": prompt, "completion_ids": ids, "logprobs": rollout, "train_logprobs": train})
        pad = 16 - len(ids)
        trl.append({"global_step": 10 + i // 12, "prompt_ids": [0] * (8 - len(prompt)) + prompt,
                    "prompt_mask": [0] * (8 - len(prompt)) + [1] * len(prompt), "completion_ids": ids + [0] * pad,
                    "completion_mask": [1] * len(ids) + [0] * pad, "sampling_per_token_logps": rollout + [0.0] * pad,
                    "old_per_token_logps": train + [0.0] * pad, "advantages": float(rng.normal()),
                    "reward": float(i % 2)})
        version = 4 + i % 2
        areal.append({"input_ids": prompt + ids, "loss_mask": [0] * len(prompt) + [1] * len(ids),
                      "logprobs": [0.0] * len(prompt) + rollout, "versions": [-1] * len(prompt) + [version] * len(ids),
                      "rewards": float(i % 2)})
    _jsonl(root / "rollouts.jsonl", generic)
    _jsonl(root / "trl_batch.jsonl", trl)
    _jsonl(root / "areal_trajectories.jsonl", areal)


def framework_dumps(root: Path) -> None:
    """slime (torch.save), SGLang, NeMo-RL and prime-rl dumps, written by the importer tests' builders, and TRL's
    text completions."""
    from tests.importers.dumps import make_truth, save_slime_rollout, save_slime_train
    from tests.importers.nemo_prime_dumps import nemo_step, prime_records, write_nemo, write_prime
    from tests.moe.test_import import MODEL as MOE_MODEL
    from tests.moe.test_import import route_rows, sglang_rows, write_jsonl

    truth = make_truth(seed=7)
    routed = [t for t in truth if t.response]
    write_jsonl(root / "generate.jsonl", sglang_rows(routed, route_rows(routed)))
    (root / "moe-model").symlink_to(MOE_MODEL)
    save_slime_rollout(root / "dump_dir/rollout_data/0.pt", truth, rollout_id=0)
    save_slime_train(root / "dump_dir/train_data/0.pt", truth, rollout_id=0)
    rng = np.random.default_rng(3)
    for step in (1, 2):
        write_nemo(root / "logs/exp" / f"train_data_step{step}.jsonl", nemo_step(rng, 6))
        write_prime(root / "outputs", step, {0: prime_records(rng, step, 0, 4), 1: prime_records(rng, step, 1, 4)})
    folder = root / "outputs/completions"
    folder.mkdir(parents=True)
    for step in (1, 2):
        pd.DataFrame({"step": [step] * 3, "prompt": [f"What is {step} + {k}?" for k in range(3)],
                      "completion": [f"The answer is {step + k}." for k in range(3)],
                      "accuracy_reward": [1.0, 0.0, 1.0]}).to_parquet(folder / f"completions_{step:05d}.parquet")


def tracker_logs(root: Path) -> None:
    """What a trainer logged, from runs/steps' own numbers: TensorBoard (verl keys), an offline W&B run (verl keys),
    a history CSV (TRL keys, sequence_mask at C = 3)."""
    from rcdiag.analysis.training.trend import trend
    from rcdiag.store.run import open_run
    from rcdiag.trackers.export import export_run, tracker_rows, write_tensorboard

    run = open_run(root / "runs/steps")
    write_tensorboard(tracker_rows(trend(run, "verl", replicates=10), "verl"), root / "outputs/tb", "trainer")
    rows = tracker_rows(trend(run, "trl", mode="sequence_mask", threshold=3.0, replicates=10), "trl")
    pd.DataFrame([{"_step": s, **v} for s, v in rows]).to_csv(root / "history.csv", index=False)
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        export_run(run, "wandb", scratch, "verl")
        written = next((Path(scratch) / "wandb").glob("offline-run-*"))
        (root / "wandb").mkdir()
        shutil.move(str(written), root / "wandb/offline-run-20260101_000000-abc123")


def build(root: Path) -> None:
    """Every input of the documented commands under `root`."""
    from rcdiag.importers import ImportOptions, import_run
    from tests.trend.steps import noise_schedule, write_step_run

    runs = root / "runs"
    for name, noise in (("sample", 0.03), ("bf16", 0.03), ("fp16", 0.01), ("verl", 0.03), ("old-vllm", 0.03),
                        ("new-vllm", 0.09)):
        build_run(runs / name, noise=noise, seed=len(name))
    write_step_run(runs / "steps", noise_schedule(6, None))
    (root / "model").symlink_to(MODEL)
    rng = np.random.default_rng(0)
    jsonl_inputs(root, rng)
    import_run("jsonl", root / "areal_trajectories.jsonl", runs / "async", ImportOptions(quiet=True))
    framework_dumps(root)
    tracker_logs(root)
