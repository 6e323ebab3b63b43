"""The TRL hook on a real `trl.GRPOTrainer` (trl 1.16) training the sample model on CPU: both sides per token at
each generation step, equal to what the rollout returned and to the trainer's π_old recompute.

The rollout is a `rollout_func` (TRL's hook for custom generation, grpo_trainer.py `_generate`) sampling with the
model through transformers and returning the sampled tokens' log-probs, so `sampling_per_token_logps` exists without
a vLLM server; `steps_per_generation=2` with `gradient_accumulation_steps=1` makes TRL compute
`old_per_token_logps` (generation and optimisation misaligned). Guards issue #28: "Recorders that trainers call …
test them against the real TRL objects".
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import rcdiag
from rcdiag.record.trl import record_grpo

trl = pytest.importorskip("trl")
MODEL = "sample_data/tiny-model"
pytestmark = pytest.mark.model


def _trainer(tmp_path, captured):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(MODEL)

    def rollout(prompts, trainer):
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for prompt in prompts:
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                g = trainer.model.generate(torch.tensor([ids]), do_sample=True, max_new_tokens=10, top_k=0,
                                           output_logits=True, return_dict_in_generate=True)
            completion = g.sequences[0, len(ids):].tolist()
            logprobs = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(g.logits, completion,
                                                                                             strict=True)]
            out["prompt_ids"].append(ids)
            out["completion_ids"].append(completion)
            out["logprobs"].append(logprobs)
        captured.append(out)
        return out

    args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                          num_generations=4, max_completion_length=10, steps_per_generation=2,
                          gradient_accumulation_steps=1, max_steps=4, report_to=[], save_strategy="no",
                          learning_rate=1e-3, seed=0)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    dataset = Dataset.from_dict({"prompt": ["What is 2+3?", "Sum of 4 and 5?", "7 minus 2?", "Double 6?"] * 4})
    return trl.GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]],
                           args=args, train_dataset=dataset, processing_class=tokenizer, rollout_func=rollout)


def test_record_grpo_real_trainer(tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    captured = []
    trainer = _trainer(tmp_path, captured)
    initial = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float64)
    recorder = record_grpo(trainer, tmp_path / "live", every=1)
    trainer.train()
    assert recorder.steps == [0, 2]  # one generation every steps_per_generation = 2 optimizer steps
    run = rcdiag.open_run(tmp_path / "live")
    tokens, seqs = run.tokens(), run.sequences()
    assert seqs["step"].tolist() == [0] * 8 + [2] * 8
    first = captured[0]
    for i in range(8):
        rows = tokens[tokens.seq_id == i]
        assert rows["token_id"].tolist() == first["completion_ids"][i]
        np.testing.assert_array_equal(rows["rollout_logprob"].to_numpy(), np.float32(first["logprobs"][i]))
        assert list(seqs.loc[i, "prompt_token_ids"]) == first["prompt_ids"][i]
        # the trainer side at step 0 is π_old = the initial weights: recomputed here in float64
        ids = torch.tensor([first["prompt_ids"][i] + first["completion_ids"][i]])
        with torch.no_grad():
            logits = initial(ids).logits[0, len(first["prompt_ids"][i]) - 1:-1]
        reference = torch.log_softmax(logits, -1).gather(1, ids[0, len(first["prompt_ids"][i]):, None]).squeeze(1)
        np.testing.assert_allclose(rows["train_logprob"].to_numpy(), reference.numpy(), atol=2e-4)
    assert seqs["advantage"].notna().all()
    report = rcdiag.trend(run)
    assert report["step"].tolist() == [0, 2]
