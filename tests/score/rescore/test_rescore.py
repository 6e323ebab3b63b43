"""The rescoring stage on run directories: written columns, shard markers, resume, manifest, refusals."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from rcdiag.errors import ConfigError, InputError, RunDirError
from rcdiag.score.rescore import RESCORED_KEY, RescoreConfig, rescore_run
from rcdiag.score.scoring import RescoreWarning
from rcdiag.store.run import open_run
from tests.score.rescore.helpers import (
    VOCAB,
    build_model_dir,
    make_run,
    random_pairs,
    reference_logprobs,
    save_tokenizer,
)


@pytest.fixture()
def pairs() -> list[tuple[list[int], list[int]]]:
    return random_pairs(np.random.default_rng(7), 30) + [([3], [])]


def _engine(model_dir, temperature=0.8) -> dict:
    return {"model": str(model_dir), "temperature": temperature}


def test_rescore_writes_train_columns_against_float64(tmp_path, model_dir, model64, pairs) -> None:
    run = make_run(tmp_path / "run", pairs, engine=_engine(model_dir), shard_tokens=150)
    before = run.tokens()
    manifest = rescore_run(run.path, RescoreConfig(token_budget=64, chunk_tokens=50), silent=True)
    after = open_run(run.path).tokens()
    assert len(run.token_files) > 2
    for column in ("seq_id", "pos", "token_id", "rollout_logprob", "mask"):
        assert after[column].equals(before[column]), column
    assert after["train_logprob"].dtype == np.float32 and after["train_entropy"].dtype == np.float32
    reference = reference_logprobs(model64, pairs, temperature=0.8)
    want_lp = np.concatenate([lp for lp, _ in reference])
    want_ent = np.concatenate([ent for _, ent in reference])
    err_lp = np.abs(after["train_logprob"].to_numpy() - want_lp)
    assert err_lp.max() <= 1e-5, f"max |Δ logprob| {err_lp.max():.3g} at token row {err_lp.argmax()}"
    assert np.abs(after["train_entropy"].to_numpy() - want_ent).max() <= 1e-5
    trainer = manifest["trainer"]
    assert trainer["temperature"] == 0.8 and trainer["attn_implementation"] == "sdpa_varlen"
    assert trainer["dtype"] == "float32" and trainer["token_budget"] == 64 and trainer["chunk_tokens"] == 50
    assert trainer["model"] == str(model_dir.resolve()) and trainer["model_hash"].startswith("sha256:")
    assert len(trainer["model_hash"]) == len("sha256:") + 64
    assert open_run(run.path).manifest["trainer"] == trainer
    for file in open_run(run.path).token_files:
        assert json.loads(pq.read_schema(file).metadata[RESCORED_KEY]) == trainer


def test_resume_skips_rescored_shards_and_redoes_the_rest(tmp_path, model_dir, pairs) -> None:
    """After an interruption some shards are rescored (atomic rename) and others untouched; a rerun with the
    same settings must rescore only the untouched ones, and a rerun with other settings must redo all."""
    run = make_run(tmp_path / "run", pairs, engine=_engine(model_dir), shard_tokens=150)
    pristine = {f.name: f.read_bytes() for f in run.token_files}
    config = RescoreConfig(token_budget=64)
    rescore_run(run.path, config, silent=True)
    done = {f.name: f.read_bytes() for f in run.token_files}
    names = sorted(done)
    for name in names[1:]:  # the state an interrupted run leaves: shard 0 done, the others not yet
        (run.path / "tokens" / name).write_bytes(pristine[name])
    (run.path / "tokens" / f".{names[1]}.tmp").write_bytes(b"half-written")
    first_mtime = (run.path / "tokens" / names[0]).stat().st_mtime_ns
    rescore_run(run.path, config, silent=True)
    assert (run.path / "tokens" / names[0]).stat().st_mtime_ns == first_mtime, "a done shard was rewritten"
    for name in names:
        assert pq.read_table(run.path / "tokens" / name).equals(pq.read_table(tmp_path / "run" / "tokens" / name))
        assert open_run(run.path).token_table().column("train_logprob").null_count == 0
    rescore_run(run.path, RescoreConfig(token_budget=64, train_dtype="bfloat16"), silent=True)
    assert (run.path / "tokens" / names[0]).stat().st_mtime_ns != first_mtime
    marker = json.loads(pq.read_schema(run.path / "tokens" / names[0]).metadata[RESCORED_KEY])
    assert marker["dtype"] == "bfloat16"


def test_missing_temperature_warns_and_uses_one(tmp_path, model_dir, model64) -> None:
    pairs = random_pairs(np.random.default_rng(8), 5, response=(1, 10))
    run = make_run(tmp_path / "run", pairs, engine={"model": str(model_dir)})
    with pytest.warns(RescoreWarning, match="no engine.temperature"):
        manifest = rescore_run(run.path, silent=True)
    assert manifest["trainer"]["temperature"] == 1.0
    want = np.concatenate([lp for lp, _ in reference_logprobs(model64, pairs)])
    assert np.abs(open_run(run.path).tokens()["train_logprob"].to_numpy() - want).max() <= 1e-5


def _assert_untouched(run, before: dict[str, bytes]) -> None:
    assert {f.name: f.read_bytes() for f in run.token_files} == before, "a refusal must come before any work"
    assert "trainer" not in open_run(run.path).manifest


@pytest.mark.parametrize("defect, error, pattern", [
    ("token_out_of_range", InputError, r"sequences/part-\d+\.parquet row \d+ field 'token_id'.*outside"),
    ("prompt_out_of_range", InputError, r"field 'prompt_token_ids'.*outside the model's vocabulary"),
    ("too_long", InputError, r"field 'prompt_len'.*context is 160"),
    ("null_prompt", InputError, r"field 'prompt_token_ids'.*prompt_token_ids is null"),
    ("gap", InputError, r"tokens/part-\d+\.parquet row \d+ field 'pos'.*has position"),
    ("null_token", InputError, r"field 'token_id'.*token_id is null"),
])
def test_refusals_before_any_work(tmp_path, model_dir, pairs, defect, error, pattern) -> None:
    """Each defect sits in the LAST shard, so a refusal after work had started would have modified shard 0."""
    import pandas as pd

    last = len(pairs) - 2  # a sequence with a response, in the last shard
    if defect == "token_out_of_range":
        pairs[last][1][0] = VOCAB
    elif defect == "prompt_out_of_range":
        pairs[last][0][0] = VOCAB + 5
    elif defect == "too_long":
        pairs[last] = ([1] * 100, [2] * 70)
    run = make_run(tmp_path / "run", pairs, engine=_engine(model_dir), shard_tokens=150)
    if defect in ("null_prompt", "gap", "null_token"):
        tokens = run.tokens(["seq_id", "pos", "token_id", "rollout_logprob"])
        sequences = run.sequences(["seq_id", "prompt_token_ids"])
        if defect == "null_prompt":
            sequences["prompt_token_ids"] = sequences["prompt_token_ids"].astype(object)
            sequences.at[last, "prompt_token_ids"] = None
        elif defect == "gap":
            tokens = tokens.drop(tokens.index[(tokens.seq_id == last) & (tokens.pos == 1)])
        else:
            tokens["token_id"] = tokens["token_id"].astype("Int32")
            tokens.loc[tokens.seq_id == last, "token_id"] = pd.NA
        run = make_run_frames(tmp_path / "run", tokens, sequences, model_dir)
    before = {f.name: f.read_bytes() for f in run.token_files}
    with pytest.raises(error, match=pattern):
        rescore_run(run.path, silent=True)
    _assert_untouched(run, before)


def make_run_frames(path, tokens, sequences, model_dir):
    from rcdiag.store.writer import write_run

    return write_run(path, tokens, sequences, {"engine": _engine(model_dir)}, shard_tokens=150, overwrite=True)


def test_refuses_a_training_model_with_another_vocabulary(tmp_path, model_dir, pairs) -> None:
    run = make_run(tmp_path / "run", pairs, engine=_engine(model_dir))
    before = {f.name: f.read_bytes() for f in run.token_files}
    bigger = build_model_dir(tmp_path / "bigger", vocab_size=VOCAB + 64)
    with pytest.raises(ConfigError, match=f"vocab_size {VOCAB + 64} but the run's engine model .* has {VOCAB}"):
        rescore_run(run.path, RescoreConfig(train_model=str(bigger)), silent=True)
    shuffled = build_model_dir(tmp_path / "shuffled", seed=1)
    save_tokenizer(shuffled, [f"w{i}" for i in range(VOCAB - 2)] + [f"w{VOCAB - 1}", f"w{VOCAB - 2}"])
    with pytest.raises(ConfigError, match=f"tokenizer of --train-model .* differs.*id {VOCAB - 2}"):
        rescore_run(run.path, RescoreConfig(train_model=str(shuffled)), silent=True)
    _assert_untouched(run, before)


def test_refuses_on_the_manifest_tokenizer_record(tmp_path, model_dir, pairs) -> None:
    from rcdiag.score.tokenizer_check import tokenizer_fingerprint

    good = tokenizer_fingerprint(model_dir)
    run = make_run(tmp_path / "run", pairs, engine=_engine(model_dir),
                   manifest={"tokenizer": {"vocab_size": good["vocab_size"], "hash": good["hash"]}})
    rescore_run(run.path, silent=True)  # same tokenizer: accepted
    for record, pattern in (({"vocab_size": VOCAB + 7}, f"has {VOCAB + 7} tokens"),
                            ({"hash": "vocab-sha256:" + "0" * 64}, "differs from the run's")):
        run = make_run(tmp_path / "run", pairs, engine=_engine(model_dir), manifest={"tokenizer": record})
        with pytest.raises(ConfigError, match=pattern):
            rescore_run(run.path, silent=True)


def test_configuration_errors(tmp_path, model_dir, pairs) -> None:
    run = make_run(tmp_path / "run", pairs, engine={"temperature": 1.0})
    with pytest.raises(ConfigError, match="names no engine model; pass --train-model"):
        rescore_run(run.path, silent=True)
    with pytest.raises(ConfigError, match="--train-dtype 'fp8'"):
        RescoreConfig(train_dtype="fp8")
    with pytest.raises(ConfigError, match="--token-budget must be ≥ 1"):
        RescoreConfig(token_budget=0)
    with pytest.raises(ConfigError, match="--attn 'fast'"):
        RescoreConfig(attn="fast")
    with pytest.raises(ConfigError, match="runs on cuda only"):
        rescore_run(run.path, RescoreConfig(train_model=str(model_dir), attn="flash_attention_2"), silent=True)
    with pytest.raises(RunDirError, match="'engine.temperature' is 'hot'"):  # refused when written ...
        make_run(tmp_path / "bad", pairs, engine={"model": str(model_dir), "temperature": "hot"})
    bad = make_run(tmp_path / "bad", pairs, engine={"model": str(model_dir)})
    damaged = json.loads((bad.path / "manifest.json").read_text())
    damaged["engine"]["temperature"] = "hot"
    (bad.path / "manifest.json").write_text(json.dumps(damaged))
    with pytest.raises(RunDirError, match="'engine.temperature' is 'hot'"):  # ... and when read
        rescore_run(bad.path, silent=True)
    shutil.rmtree(tmp_path / "bad")
    with pytest.raises(RunDirError):
        rescore_run(tmp_path / "bad", silent=True)


def test_cli_rescore_only_then_api(tmp_path, model_dir, pairs, capsys) -> None:
    """`rcdiag score --rescore-only RUN` runs this stage; a refusal is one `Error:` line and exit code 1."""
    from rcdiag.cli import main

    run = make_run(tmp_path / "run", pairs, engine=_engine(model_dir))
    assert main(["score", "--rescore-only", str(run.path), "--token-budget", "48", "--chunk-tokens", "16",
                 "--quiet"]) == 0
    trainer = open_run(run.path).manifest["trainer"]
    assert trainer["token_budget"] == 48 and trainer["chunk_tokens"] == 16 and trainer["temperature"] == 0.8
    assert open_run(run.path).token_table().column("train_logprob").null_count == 0
    capsys.readouterr()
    assert main(["score", "--rescore-only", str(run.path), "--train-dtype", "fp8", "--quiet"]) == 2  # usage
    assert "Error: Invalid value: --train-dtype 'fp8' is not one of float32" in capsys.readouterr().err


def test_progress_estimate_never_passes_the_total() -> None:
    """The rescore bar advances by an estimate per packed row (input tokens scaled to response tokens); it must stop
    at the shard's response-token total — before, make demo ended with tqdm's 'clamping frac to range [0, 1]'."""
    import io

    from tqdm import tqdm

    from rcdiag.score.rescore import advance

    with tqdm(total=100, file=io.StringIO()) as bar:  # a real bar (a disabled one does not count)
        for _ in range(7):
            advance(bar, 20.0, 100)
        assert bar.n == 100
        advance(bar, 5.0, 100)
        assert bar.n == 100
