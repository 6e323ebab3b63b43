"""NeMo-RL and prime-rl dumps written the way each framework writes them, from true log-softmax values.

Both sides are log_softmax of logits at the sampled token (the engine's from logits perturbed as a bf16 engine
would be, the trainer's from the clean ones), so the log-ratios have a real tail, not clamped noise.

- NeMo-RL @ 7ea279a: the batch of `nemo_rl/algorithms/grpo.py` lines 3633-3653 (content, rewards, input_lengths,
  token_ids, token_loss_mask, sample_loss_mask, advantages, generation_logprobs, prev_logprobs), flattened as
  `batched_message_log_to_flat_message` does (nemo_rl/data/llm_message_utils.py: messages concatenated, right
  padding with the pad id; `add_grpo_token_loss_masks_and_generation_logprobs`: mask 1 and logprobs on generated
  assistant messages only, zeros elsewhere), written as `nemo_rl/utils/logger.py::log_batched_dict_as_jsonl` does
  (one line per sample, every value the batch's slice of one, plus "idx").
- prime-rl @ 559b447: `src/prime_rl/trainer/rl/token_export.py` — `_export_columns` fields, the derived columns of
  `_compute_export_tensors` computed in float32 torch as there (DefaultLossConfig's dppo_mask_high/low 0.2), the
  trainer log-probs shifted right with log(1/V) at position 0 (train.py lines 451-454), `_json_float` turning
  non-finite values into null, `json.dumps(..., separators=(",", ":"), allow_nan=False)`, and `mark_stable`'s
  STABLE file.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

VOCAB = 97
PAD = 0


def sampled_logprobs(rng: np.random.Generator, n: int, noise: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token ids, trainer log-probs, engine log-probs) of n tokens sampled from peaked distributions."""
    logits = torch.from_numpy(rng.standard_normal((n, VOCAB)) * 3.0)
    engine_logits = logits + torch.from_numpy(rng.standard_normal((n, VOCAB)) * noise)
    probs = torch.softmax(engine_logits, -1)
    ids = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30)))).squeeze(1)
    train = torch.log_softmax(logits, -1).gather(1, ids[:, None]).squeeze(1).float()
    engine = torch.log_softmax(engine_logits, -1).gather(1, ids[:, None]).squeeze(1).float()
    return ids.numpy().astype(np.int64), train.numpy(), engine.numpy()


def nemo_step(rng: np.random.Generator, batch: int, *, multi_turn: bool = True, noise: float = 0.05) -> dict:
    """One step's `log_data` as tensors/lists, the way grpo.py builds it."""
    messages = []
    for i in range(batch):
        log = [{"role": "user", "token_ids": rng.integers(1, VOCAB, int(rng.integers(3, 8))), "content": f"q{i}"}]
        turns = 2 if multi_turn and i % 3 == 0 else 1
        for turn in range(turns):
            ids, train, engine = sampled_logprobs(rng, int(rng.integers(2, 9)), noise)
            log.append({"role": "assistant", "token_ids": ids, "content": f"a{i}.{turn}",
                        "generation_logprobs": engine, "_train": train})
            if turn + 1 < turns:
                log.append({"role": "tool", "token_ids": rng.integers(1, VOCAB, 3), "content": "obs"})
        messages.append(log)
    length = max(sum(len(m["token_ids"]) for m in log) for log in messages) + 2
    flat = {k: np.zeros((batch, length), dt) for k, dt in (("token_ids", np.int64), ("token_loss_mask", np.int64),
                                                             ("generation_logprobs", np.float32),
                                                             ("prev_logprobs", np.float32))}
    input_lengths = []
    for i, log in enumerate(messages):
        at = 0
        for m in log:
            n = len(m["token_ids"])
            flat["token_ids"][i, at:at + n] = m["token_ids"]
            if "generation_logprobs" in m:
                flat["token_loss_mask"][i, at:at + n] = 1
                flat["generation_logprobs"][i, at:at + n] = m["generation_logprobs"]
                flat["prev_logprobs"][i, at:at + n] = m["_train"]
            else:  # the trainer scores every position; position 0 has no log-prob (0)
                flat["prev_logprobs"][i, at:at + n] = -rng.exponential(2.0, n)
            at += n
        flat["prev_logprobs"][i, 0] = 0.0
        flat["token_ids"][i, at:] = PAD
        input_lengths.append(at)
    rewards = rng.integers(0, 2, batch).astype(np.float64)
    advantages = (rewards - rewards.mean())[:, None] * np.ones((1, length))
    sample_mask = np.ones(batch)
    sample_mask[1] = 0.0  # e.g. dynamic sampling or the sequence-level logprob-error mask
    return {"content": [[m["content"] for m in log] for log in messages], "rewards": rewards.tolist(),
            "input_lengths": input_lengths, "token_ids": flat["token_ids"].tolist(),
            "token_loss_mask": flat["token_loss_mask"].tolist(), "sample_loss_mask": sample_mask.tolist(),
            "advantages": advantages.tolist(), "generation_logprobs": flat["generation_logprobs"].tolist(),
            "prev_logprobs": flat["prev_logprobs"].tolist()}


def write_nemo(path: Path, log_data: dict) -> Path:
    """log_batched_dict_as_jsonl: one line per sample, each value the slice [i:i+1], plus idx."""
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = len(log_data["rewards"])
    with open(path, "w") as f:
        for i in range(batch):
            f.write(json.dumps({**{k: v[i:i + 1] for k, v in log_data.items()}, "idx": i}, default=str) + "\n")
    return path


def nemo_token_mult_prob_error(log_data: dict) -> float:
    """NeMo-RL's own number, as ClippedPGLossFn computes it (loss_functions.py @ 7ea279a, lines 383-412): every
    array sliced [:, 1:], mask = token_mask × sample_mask, masked_mean(exp(|gen − prev| × mask), mask) with the
    global valid-token count + 1e-8, in float32 torch."""
    token_mask = torch.tensor(log_data["token_loss_mask"], dtype=torch.float32)[:, 1:]
    sample_mask = torch.tensor(log_data["sample_loss_mask"], dtype=torch.float32)
    gen = torch.tensor(log_data["generation_logprobs"], dtype=torch.float32)[:, 1:]
    prev = torch.tensor(log_data["prev_logprobs"], dtype=torch.float32)[:, 1:]
    mask = token_mask * sample_mask.unsqueeze(-1)
    lp_error = torch.abs(gen - prev)
    return float(torch.sum(torch.exp(lp_error * mask) * mask) / (mask.sum() + 1e-8))


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None


def prime_records(rng: np.random.Generator, step: int, rank: int, n: int, *, noise: float = 0.05,
                  layout: str = "weights", run_id: str | None = None, sft: tuple[int, ...] = ()) -> list[dict]:
    """Token-export records of one rank: a packed micro-batch split by sequence_lengths, one record each.
    `layout` (rcdiag.importers.prime_rl.LAYOUTS): "weights" (559b447: rl/ce/ref_kl weight columns), "multi_tenant"
    (941019f: `training_mode`, per-token `rewards`, `run_id`, `export_step` — the run's own step, here step + 100
    for the trainer's), "early" (e971d90: `training_mode` and `rewards`); records at `sft` indexes are
    training_mode "sft" (CE on teacher tokens: `_compute_export_tensors` returns no ratio columns, and the
    inference log-probs are the zeros the packer leaves)."""
    out = []
    for k in range(n):
        prompt = rng.integers(1, VOCAB, int(rng.integers(3, 8)))
        ids, train, engine = sampled_logprobs(rng, int(rng.integers(2, 12)), noise)
        token_ids = np.concatenate([prompt, ids])
        loss_mask = torch.tensor([False] * prompt.size + [True] * ids.size)
        trainer = torch.tensor(np.concatenate([np.full(prompt.size, -3.0, np.float32), train]))
        trainer[0] = math.log(1.0 / VOCAB)
        inference = torch.tensor(np.concatenate([np.zeros(prompt.size, np.float32), engine]))
        advantages = torch.full((token_ids.size,), float(rng.normal()))
        log_ratio = trainer - inference
        ratio = torch.exp(log_ratio)
        mismatch_kl = ratio - log_ratio - 1
        prob_delta = torch.exp(trainer) - torch.exp(inference)
        invalid = torch.where(advantages > 0, prob_delta > 0.2, prob_delta < -0.2)
        cols = {"token_ids": token_ids.tolist(), "position_ids": list(range(token_ids.size)),
                "loss_mask": loss_mask.tolist(), "advantages": advantages.tolist(),
                "inference_logprobs": inference.tolist(), "trainer_logprobs": trainer.tolist(),
                "entropy": (torch.rand(token_ids.size, generator=torch.Generator().manual_seed(k)) * 2).tolist(),
                "mismatch_kl": mismatch_kl.tolist(), "log_importance_ratio": log_ratio.tolist(),
                "importance_ratio": ratio.tolist(), "prob_delta": prob_delta.tolist(),
                "is_masked": (loss_mask & invalid).tolist(),
                "is_masked_high": (loss_mask & (advantages > 0) & (prob_delta > 0.2)).tolist(),
                "is_masked_low": (loss_mask & (advantages < 0) & (prob_delta < -0.2)).tolist(),
                "rl_weights": [None] * token_ids.size, "ce_weights": [None] * token_ids.size,
                "ref_kl_weights": [None] * token_ids.size}
        head: dict = {}
        if layout != "weights":
            for name in ("rl_weights", "ce_weights", "ref_kl_weights"):
                del cols[name]
            cols["rewards"] = [float(k)] * token_ids.size
            head["training_mode"] = "sft" if k in sft else "rl"
            if k in sft:
                cols["inference_logprobs"] = [0.0] * token_ids.size
                for name in ("mismatch_kl", "log_importance_ratio", "importance_ratio", "prob_delta", "is_masked",
                             "is_masked_high", "is_masked_low"):
                    cols[name] = [None] * token_ids.size
        if layout == "multi_tenant":
            head.update(export_step=step + 100, run_id=run_id)
        floats = {k2: [_json_float(float(v)) if isinstance(v, float) else v for v in vals]
                  for k2, vals in cols.items()}
        out.append({"schema_version": 1, "step": step, "rank": rank, "micro_step": k // 2,
                    "micro_sequence_idx": k % 2, "export_sequence_idx": k, "env_name": "math", **head, **floats})
    return out


def write_prime(root: Path, step: int, ranks: dict[int, list[dict]], *, stable: bool = True,
                run_id: str | None = None) -> Path:
    """One step directory, as `TokenExporter._export_dir` names it: `root/token_exports/step_<step>`, or with a
    `run_id` (multi-tenant) `root/<run_id>/token_exports/step_<step>`."""
    step_dir = (root if run_id is None else root / run_id) / "token_exports" / f"step_{step}"
    step_dir.mkdir(parents=True, exist_ok=True)
    for rank, records in ranks.items():
        with open(step_dir / f"rank_{rank}.jsonl", "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
    if stable:
        (step_dir / "STABLE").touch()
    return step_dir


def prime_mismatch_kl_mean(records: list[dict]) -> float:
    """prime-rl's logged mismatch_kl/all/mean (train.py lines 496-512 + trainer/utils.py Tensors.compute_stats):
    the record's mismatch_kl at loss_mask positions, concatenated over micro-steps and ranks, then the mean."""
    values = [v for r in records for v, m in zip(r["mismatch_kl"], r["loss_mask"], strict=True) if m]
    return float(torch.tensor(values, dtype=torch.float32).mean())
