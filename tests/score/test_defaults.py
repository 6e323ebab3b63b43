"""Safe defaults of `rcdiag score` / `rcdiag probe`: the trainer device (auto, checked before any engine starts),
one model identity on both sides, the resolved dtypes in the context line."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rcdiag.errors import ConfigError
from rcdiag.report.context import context_line
from rcdiag.score.config import RescoreConfig
from rcdiag.score.devices import resolve_device
from rcdiag.score.engine import model_files_hash
from rcdiag.score.rescore import trainer_settings
from rcdiag.score.sample import SAMPLE_MODEL

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def test_auto_is_the_default_and_resolves_to_what_exists() -> None:
    """The default was cpu: a 7B model rescored in fp32 on the CPU of a GPU box unless the user spotted --device."""
    assert RescoreConfig().device == "auto"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("CPU") == "cpu" == resolve_device(resolve_device("cpu"))


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cuda0", "", "tpu"])
def test_a_misspelt_device_is_refused_without_torch(name: str) -> None:
    """A typo'd device was accepted by the config and failed only inside torch, after generation."""
    with pytest.raises(ConfigError, match="--device"):
        RescoreConfig(device=name)


@NO_CUDA
def test_cuda_without_cuda_fails_before_generation(tmp_path: Path) -> None:
    """`--device cuda` without CUDA ran vLLM's start-up and the whole generation, then failed. The device check
    must come first: here the prompts file does not exist, and the error is still the device's."""
    from rcdiag.score.run import score_run

    with pytest.raises(ConfigError, match="CUDA is not available"):
        score_run(tmp_path / "run", model=SAMPLE_MODEL, prompts=tmp_path / "missing.jsonl",
                  rescore=RescoreConfig(device="cuda"), silent=True)
    assert not (tmp_path / "run").exists()


@NO_CUDA
def test_cli_device_cuda_fails_in_seconds(tmp_path: Path) -> None:
    """The CLI path: exit 1 with the fix in one line, no traceback, before vLLM is imported."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rcdiag", "score", "-m", str(SAMPLE_MODEL), "-p",
                           str(SAMPLE_MODEL.parent / "prompts.jsonl"), "-o", str(tmp_path / "run"),
                           "--device", "cuda", "--limit", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "CUDA is not available" in done.stderr and "Traceback" not in done.stderr
    assert time.perf_counter() - start < 60 and not (tmp_path / "run").exists()


@NO_CUDA
def test_probe_refuses_cuda_before_any_engine(tmp_path: Path) -> None:
    """The probe builds vLLM engines first: a bad device must be refused before them, not after."""
    from rcdiag.probe.run import ProbeConfig, run_probe

    with pytest.raises(ConfigError, match="CUDA is not available"):
        run_probe(tmp_path / "no-such-run", ProbeConfig(device="cuda"), silent=True)


def test_engine_and_trainer_record_one_identity(tmp_path: Path) -> None:
    """The engine hashed config + weight names/sizes and the trainer every weight byte, so the two hashes of one
    directory could never match and "did both sides load the same weights?" had no answer."""
    from rcdiag.score.scoring import load_model

    model = load_model(SAMPLE_MODEL, dtype="float32", device="cpu")
    trainer = trainer_settings(str(SAMPLE_MODEL), model, RescoreConfig(device="cpu"), 1.0, "eager")
    assert trainer["model_hash"] == model_files_hash(SAMPLE_MODEL)


def test_identity_sees_changed_weights_not_only_names_and_sizes(tmp_path: Path) -> None:
    """Same names, shapes and sizes, other values (a retrained checkpoint): the identity must differ; a copy
    keeps it."""
    copy = tmp_path / "copy"
    shutil.copytree(SAMPLE_MODEL, copy)
    assert model_files_hash(copy) == model_files_hash(SAMPLE_MODEL)
    weights = load_file(copy / "model.safetensors")
    save_file({k: v * 1.01 for k, v in weights.items()}, copy / "model.safetensors", metadata={"format": "pt"})
    assert (copy / "model.safetensors").stat().st_size == (SAMPLE_MODEL / "model.safetensors").stat().st_size
    assert model_files_hash(copy) != model_files_hash(SAMPLE_MODEL)


def test_context_line_shows_the_resolved_engine_dtype() -> None:
    """The header read 'engine vLLM 0.32.0 (auto, …)' while the manifest had dtype_resolved 'bfloat16'."""
    manifest = {"engine": {"name": "vllm", "version": "0.32.0", "engine_dtype": "auto", "dtype_resolved": "bfloat16",
                           "temperature": 1.0, "top_p": 1.0, "top_k": None, "logprobs_mode": "processed_logprobs"},
                "trainer": {"transformers_version": "5.19.0", "dtype": "float32", "attn_implementation": "sdpa_varlen",
                            "temperature": 1.0, "device": "cpu"}}
    line = context_line(manifest)
    assert "(bfloat16, T=1" in line and "auto" not in line
    assert line.endswith("(float32, sdpa_varlen, T=1, cpu)")
    del manifest["engine"]["dtype_resolved"]
    assert "(auto, T=1" in context_line(manifest)  # an older manifest: what was requested
