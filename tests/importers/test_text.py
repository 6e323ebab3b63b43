"""TRL / ms-swift text-only importers: retokenized with a real (tiny, locally trained) tokenizer."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from transformers import AutoTokenizer

from rcdiag.errors import ConfigError, InputError
from rcdiag.importers import ImportOptions, import_run
from tests.importers.dumps import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok"))


def _ids(tokenizer_dir, text):
    return AutoTokenizer.from_pretrained(tokenizer_dir)(text, add_special_tokens=False)["input_ids"]


def test_trl_parquet(tmp_path, tokenizer_dir):
    """TRL completions_{step:05d}.parquet: step, prompt, completion, one column per reward function, advantage."""
    folder = tmp_path / "out/completions"
    folder.mkdir(parents=True)
    for step in (10, 20):
        pd.DataFrame({"step": [step] * 2, "prompt": ["what is six times seven", "hello world"],
                      "completion": ["the answer is 42", ""], "accuracy_reward": [1.0, 0.0],
                      "format_reward": [0.5, 0.5], "advantage": [0.7, -0.7]}).to_parquet(
            folder / f"completions_{step:05d}.parquet")
    run, imported = import_run("trl", tmp_path / "out", tmp_path / "run",
                               ImportOptions(quiet=True, tokenizer=str(tokenizer_dir)))
    tokens, seqs = run.tokens(), run.sequences()
    assert seqs["step"].tolist() == [10, 10, 20, 20]
    assert seqs["reward"].tolist() == [1.5, 0.5, 1.5, 0.5]  # reward columns summed, advantage left out
    expected = _ids(tokenizer_dir, "the answer is 42")
    assert tokens[tokens.seq_id == 0]["token_id"].tolist() == expected
    assert seqs["response_len"].tolist() == [len(expected), 0, len(expected), 0]
    assert list(seqs.loc[0, "prompt_token_ids"]) == _ids(tokenizer_dir, "what is six times seven")
    assert tokens["rollout_logprob"].isna().all() and tokens["train_logprob"].isna().all()
    assert tokens["mask"].all()
    source = run.manifest["source"]
    assert source["retokenized"] is True and source["kind"] == "imported:trl"
    assert any(item.startswith("rollout logprobs and trainer logprobs") for item in source["lacks"])


def test_trl_conversational_prompt_uses_chat_template(tmp_path, tokenizer_dir):
    messages = [{"role": "user", "content": "what is six times seven"}]
    pd.DataFrame({"step": [1], "prompt": [messages], "completion": [[{"role": "assistant", "content": "it is 42"}]],
                  "r": [1.0]}).to_parquet(tmp_path / "completions_00001.parquet")
    run, _ = import_run("trl", tmp_path / "completions_00001.parquet", tmp_path / "run",
                        ImportOptions(quiet=True, tokenizer=str(tokenizer_dir)))
    seqs = run.sequences()
    templated = "<|user|>what is six times seven\n<|assistant|>"
    assert seqs.loc[0, "prompt_text"] == templated
    assert list(seqs.loc[0, "prompt_token_ids"]) == _ids(tokenizer_dir, templated)
    assert run.tokens()["token_id"].tolist() == _ids(tokenizer_dir, "it is 42")


def test_swift_columnar_jsonl(tmp_path, tokenizer_dir):
    """ms-swift completions.jsonl: one line per logging step, a dict of equal-length lists; Megatron's gen_step."""
    lines = [{"gen_step": ["3", "3"], "prompt": ["<|user|>hello world\n<|assistant|>", "compute the sum"],
              "completion": ["it is five", "the answer is 42"], "acc": [1.0, 0.0], "advantages": [1.0, -1.0]},
             {"gen_step": ["4"], "prompt": ["hello"], "completion": ["world"], "acc": [0.0], "advantages": [0.0]}]
    (tmp_path / "completions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run, imported = import_run("swift", tmp_path, tmp_path / "run",
                               ImportOptions(quiet=True, tokenizer=str(tokenizer_dir)))
    seqs, tokens = run.sequences(), run.tokens()
    assert seqs["step"].tolist() == [3, 3, 4] and seqs["reward"].tolist() == [1.0, 0.0, 0.0]
    for seq_id, text in enumerate(["it is five", "the answer is 42", "world"]):
        assert tokens[tokens.seq_id == seq_id]["token_id"].tolist() == _ids(tokenizer_dir, text)
    assert run.manifest["source"]["conventions"]["step_field"] == "gen_step"


def test_text_errors(tmp_path, tokenizer_dir):
    (tmp_path / "completions.jsonl").write_text(json.dumps({"prompt": ["a", "b"], "completion": ["c"]}) + "\n")
    opts = ImportOptions(quiet=True, tokenizer=str(tokenizer_dir))
    with pytest.raises(InputError, match="row 1 field 'prompt': expected columnar lines"):
        import_run("swift", tmp_path, tmp_path / "run", opts)
    with pytest.raises(ConfigError, match="need --tokenizer"):
        import_run("swift", tmp_path, tmp_path / "run", ImportOptions(quiet=True))
    with pytest.raises(ConfigError, match="cannot load a tokenizer offline"):
        import_run("swift", tmp_path, tmp_path / "run", ImportOptions(quiet=True, tokenizer=str(tmp_path / "no")))
    pd.DataFrame({"step": [1], "prompt": ["x"]}).to_parquet(tmp_path / "completions_00001.parquet")
    with pytest.raises(InputError, match="row 1 field 'completion': missing field"):
        import_run("trl", tmp_path / "completions_00001.parquet", tmp_path / "run", opts)
    assert not (tmp_path / "run").exists()


def test_verl_rollout_data_dir(tmp_path, tokenizer_dir):
    """verl trainer.rollout_data_dir: {step}.jsonl with input/output/gts/score/step(+uid); steps in numeric order."""
    for step in (10, 2):
        rows = [{"input": "what is six times seven", "output": "it is 42", "gts": "42", "score": 1.0 * step,
                 "step": step, "acc": 1.0, "uid": f"u{step}"}]
        (tmp_path / f"{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run, imported = import_run("verl-text", tmp_path, tmp_path / "run",
                               ImportOptions(quiet=True, tokenizer=str(tokenizer_dir)))
    seqs = run.sequences()
    assert seqs["step"].tolist() == [2, 10] and seqs["reward"].tolist() == [2.0, 10.0]  # score only, no extras
    assert seqs["prompt_id"].tolist() == ["u2", "u10"]
    assert run.tokens()[lambda t: t.seq_id == 0]["token_id"].tolist() == _ids(tokenizer_dir, "it is 42")
    assert run.manifest["source"]["retokenized"] is True
    assert "skip_special_tokens=True" in run.manifest["source"]["lacks"][0]
