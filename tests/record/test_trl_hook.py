"""record_grpo on a real TRL GRPOTrainer where TRL computes one side only: with generation aligned to the optimizer
steps and no vLLM importance-sampling correction, TRL never recomputes π_old (grpo_trainer.py
_generate_and_score_completions: `old_per_token_logps = None`), so the hook records rollout-only shards — and says
so once, on the first step, with what to set (issue #45: "not silently record half a run"). A step whose record
fails is one warning and a skipped record, never an exception into `train()`."""
from __future__ import annotations

import os

import pytest
import torch

import rcdiag
from rcdiag.record.hooks import RecorderWarning
from rcdiag.record.trl import record_grpo

trl = pytest.importorskip("trl")
MODEL = "sample_data/tiny-model"
pytestmark = pytest.mark.model


def _trainer(tmp_path, steps_per_generation=1):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(MODEL)

    def rollout(prompts, trainer):  # TRL's custom-generation hook, sampling with the model itself
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for prompt in prompts:
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                g = trainer.model.generate(torch.tensor([ids]), do_sample=True, max_new_tokens=6, top_k=0,
                                           output_logits=True, return_dict_in_generate=True)
            completion = g.sequences[0, len(ids):].tolist()
            out["prompt_ids"].append(ids)
            out["completion_ids"].append(completion)
            out["logprobs"].append([torch.log_softmax(s[0].float(), -1)[t].item()
                                    for s, t in zip(g.logits, completion, strict=True)])
        return out

    args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                          num_generations=4, max_completion_length=6, steps_per_generation=steps_per_generation,
                          gradient_accumulation_steps=1, max_steps=2, report_to=[], save_strategy="no", seed=0)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    dataset = Dataset.from_dict({"prompt": ["What is 2+3?", "Sum of 4 and 5?"] * 8})
    return trl.GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]],
                           args=args, train_dataset=dataset, processing_class=tokenizer, rollout_func=rollout)


def test_no_old_logprobs_is_said_once_on_the_first_step(tmp_path):
    torch.manual_seed(0)
    trainer = _trainer(tmp_path)
    record_grpo(trainer, tmp_path / "live")
    with pytest.warns(RecorderWarning) as said:
        trainer.train()
    ours = [str(w.message) for w in said if issubclass(w.category, RecorderWarning)]
    assert len(ours) == 1 and "computed no π_old" in ours[0] and "vllm_importance_sampling_correction=True" in ours[0]
    run = rcdiag.open_run(tmp_path / "live")
    assert sorted(run.sequences()["step"].unique()) == [0, 1]
    assert run.tokens()["train_logprob"].isna().all() and run.tokens()["rollout_logprob"].notna().all()
    assert run.info.trainer.correction.enabled is False  # TRL applies vllm_importance_sampling_* only with vLLM
    assert run.info.engine.name is None and run.info.engine.extra["rollout_func"].endswith("rollout")


def test_a_failing_record_never_stops_training(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, steps_per_generation=2)
    recorder = record_grpo(trainer, tmp_path / "live")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(recorder, "add", full_disk)  # a fault a test cannot cause for real on this machine
    with pytest.warns(RecorderWarning, match="step 0 was not recorded .OSError"):
        trainer.train()
    assert trainer.state.global_step == 2
    assert trainer._generate_and_score_completions.rcdiag_guard.skipped == [0]
