"""On the shipped sample model (trained Qwen2, bf16 safetensors): packed == one-at-a-time == padded batches, and
the end-to-end mismatch of vLLM bf16 generation against float32 rescoring.

Measured on the sample model (2 cores, torch 2.13 / transformers 5.19 / vLLM 0.32):
- float32, 24 prompts, max |Δ| over log-probs and entropies: packed vs one-at-a-time 8.1e-6, vs left-padded 7.6e-6,
  vs right-padded 6.7e-6, vs float64 1.2e-5 (the trained model's logits are large, so float32 rounding is too);
  asserted ≤ 3e-5.
- end to end (16 prompts × 2 samples, temperature 0.7, bf16 vLLM → float32 rescoring): see the E2E_* notes.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from rcdiag.score.rescore import RescoreConfig, rescore_run
from rcdiag.score.scoring import load_model, score_sequences
from rcdiag.store.manifest import update_manifest
from rcdiag.store.run import open_run
from tests.score.rescore.helpers import max_diff, one_at_a_time, padded_reference, reference_logprobs

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def sample_pairs(sample_model) -> list[tuple[list[int], list[int]]]:
    """Real chat prompts of the sample task, and their reference answers as responses (plus one-token cases)."""
    from transformers import AutoTokenizer

    from rcdiag.score.sample import SAMPLE_PROMPTS

    tokenizer = AutoTokenizer.from_pretrained(str(sample_model))
    records = [json.loads(line) for line in SAMPLE_PROMPTS.read_text().splitlines()[:12]]
    pairs = []
    for record in records:
        text = tokenizer.apply_chat_template(record["messages"], tokenize=False, add_generation_prompt=True)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        response = tokenizer(f"The result is {record['answer']}.\nAnswer: {record['answer']}",
                             add_special_tokens=False)["input_ids"]
        pairs.append((prompt, response))
    return pairs + [(pairs[0][0], pairs[0][1][:1]), (pairs[1][0][:1], pairs[1][1][:2])]


def test_packed_equals_one_at_a_time_and_padded_on_the_sample_model(sample_model, sample_pairs) -> None:
    model = load_model(sample_model, dtype="float32")
    scored = score_sequences(model, sample_pairs, token_budget=256, chunk_tokens=64)
    diffs = {"one_at_a_time": max_diff(scored, one_at_a_time(model, sample_pairs))}
    sdpa = load_model(sample_model, dtype="float32", attn="sdpa")
    for side in ("left", "right"):
        diffs[side] = max_diff(scored, padded_reference(sdpa, sample_pairs, side))
    diffs["float64"] = max_diff(scored, reference_logprobs(sdpa.double(), sample_pairs))
    worst = max(d for d, _ in diffs.values())
    assert worst <= 3e-5, f"max |Δ| per reference: {diffs}"
    assert scored.logprobs.std() > 1.0, "log-probs should be spread (near 0 for formatting, ≪ 0 elsewhere)"


# Thresholds from measured values (16 prompts × 2 samples, max 64 tokens, temperature 0.7, seed 0, 1982 tokens):
# right temperature: mean |ℓ| 0.0036, kl 7.9e-5 on the sample model (0.0064 / 4e-5 on a 20-step smoke build
# of it); rollouts at 0.7 compared at 1.0: mean |ℓ| 0.052 (14×), kl 0.018 on the sample model
# (0.38 / 0.17 on the smoke build: the trained model's low entropy, 0.39 nats, blunts the temperature effect).
E2E_MEAN_ABS = (1e-4, 0.02)
"""Right temperature: bf16 rounding gives a small but non-zero mean |ℓ| (exactly 0 would mean the train column
was copied from the rollout, or the rollout logprobs are float32)."""
E2E_KL_MAX = 0.01
E2E_WRONG_TEMPERATURE_MIN = 0.025
"""Rollout log-probs at temperature 0.7 compared at 1.0: mean |ℓ| must be far above the bf16 noise."""


def _mismatch(path) -> dict[str, float]:
    tokens = open_run(path).tokens()
    valid = tokens["mask"].to_numpy()
    ell = (tokens["train_logprob"] - tokens["rollout_logprob"]).to_numpy(np.float64)[valid]
    return {"mean_abs": float(np.abs(ell).mean()), "kl": float(-ell.mean()), "tokens": int(valid.sum())}


@pytest.mark.vllm
@pytest.mark.slow
def test_bf16_generation_against_float32_rescoring(tmp_path, sample_model) -> None:
    """vLLM in bfloat16 (its own engine, in a subprocess through `rcdiag score --generate-only`), then the
    float32 trainer: a small non-zero mismatch; the same rollouts compared at the wrong temperature: a large one."""
    from rcdiag.score.sample import SAMPLE_PROMPTS

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "rcdiag", "score", "-m", str(sample_model), "-p", str(SAMPLE_PROMPTS), "-o",
           str(run), "--limit", "16", "--n", "2", "--max-tokens", "64", "--temperature", "0.7",
           "--engine-dtype", "bfloat16", "--generate-only", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = rescore_run(run, RescoreConfig(train_dtype="float32"), silent=True)
    assert manifest["trainer"]["temperature"] == 0.7 and manifest["engine"]["engine_dtype"] == "bfloat16"
    right = _mismatch(run)
    wrong_run = tmp_path / "wrong"
    shutil.copytree(run, wrong_run)
    update_manifest(wrong_run, {"engine": {"temperature": 1.0}})
    rescore_run(wrong_run, silent=True)
    wrong = _mismatch(wrong_run)
    print(json.dumps({"right": right, "wrong": wrong}))
    assert right["tokens"] > 100
    assert E2E_MEAN_ABS[0] < right["mean_abs"] < E2E_MEAN_ABS[1], right
    assert abs(right["kl"]) < E2E_KL_MAX, right
    assert wrong["mean_abs"] > E2E_WRONG_TEMPERATURE_MIN, wrong
    assert wrong["mean_abs"] > 3 * right["mean_abs"], (right, wrong)
    assert wrong["kl"] > 0.005, wrong
