"""`rcdiag import`'s context options and what each format's path prints next (issues #44, #45): the engine's dtype,
quantization, KV-cache dtype and sampling settings, the model's architecture from --model / --tokenizer's config,
the trainer's own correction settings in its framework's names — recorded in the manifest with their provenance,
refused with a usage error when malformed. The verl gen-batch dump (verl @ 1dda039 SkipManager layout) holds the
rollout side only: the import says so and prints the one right next command."""
from __future__ import annotations

import json

import pytest

import rcdiag
from rcdiag.cli import main
from tests.importers.dumps import make_truth
from tests.importers.verl_dumps import save_rollout_skip

MODEL = "sample_data/tiny-model"


@pytest.fixture
def verl_dump(tmp_path):
    pytest.importorskip("tensordict")
    save_rollout_skip(tmp_path / "dump", make_truth(seed=5, n=6), tmp_path / "pkgs", train_step=7, current=True)
    return tmp_path / "dump"


def test_verl_dump_prints_rescore_only_and_records_the_context(verl_dump, tmp_path, capsys):
    code = main(["import", "verl", str(verl_dump), "--out", str(tmp_path / "run"), "--allow-pickle", "-q",
                 "--engine-dtype", "bf16", "--kv-cache-dtype", "fp8", "--model", MODEL,
                 "--trainer-setting", "rollout_is=token", "--trainer-setting", "rollout_is_threshold=2.0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("--rescore") == 1
    assert out.strip().endswith(f"Next: rcdiag score --rescore-only {tmp_path / 'run'} --train-model MODEL   (the "
                                f"trainer side; then: rcdiag report {tmp_path / 'run'})")
    assert "lacks       old_log_probs (the trainer side" in out
    info = rcdiag.open_run(tmp_path / "run").info
    assert (info.engine.engine_dtype, info.engine.kv_cache_dtype, info.engine.temperature) == (
        "bfloat16", "fp8", 1.0)  # T from the dump's meta_info, the rest stated
    assert info.provenance["engine.engine_dtype"] == "rcdiag import (user: --engine-dtype)"
    assert info.provenance["engine.temperature"] == "the dump's meta_info (verl)"
    assert info.model.architecture == "dense" and info.model.model_type == "qwen2"
    assert info.trainer.framework == "verl" and info.trainer.correction.mode == "token_truncate"
    assert info.measured.trainer is None  # the trainer side is still to be computed
    assert rcdiag.open_run(tmp_path / "run").sequences()["step"].unique().tolist() == [7]


def test_the_tokenizers_config_gives_the_architecture(verl_dump, tmp_path):
    assert main(["import", "verl", str(verl_dump), "--out", str(tmp_path / "run"), "--allow-pickle", "-q",
                 "--tokenizer", "sample_data/tiny-moe"]) == 0
    info = rcdiag.open_run(tmp_path / "run").info
    assert (info.model.architecture, info.model.num_experts) == ("moe", 8)
    assert info.provenance["model"].endswith("tiny-moe/config.json (--tokenizer)")


@pytest.mark.parametrize("argv, message", [
    (["--engine-dtype", "fp7"], "--engine-dtype 'fp7' is not one of bfloat16, float16, float32"),
    (["--architecture", "sparse"], "--architecture 'sparse': one of dense, moe"),
    (["--trainer-setting", "rollout_iss=token"], "did you mean 'rollout_is'"),
    (["--trainer-setting", "vllm_importance_sampling_mode=tokn_mask"], "vllm_importance_sampling_mode="),
    (["--model", "sample_data"], "no config.json there"),
    (["--architecture", "moe", "--model", MODEL], "the model's config says dense"),
])
def test_bad_context_options_are_refused(verl_dump, tmp_path, capsys, argv, message):
    code = main(["import", "verl", str(verl_dump), "--out", str(tmp_path / "run"), "--allow-pickle", "-q", *argv])
    assert code != 0
    text = " ".join(capsys.readouterr().err.split())
    assert message in text, text
    assert not (tmp_path / "run").exists()


def test_import_help_describes_every_format(capsys, monkeypatch):
    from rcdiag.importers import FORMATS

    monkeypatch.setenv("COLUMNS", "250")
    assert main(["import", "--help"]) == 0
    flat = " ".join(capsys.readouterr().out.replace("│", " ").split())  # rich's panel borders out
    for name, (_, what) in FORMATS.items():
        assert f"{name} ({' '.join(what.split())[:30]}" in flat, name


def test_manifest_without_context_reads_as_before(tmp_path):
    run = tmp_path / "old"
    rcdiag.write_run(run, __import__("pandas").DataFrame({"seq_id": [0], "pos": [0], "token_id": [1],
                                                          "rollout_logprob": [-1.0], "train_logprob": [-1.1]}))
    manifest = json.loads((run / "manifest.json").read_text())
    assert "model" not in manifest and "provenance" not in manifest


def test_write_run_as_the_readme_writes_it(tmp_path):
    """`rcdiag.write_run(path, tokens, sequences, manifest)` (positional, as the README writes it: it raised
    TypeError) and `tokenizer=` attaching the policy's tokenizer, so tokens show as text."""
    import pandas as pd

    tokens = pd.DataFrame({"seq_id": [0, 0], "pos": [0, 1], "token_id": [5, 6], "rollout_logprob": [-1.0, -0.5],
                           "train_logprob": [-1.1, -0.4], "mask": [True, True]})
    run = rcdiag.write_run(tmp_path / "run", tokens, None, {"engine": {"temperature": 1.0}}, tokenizer=MODEL)
    assert run.info.engine.temperature == 1.0 and run.info.tokenizer.path.endswith("tiny-model")
    batches = list(run.iter_batches())
    assert isinstance(batches[0], tuple) and batches[0][0].startswith("tokens/")  # (file, batch), as documented
