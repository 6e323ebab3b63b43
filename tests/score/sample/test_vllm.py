"""The shipped model in the real vLLM CPU engine (bf16): loads offline, templates prompts exactly like
transformers, and answers well-formed. Runs in a subprocess so the engine's memory is gone afterwards."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rcdiag.score.sample import is_well_formed

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
N_PROMPTS = 8

SCRIPT = r"""
import json, sys
from vllm import LLM, SamplingParams
model, chats = sys.argv[1], json.loads(sys.stdin.read())
llm = LLM(model=model, dtype="bfloat16", max_model_len=512, seed=0, disable_log_stats=True,
          enforce_eager=True, compilation_config={"mode": 0})  # skip the inductor compile (most of the start-up)
greedy = llm.chat(chats, SamplingParams(temperature=0.0, max_tokens=220), use_tqdm=False)
sampled = llm.chat(chats[:2], SamplingParams(temperature=1.0, max_tokens=220, logprobs=0, seed=0), use_tqdm=False)
print("RESULT " + json.dumps({
    "dtype": str(llm.llm_engine.model_config.dtype),
    "prompt_ids": [o.prompt_token_ids for o in greedy],
    "greedy": [o.outputs[0].text for o in greedy],
    "greedy_ids": [list(o.outputs[0].token_ids) for o in greedy],
    "finish": [o.outputs[0].finish_reason for o in greedy],
    "sampled_logprobs": [[next(iter(d.values())).logprob for d in o.outputs[0].logprobs] for o in sampled],
}))
"""


@pytest.fixture(scope="module")
def vllm_result(model_dir, prompts) -> dict:
    chats = [r["messages"] for r in prompts[:N_PROMPTS]]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(model_dir)], input=json.dumps(chats), env=env,
                          capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_vllm_loads_bf16_and_templates_like_transformers(vllm_result, auto_tokenizer, prompts) -> None:
    assert vllm_result["dtype"] == "torch.bfloat16"
    for ids, row in zip(vllm_result["prompt_ids"], prompts, strict=False):
        expected = auto_tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True,
                                                      return_dict=True)["input_ids"]
        assert ids == expected


def test_vllm_greedy_answers(vllm_result, auto_tokenizer) -> None:
    texts = vllm_result["greedy"]
    assert sum(map(is_well_formed, texts)) > len(texts) / 2, texts
    assert vllm_result["finish"].count("stop") > len(texts) / 2
    for text, ids in zip(texts, vllm_result["greedy_ids"], strict=True):
        assert auto_tokenizer.decode(ids, skip_special_tokens=True) == text


def test_vllm_sampled_logprobs_are_peaked(vllm_result) -> None:
    lps = [lp for seq in vllm_result["sampled_logprobs"] for lp in seq]
    assert lps and all(lp <= 0 for lp in lps)
    assert sum(lps) / len(lps) > -1.0                        # far from uniform (-log 2048 ≈ -7.6)
