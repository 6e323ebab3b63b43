"""The manifest says what each side measured (Manifest.measured): sampled log-probs or a prefill replay; π_old or π_θ.

Guards user-review-3 §5: a text import + `rcdiag score --rescore-both` measures vLLM re-reading the tokens
(prefill), and the report presented it as the rollout ("replayed: true" only inside the collapsed manifest).
"""
from __future__ import annotations

import json

import pandas as pd
import pytest

from rcdiag.errors import RunDirError
from rcdiag.importers import ImportOptions, import_run
from rcdiag.report.context import context_line
from rcdiag.store.manifest import Manifest, load_manifest, update_manifest
from rcdiag.store.writer import write_run
from tests.importers.dumps import make_truth, train_tokenizer

# the engine section rcdiag.score.replay.replay_run writes after --rescore-both's replay (keys as there)
REPLAY_ENGINE = {"name": "vllm", "version": "0.32.0", "model": "/m", "logprobs_mode": "processed_logprobs",
                 "replayed": True, "temperature": 1.0, "top_p": 1.0, "top_k": None, "engine_dtype": "bfloat16",
                 "replay_method": "raw prompt log-probs → log_softmax(raw / T)"}


def test_text_import_then_replay_says_prefill_replay(tmp_path):
    """A retokenized TRL text import, replayed: measured.rollout is prefill_replay and the context line says
    'rollout = prefill replay of the text'."""
    (tmp_path / "c").mkdir()
    pd.DataFrame({"step": [1], "prompt": ["hello world"], "completion": ["it is five"]}).to_parquet(
        tmp_path / "c/completions_00001.parquet")
    tokenizer = train_tokenizer(tmp_path / "model")
    run, _ = import_run("trl", tmp_path / "c", tmp_path / "run", ImportOptions(quiet=True, tokenizer=str(tokenizer)))
    assert run.info.measured.rollout is None  # text: no rollout side yet
    update_manifest(run.path, {"engine": REPLAY_ENGINE})
    manifest = load_manifest(run.path)
    assert manifest.measured.rollout == "prefill_replay"
    line = context_line(manifest.to_dict())
    assert line.endswith("· rollout = prefill replay of the text"), line


def test_replay_over_sampled_log_probs_wins(tmp_path):
    """A run imported with sampled log-probs and replayed with --overwrite: the replay replaced them."""
    truth = make_truth(seed=70, n=3)
    rows = [{"response_ids": t.response, "logprobs": t.rollout.tolist()} for t in truth]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run, _ = import_run("jsonl", tmp_path / "r.jsonl", tmp_path / "run", ImportOptions(quiet=True))
    assert run.info.measured.rollout == "sampled" and run.manifest["measured"] == {"rollout": "sampled"}
    assert "prefill replay" not in context_line(run.manifest)
    update_manifest(run.path, {"engine": REPLAY_ENGINE})
    manifest = load_manifest(run.path).to_dict()
    assert manifest["measured"]["rollout"] == "prefill_replay"
    assert "rollout = prefill replay of the stored tokens" in context_line(manifest)


def test_generated_and_old_manifests(tmp_path):
    """A generated run reads as sampled; a rescored trainer side as π_old; an old manifest without `measured`
    opens; a value outside the vocabulary is refused naming the field."""
    raw = {"schema_version": 1, "source": {"kind": "generated"}, "engine": {"name": "vllm"},
           "trainer": {"model": "/m", "dtype": "float32"}}
    manifest = Manifest.from_dict(raw)
    assert (manifest.measured.rollout, manifest.measured.trainer) == ("sampled", "pi_old")
    assert Manifest.from_dict({"schema_version": 1}).measured.rollout is None
    with pytest.raises(RunDirError, match=r"field 'measured.rollout' is 'replay'"):
        Manifest.from_dict({"schema_version": 1, "measured": {"rollout": "replay"}})


def test_pi_theta_is_in_the_context_line(tmp_path):
    tokens = pd.DataFrame({"seq_id": [0], "pos": [0], "rollout_logprob": [-1.0], "train_logprob": [-1.0]})
    run = write_run(tmp_path / "r", tokens, manifest={"measured": {"rollout": "sampled",
                                                                   "trainer": "pi_theta_microstep"}})
    assert "trainer = π_θ at the micro-step (not π_old)" in context_line(run.manifest)
