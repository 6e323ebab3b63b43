"""Engine helpers that need no engine: the start-up scan guard, model hashes, settings validation."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rcdiag.errors import ConfigError
from rcdiag.score.engine import (
    EngineSettings,
    _breaks_vllm_scan,
    _scan_safe_modules,
    check_model_dir,
    model_files_hash,
)


def test_scan_guard_hides_llvmlite_proxy_and_restores_it() -> None:
    """vLLM's CPU start-up scans every module's attributes with vars(value).get(...); llvmlite's ffi.lib proxy
    (imported with numba, which rcdiag.analysis.metrics.compute uses) makes that raise and the engine fails to start."""
    pytest.importorskip("numba")
    module = sys.modules["llvmlite.binding.ffi"]
    assert _breaks_vllm_scan(module) and not _breaks_vllm_scan(sys.modules["json"])
    with _scan_safe_modules():
        assert "llvmlite.binding.ffi" not in sys.modules
        assert not any(_breaks_vllm_scan(m) for m in list(sys.modules.values()))
    assert sys.modules["llvmlite.binding.ffi"] is module


def test_model_hash_tracks_config_and_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    first = model_files_hash(tmp_path)
    assert model_files_hash(tmp_path) == first and first.startswith("sha256:")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert model_files_hash(tmp_path) != first
    assert check_model_dir(tmp_path) == tmp_path.resolve()
    with pytest.raises(ConfigError, match="not a local model directory"):
        check_model_dir(tmp_path / "missing")


@pytest.mark.parametrize("kwargs, message", [
    ({"dtype": "fp8"}, "--engine-dtype 'fp8'"), ({"gpu_memory_utilization": 0}, "must be in \\(0, 1\\]"),
    ({"max_model_len": 1}, "--max-model-len must be ≥ 2")])
def test_engine_settings_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EngineSettings(model="m", **kwargs)
