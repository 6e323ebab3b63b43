"""Prompt-logprob replay of fixed tokens (real vLLM): it reproduces the processed log-probs stage 1 stored, and
`replay_run` fills the rollout side of a run that has none, resumably."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from rcdiag.errors import ConfigError, RunDirError
from rcdiag.score.generate import GenerateConfig, generate_run
from rcdiag.score.replay import replay_logprobs, replay_run
from rcdiag.store.run import open_run
from rcdiag.store.writer import write_run
from tests.fixtures.engine import ENGINE_KWARGS

pytestmark = pytest.mark.vllm

CONFIG = GenerateConfig(n=2, temperature=0.7, max_tokens=10, shard_prompts=2, limit=3, **ENGINE_KWARGS)


class Spy:
    def __init__(self, llm: Any) -> None:
        self.llm, self.calls = llm, 0
        self.llm_engine = llm.llm_engine

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.llm.generate(*args, **kwargs)


@pytest.fixture(scope="module")
def generated(vllm_engine: Any, sample_model: Path, tmp_path_factory: pytest.TempPathFactory):
    from rcdiag.score.sample import SAMPLE_PROMPTS

    out = tmp_path_factory.mktemp("replay") / "gen"
    generate_run(sample_model, SAMPLE_PROMPTS, out, CONFIG, llm=vllm_engine, silent=True)
    return open_run(out)


def inputs(run: Any) -> tuple[list, list, np.ndarray]:
    tokens, seqs = run.tokens(), run.sequences()
    responses = [tokens[tokens.seq_id == s].token_id.tolist() for s in seqs.seq_id]
    return [list(p) for p in seqs.prompt_token_ids], responses, tokens.rollout_logprob.to_numpy()


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_replay_reproduces_processed_logprobs(generated, vllm_engine: Any, temperature: float) -> None:
    """Replaying the sampled tokens (prefill) at the sampling temperature gives the decode-time processed
    log-probs; at another temperature it must not (so the check can fail)."""
    prompts, responses, stored = inputs(generated)
    got = np.concatenate(replay_logprobs(vllm_engine, prompts, responses, temperature))
    diff = np.abs(got - stored)
    if temperature == CONFIG.temperature:
        assert diff.max() < 1e-4, f"max |Δ| {diff.max():.3g} at token row {diff.argmax()}"
    else:
        assert diff.max() > 1e-2


def test_replay_edge_cases(vllm_engine: Any) -> None:
    out = replay_logprobs(vllm_engine, [[1, 5], [1]], [[], [7]], 0.5)
    assert out[0].shape == (0,) and out[1].shape == (1,) and out[1][0] < 0
    with pytest.raises(ConfigError, match="> 0"):
        replay_logprobs(vllm_engine, [[1]], [[2]], 0.0)
    with pytest.raises(ValueError, match="at least one token"):
        replay_logprobs(vllm_engine, [[]], [[2]], 1.0)


def without_rollout(run: Any, path: Path, drop_prompt_ids: bool = False) -> Path:
    """An imported-like run: the generated tokens without rollout log-probs and without an engine section."""
    table, seqs = run.token_table(), run.sequence_table()
    table = table.set_column(3, "rollout_logprob", pa.nulls(table.num_rows, pa.float32()))
    if drop_prompt_ids:
        index = seqs.schema.get_field_index("prompt_token_ids")
        seqs = seqs.set_column(index, "prompt_token_ids", pa.nulls(seqs.num_rows, pa.list_(pa.int32())))
    write_run(path, table, seqs, {"source": {"kind": "imported:jsonl", "retokenized": True}}, shard_tokens=30)
    return path


def test_replay_run_fills_rollout_side(generated, vllm_engine: Any, sample_model: Path, tmp_path: Path) -> None:
    path = without_rollout(generated, tmp_path / "imported")
    assert len(open_run(path).token_files) > 1
    manifest = replay_run(path, sample_model, replace(CONFIG, temperature=0.7), llm=vllm_engine, silent=True)
    got = open_run(path).tokens().rollout_logprob.to_numpy()
    diff = np.abs(got - generated.tokens().rollout_logprob.to_numpy())
    assert diff.max() < 1e-4, f"max |Δ| {diff.max():.3g} at token row {diff.argmax()}"
    engine = manifest["engine"]
    assert engine["replayed"] is True and engine["temperature"] == 0.7 and engine["logprobs_mode"] == \
        "processed_logprobs"
    assert manifest["source"]["kind"] == "imported:jsonl"
    spy = Spy(vllm_engine)
    replay_run(path, sample_model, replace(CONFIG, temperature=0.7), llm=spy, silent=True)
    assert spy.calls == 0, "replayed shards were replayed again"
    with pytest.raises(ConfigError, match="records sampling temperature 0.7; replay with --temperature 0.7"):
        replay_run(path, sample_model, replace(CONFIG, temperature=1.0), llm=vllm_engine)


def test_replay_run_refusals(generated, vllm_engine: Any, sample_model: Path, tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="already holds rollout log-probs; pass --overwrite"):
        replay_run(generated.path, sample_model, replace(CONFIG, temperature=0.7), llm=vllm_engine)
    path = without_rollout(generated, tmp_path / "noprompt", drop_prompt_ids=True)
    with pytest.raises(RunDirError, match="seq 0 has no prompt_token_ids"):
        replay_run(path, sample_model, CONFIG, llm=vllm_engine)
